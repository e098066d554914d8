"""Metrics records, written and shown in groups (group commit).

Records arrive a cell-iteration each: 1,024 cells at one iteration in 5 s are 200 a second, each
an append to metrics.jsonl and an event for the dashboards. Here whatever arrives while one group
is being written (in a thread, off the event loop) goes into the next, and a group leaves as one
file write and one event. A record's message is acknowledged only once its group is on disk, so a
killed orchestrator loses none; under load a group is as large as the control queue's prefetch.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from palomino.grid import cell_name
from palomino.runs.directory import finite_json
from palomino.services.orchestrator.experiment import Experiment
from palomino.services.orchestrator.shared import Shared

# One event carries records up to about this many bytes (the dashboards take events of ≤ 1 MiB).
EVENT_BYTES = 256 * 1024


@dataclass
class _Group:
    records: list[dict[str, Any]] = field(default_factory=list)
    written: bool = False


def chunks(records: list[dict[str, Any]], lengths: list[int], limit: int = EVENT_BYTES) -> list[list[dict[str, Any]]]:
    """`records` (of JSON `lengths`) in runs of at most about `limit` bytes (one alone may be more)."""
    out: list[list[dict[str, Any]]] = [[]]
    size = 0
    for record, length in zip(records, lengths, strict=True):
        if out[-1] and size + length > limit:
            out.append([])
            size = 0
        out[-1].append(record)
        size += length
    return out if out[0] else []


class RecordWriter:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._open: dict[str, _Group] = {}  # experiment → the group records join now

    async def take(self, experiment: Experiment, record: dict[str, Any]) -> bool:
        """Append `record` to the experiment's metrics.jsonl and show it; returns once it is on disk.
        False: that cell's iteration is recorded already (redelivered after a broker reconnect)."""
        key = (cell_name(record.get("cell", [])), int(record.get("iteration", -1)))
        if key in experiment.recorded:
            return False
        experiment.recorded.add(key)
        group = self._open.setdefault(experiment.id, _Group())
        group.records.append(record)
        self.shared.boards.metrics(experiment, record)
        self.shared.counters["metrics_records"] += 1
        async with experiment.metrics_lock:  # one writer at a time, and not during a rewrite
            if group.written:  # a writer before us took it
                return True
            if self._open.get(experiment.id) is group:
                del self._open[experiment.id]
            lines = await asyncio.to_thread(experiment.run.append_metrics_many, group.records) if group.records else []
            group.written = True
        for part in chunks([finite_json(r) for r in group.records], [len(line) for line in lines]):
            await self.shared.event(experiment, "metrics", {"records": part})
        return True

    async def forget(self, experiment: Experiment, resumed: dict[str, int]) -> asyncio.Task[None]:
        """Cells that redo iterations from `resumed` (cell name → iteration) record them again: their
        records from there on go — at once from those counted as recorded and from those taken but
        not written yet, then from metrics.jsonl in one rewrite (off the event loop) that runs on in
        the task returned. Records taken meanwhile are written after it (it holds the writers' lock
        from before this returns), so the Assigns need not wait for the rewrite."""

        def keep(cell: str, iteration: int) -> bool:
            return cell not in resumed or iteration < resumed[cell]

        lock = experiment.metrics_lock
        await lock.acquire()  # after the group being written, if any: the rewrite sees it
        try:
            if group := self._open.get(experiment.id):
                group.records[:] = [r for r in group.records if keep(cell_name(r["cell"]), r["iteration"])]
            experiment.recorded = {key for key in experiment.recorded if keep(*key)}
        except BaseException:
            lock.release()
            raise

        async def rewrite() -> None:
            try:
                await asyncio.to_thread(
                    experiment.run.keep_metrics, lambda r: keep(cell_name(r["cell"]), r["iteration"])
                )
            finally:
                lock.release()

        return asyncio.create_task(rewrite())
