"""What the orchestrator's parts share: settings, the experiments and workers it knows, who is
alive, its counters, one lock, and the connections (set when it starts)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palomino.errors import PalominoError
from palomino.services.common.service_settings import ServiceSettings
from palomino.services.orchestrator.experiment import Experiment, Worker
from palomino.services.orchestrator.tracking import Boards
from palomino.wire.control_messages import MAX_CELLS_PER_WORKER

log = logging.getLogger(__name__)
# A worker's key expires a TTL after its last heartbeat: that is its death. Declared once the key
# has been gone this long: workers killed at once (a process's slots, a node's processes) lose
# their keys within a heartbeat period (1 s) of each other, or two where a loaded process beats
# late (the harness's 1,024 workers on 2 cores: over 2 s), and are then replaced as one.
GATHER = 2.0


def new_counters() -> dict[str, int]:
    return {
        "control_messages": 0,
        "metrics_records": 0,
        "failures_handled": 0,
        "untrusted_messages": 0,
        "stale_owners_stopped": 0,  # workers told to stop writing for cells handed over (fencing.py)
        "scores_twice": 0,
    }


@dataclass
class Shared:
    settings: ServiceSettings
    runs: Path
    experiments: dict[str, Experiment] = field(default_factory=dict)
    workers: dict[str, Worker] = field(default_factory=dict)
    alive: set[str] = field(default_factory=set)  # workers whose heartbeat Redis holds
    counters: dict[str, int] = field(default_factory=new_counters)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # decisions about layouts, one at a time
    # Since when Redis has answered: until a TTL later a missing key may only mean that a
    # heartbeat could not land yet (the orchestrator's start, Redis back from an outage).
    liveness_since: float = field(default_factory=time.monotonic)
    # The connections: a ControlChannel, a ScoreQueue, a RedisLiveness (or what a test gives).
    control: Any = None
    scoring: Any = None
    liveness: Any = None
    boards: Boards = field(init=False)  # TensorBoard events, when settings.tensorboard names a folder

    def __post_init__(self) -> None:
        self.boards = Boards(self.settings.tensorboard)

    async def event(self, experiment: Experiment, kind: str, body: dict[str, Any]) -> None:
        try:
            await self.control.event(experiment.id, kind, body)
        except PalominoError as error:
            log.warning("event %s not published: %s", kind, error)

    def working_on(self, experiment: Experiment) -> list[str]:
        """Workers still training a cell of `experiment` (not done, not moved on)."""
        return [
            w
            for c, w in experiment.cells.items()
            if c not in experiment.done and w in self.workers and self.workers[w].experiment == experiment.id
        ]

    def is_missing(self, worker_id: str, ttl: float) -> bool:
        """No heartbeat for a TTL: its key has expired (or the orchestrator does not know it)."""
        worker = self.workers.get(worker_id)
        if worker is None:
            return True
        # Redis answering for less than a TTL: the heartbeat may not have landed yet.
        return worker_id not in self.alive and time.monotonic() - self.liveness_since >= ttl

    def is_dead(self, worker_id: str, ttl: float) -> bool:
        """Missing for GATHER seconds: dead (its key expired a TTL after its last heartbeat)."""
        worker = self.workers.get(worker_id)
        return self.is_missing(worker_id, ttl) and (worker is None or time.monotonic() - worker.last_seen >= GATHER)

    def spares(self, ttl: float) -> list[str]:
        """Idle, live workers, in a stable order: a multi-cell worker's slots one after another."""
        return [slot for block in self.spare_blocks(ttl) for slot in block]

    def spare_blocks(self, ttl: float) -> list[list[str]]:
        """Idle, live workers by the process they are slots of: the most free slots first (a dead
        block goes whole to one process where it can), then by name; slots in their order."""
        blocks: dict[str, list[Worker]] = {}
        for w in self.workers.values():
            if w.experiment is None and w.idle and w.id in self.alive and not self.is_dead(w.id, ttl):
                blocks.setdefault(w.block or w.id, []).append(w)
        ordered = sorted(blocks.items(), key=lambda item: (-len(item[1]), item[0]))
        return [[w.id for w in sorted(slots, key=slot_order)] for _, slots in ordered]


SLOT_DIGITS = len(str(MAX_CELLS_PER_WORKER))


def slot_order(worker: Worker) -> tuple[int, str]:
    """`w/2` before `w/10`: slots by their number, plain workers by name. A name from the wire is
    only read as a slot number when it is ASCII digits, at most as many as MAX_CELLS_PER_WORKER has
    (int() refuses "²" and numbers of thousands of digits)."""
    head, _, tail = worker.id.rpartition("/")
    numbered = worker.block and tail.isascii() and tail.isdigit() and len(tail) <= SLOT_DIGITS
    return (int(tail), head) if numbered else (-1, worker.id)
