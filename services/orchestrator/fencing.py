"""Stale owners (issue 50): a worker frozen (SIGSTOP, a long GC) or cut off from Redis past its
heartbeat TTL has its cells handed to spares; when it comes back it still believes it owns them and
goes on writing. Its records, checkpoints and Done are refused already (trust.untrusted, by the
worker each coordinate is held by); this tells it, once, to stop training that experiment, so that
its slots come free as spares instead of training for nothing to the end."""

from __future__ import annotations

import logging
from typing import Any

from palomino.errors import PalominoError
from palomino.services.orchestrator.experiment import Experiment
from palomino.services.orchestrator.shared import Shared
from palomino.transport.control_channel import cell_address
from palomino.wire.control_messages import Stop

log = logging.getLogger(__name__)


class Fencing:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._stopped: dict[str, set[str]] = {}  # experiment → workers told to stop (once each)

    def process_of(self, slot: str) -> str:
        worker = self.shared.workers.get(slot)
        return worker.block if worker is not None and worker.block else slot

    async def refused(self, experiment: Experiment, message: Any) -> None:
        """A message of `experiment` was refused as untrusted: if its sender's process holds no cell
        of the experiment any more, it is a stale owner, told to stop."""
        worker = getattr(message, "worker", "")
        if experiment.finished:
            self._stopped.pop(experiment.id, None)
            return
        told = self._stopped.setdefault(experiment.id, set())
        if not worker or worker in told:
            return
        process = self.process_of(worker)
        if any(self.process_of(holder) == process for holder in experiment.cells.values()):
            return  # a slot of it still trains here: a late or out-of-range message, not a zombie
        told.add(worker)
        self.shared.counters["stale_owners_stopped"] += 1
        log.warning("experiment %s: %s wrote for cells handed over while it was unreachable; telling it to stop",
                    experiment.id, worker)  # fmt: skip
        stop = Stop(experiment=experiment.id, reason="its cells were handed to spares while it was unreachable")
        try:
            await self.shared.control.send(cell_address(worker), stop)
        except PalominoError as error:  # its next refused message asks again
            told.discard(worker)
            log.warning("stop for stale owner %s not sent: %s", worker, error)
