"""The garbage collector in a long-running Palomino process (`palomino train`, the cell worker, the scorer).

Python's cyclic collector now and then walks every object it tracks. After torch, pydantic and
the rest are imported that is ~250,000 objects, none of which will ever be garbage, and a
12×12 tile's host-side iteration spent a third of its time in those walks
(benchmarks/host_overhead.py). `freeze_startup_objects` collects once and moves everything then
alive out of the collector's reach (`gc.freeze`): later objects are collected as before, and
frozen ones are still freed when their last reference goes; only a cycle among them that becomes
garbage later would stay. Called by those commands at their start (`train`, and the services'
`serve`), never by library code or tests; the orchestrator and the dashboard train nothing.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect, then leave everything alive now out of every later collection."""
    gc.collect()
    gc.freeze()
