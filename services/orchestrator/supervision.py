"""Liveness supervision: who is alive (Redis heartbeats), waiting experiments started when workers
are there, running ones checked for dead cells, ended ones evicted after their retention."""

from __future__ import annotations

import asyncio
import logging
import time

from palomino.errors import PalominoError
from palomino.services.orchestrator.placement import Placement
from palomino.services.orchestrator.recovery import Recovery
from palomino.services.orchestrator.shared import Shared

log = logging.getLogger(__name__)
TICK = 0.5
MAX_BACKOFF = 5.0  # seconds between liveness queries while Redis refuses them


class Supervisor:
    def __init__(self, shared: Shared, placement: Placement, recovery: Recovery) -> None:
        self.shared, self.placement, self.recovery = shared, placement, recovery
        self._redis_ok = True

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
            except PalominoError as error:
                log.warning("supervision: %s", error)
            except Exception:
                log.exception("supervision failed; going on")
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
