"""Liveness supervision: who is alive (Redis heartbeats), waiting experiments started when workers
are there, running ones checked for dead cells, finished ones' owed score jobs offered again,
ended ones evicted after their retention."""

from __future__ import annotations

import asyncio
import logging
import time

from palomino.errors import PalominoError
from palomino.services.orchestrator.owed_scores import OwedScores
from palomino.services.orchestrator.placement import Placement, bounded
from palomino.services.orchestrator.recovery import Recovery
from palomino.services.orchestrator.shared import Shared
from palomino.transport.control_channel import cell_address
from palomino.wire.control_messages import Hello

log = logging.getLogger(__name__)
TICK = 0.5
MAX_BACKOFF = 5.0  # seconds between liveness queries while Redis refuses them
HELLO_AGAIN = 10.0  # seconds before a live slot that has not registered is asked again


class Supervisor:
    def __init__(self, shared: Shared, placement: Placement, recovery: Recovery, owed: OwedScores) -> None:
        self.shared, self.placement, self.recovery, self.owed = shared, placement, recovery, owed
        self._redis_ok = True
        self._asked: dict[str, float] = {}  # live slots not known, when they were asked to register

    async def run(self) -> None:
        pause = TICK
        while True:
            known = True
            try:
                async with self.shared.lock:
                    known = await self.refresh_liveness()
                    for experiment in list(self.shared.experiments.values()) if known else []:  # unknown: judge nobody
                        if experiment.state == "waiting":
                            await self.placement.try_start(experiment)
                        elif experiment.state == "running":
                            await self.recovery.check_cells(experiment)
                    await self.owed.pay_due()  # score jobs the broker refused, or a restart found owed
            except PalominoError as error:
                log.warning("supervision: %s", error)
            except Exception:
                log.exception("supervision failed; going on")
            if known:
                await self.greet()
            self.evict()
            # While Redis cannot say who is alive, ask it less and less often (never a busy loop).
            pause = TICK if known else min(pause * 2, MAX_BACKOFF)
            await asyncio.sleep(pause)

    def evict(self) -> None:
        """Ended experiments past their retention leave the list (their run directories stay)."""
        cutoff = time.time() - self.shared.settings.retention_seconds
        for experiment_id, experiment in list(self.shared.experiments.items()):
            if experiment.finished and (experiment.ended_at or 0) < cutoff:
                del self.shared.experiments[experiment_id]
                log.info("experiment %s: retention over, no longer listed (its run directory stays)", experiment_id)

    async def greet(self) -> None:
        """Ask live slots this orchestrator does not know to register (Hello): after its restart,
        or a lost Register, spares are found at once, not at their next announcement (≤ 30 s)."""
        now = time.monotonic()
        unknown = {w for w in self.shared.alive if w not in self.shared.workers}
        self._asked = {w: t for w, t in self._asked.items() if w in unknown}
        due = [w for w in unknown if now - self._asked.get(w, -HELLO_AGAIN) >= HELLO_AGAIN]
        for worker in due:
            self._asked[worker] = now

        async def ask(worker: str) -> None:
            try:
                await self.shared.control.send(cell_address(worker), Hello(worker=worker))
            except PalominoError as error:
                log.warning("hello to %s not sent: %s", worker, error)

        await bounded(ask(worker) for worker in due)

    async def refresh_liveness(self) -> bool:
        """Update who is alive; False while Redis cannot say."""
        try:
            alive = await self.shared.liveness.alive()
        except PalominoError as error:
            if self._redis_ok:
                log.warning("liveness unknown (%s): nobody is declared dead until Redis answers", error)
            self._redis_ok = False
            return False
        now = time.monotonic()
        if not self._redis_ok:
            # Back from an outage: heartbeats could not land meanwhile; nobody is missing until a TTL from now.
            self.shared.liveness_since = now
            self._redis_ok = True
        for worker_id in alive:
            if worker_id in self.shared.workers:
                self.shared.workers[worker_id].last_seen = now
        self.shared.alive = alive
        return True
