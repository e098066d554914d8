"""A cell worker's Recorder: everything a cell records goes to the orchestrator as control messages
through the worker's Outbox (no shared filesystem), each sent in the name of the slot that holds the cell."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from palomino.grid import Coord
from palomino.services.cell.outbox import Outbox
from palomino.wire.control_messages import Checkpoint, Metrics, Samples


class ControlRecorder:
    """Recorder port → control messages; `slot_of(coord)` names the slot (worker) that holds a cell."""

    def __init__(
        self,
        outbox: Outbox,
        experiment: str,
        slot_of: Callable[[Coord], str],
        kind: str,
        modes: Any,
    ) -> None:
        self.outbox, self.experiment, self.slot_of = outbox, experiment, slot_of
        self.kind, self.modes = kind, modes

    async def metrics(self, record: dict[str, Any]) -> None:
        worker = self.slot_of(Coord(*record["cell"]))
        await self.outbox.send(Metrics(experiment=self.experiment, worker=worker, record=record))

    async def samples(self, coord: Coord, iteration: int, samples: Any) -> None:
        from palomino.runs.images import progress_png

        png = progress_png(samples, self.kind, self.modes)
        worker = self.slot_of(coord)
        message = Samples(experiment=self.experiment, worker=worker, coord=tuple(coord), iteration=iteration)
        await self.outbox.send(message, png)

    async def real_samples(self, coord: Coord, dataset: Any, seed: int) -> None:
        from palomino.runs.images import real_png

        png = await asyncio.to_thread(real_png, dataset, seed)
        worker = self.slot_of(coord)
        message = Samples(experiment=self.experiment, worker=worker, coord=tuple(coord), iteration=0, real=True)
        await self.outbox.send(message, png)

    async def checkpoint(self, coord: Coord, iteration: int, tensors: dict, meta: dict[str, Any]) -> None:
        from palomino.runs.checkpoints import encode_tensors

        payload = await asyncio.to_thread(encode_tensors, tensors)
        worker = self.slot_of(coord)
        message = Checkpoint(
            experiment=self.experiment, worker=worker, coord=tuple(coord), iteration=iteration, meta=meta
        )
        await self.outbox.checkpoint(message, payload)
