"""A cell worker's Recorder: everything a cell records goes to the orchestrator as control messages
(no shared filesystem), each sent in the name of the slot that holds the cell."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from palomino.grid import Coord
from palomino.transport.control_channel import ControlChannel, checkpoints_address
from palomino.wire.control_messages import Checkpoint, Metrics, Samples

# Seconds a checkpoint may wait for room in its queue (a whole grid's last checkpoints arrive at once).
CHECKPOINT_PUBLISH_TIMEOUT = 600.0


class ControlRecorder:
    """Recorder port → control messages; `slot_of(coord)` names the slot (worker) that holds a cell."""

    def __init__(
        self,
        control: ControlChannel,
        orchestrator: str,
        experiment: str,
        slot_of: Callable[[Coord], str],
        kind: str,
        modes: Any,
    ) -> None:
        self.control, self.orchestrator, self.experiment, self.slot_of = control, orchestrator, experiment, slot_of
        self.kind, self.modes = kind, modes

    async def metrics(self, record: dict[str, Any]) -> None:
        worker = self.slot_of(Coord(*record["cell"]))
        await self.control.send(self.orchestrator, Metrics(experiment=self.experiment, worker=worker, record=record))

    async def samples(self, coord: Coord, iteration: int, samples: Any) -> None:
        from palomino.runs.images import progress_png

        png = progress_png(samples, self.kind, self.modes)
        worker = self.slot_of(coord)
        message = Samples(experiment=self.experiment, worker=worker, coord=tuple(coord), iteration=iteration)
        await self.control.send(self.orchestrator, message, png)

    async def real_samples(self, coord: Coord, dataset: Any, seed: int) -> None:
        from palomino.runs.images import real_png

        png = await asyncio.to_thread(real_png, dataset, seed)
        worker = self.slot_of(coord)
        message = Samples(experiment=self.experiment, worker=worker, coord=tuple(coord), iteration=0, real=True)
        await self.control.send(self.orchestrator, message, png)

    async def checkpoint(self, coord: Coord, iteration: int, tensors: dict, meta: dict[str, Any]) -> None:
        from palomino.runs.checkpoints import encode_tensors

        payload = await asyncio.to_thread(encode_tensors, tensors)
        worker = self.slot_of(coord)
        message = Checkpoint(
            experiment=self.experiment, worker=worker, coord=tuple(coord), iteration=iteration, meta=meta
        )
        # Its own queue, which refuses rather than drops: a full one makes this wait (back-pressure).
        address = checkpoints_address(self.orchestrator)
        await self.control.send(address, message, payload, timeout=CHECKPOINT_PUBLISH_TIMEOUT)
