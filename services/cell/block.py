"""One assignment of a cell worker: its cell built (restored from what came with the Assign),
trained over the broker until the experiment ends, it is stopped or released, and its result sent.

The engine and loop are `palomino train`'s, with the RabbitMQ SnapshotBus, Redis Liveness and a
Recorder that sends everything to the orchestrator (no shared filesystem).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from palomino.config import parse_config
from palomino.config.data_roots import check_data_dir, data_roots
from palomino.errors import PalominoError
from palomino.grid import Coord, Topology
from palomino.grid.partition import ClassGrid, class_grid_at
from palomino.services.common.service_settings import ServiceSettings
from palomino.transport.control_channel import ControlChannel
from palomino.transport.rabbitmq import RabbitSnapshotBus
from palomino.transport.score_queue import ScoreQueue
from palomino.wire import Snapshot
from palomino.wire.control_messages import Assign, Checkpoint, Done, Metrics, Resize, Samples
from palomino.wire.score_messages import ScoreJob

log = logging.getLogger(__name__)


class RestoreError(PalominoError):
    """The checkpoint or snapshot an Assign carried does not load into this cell."""


class ControlRecorder:
    """Recorder port → control messages to the orchestrator."""

    def __init__(
        self, control: ControlChannel, orchestrator: str, experiment: str, worker: str, kind: str, modes: Any
    ) -> None:
        self.control, self.orchestrator, self.experiment, self.worker = control, orchestrator, experiment, worker
        self.kind, self.modes = kind, modes

    async def metrics(self, record: dict[str, Any]) -> None:
        await self.control.send(
            self.orchestrator, Metrics(experiment=self.experiment, worker=self.worker, record=record)
        )

    async def samples(self, coord: Coord, iteration: int, samples: Any) -> None:
        from palomino.runs.images import progress_png

        png = progress_png(samples, self.kind, self.modes)
        await self.control.send(
            self.orchestrator,
            Samples(experiment=self.experiment, worker=self.worker, coord=tuple(coord), iteration=iteration),
            png,
        )

    async def real_samples(self, coord: Coord, dataset: Any, seed: int) -> None:
        from palomino.runs.images import real_png

        png = await asyncio.to_thread(real_png, dataset, seed)
        await self.control.send(
            self.orchestrator,
            Samples(experiment=self.experiment, worker=self.worker, coord=tuple(coord), iteration=0, real=True),
            png,
        )

    async def checkpoint(self, coord: Coord, iteration: int, tensors: dict, meta: dict[str, Any]) -> None:
        from palomino.runs.checkpoints import encode_tensors

        payload = await asyncio.to_thread(encode_tensors, tensors)
        message = Checkpoint(
            experiment=self.experiment, worker=self.worker, coord=tuple(coord), iteration=iteration, meta=meta
        )
        await self.control.send(self.orchestrator, message, payload)


def fits(cell: Any):
    """A validator for the SnapshotBus: a neighbour's tensors must match this cell's networks."""
    expected = {role: getattr(cell, role + "s").best.network.state_dict() for role in ("generator", "discriminator")}

    def check(snapshot: Snapshot) -> None:
        for role, state in expected.items():
            for name, tensor in state.items():
                got = snapshot.tensors.get(f"{role}.net.{name}")
                if got is None or got.shape != tensor.shape:
                    raise ValueError(
                        f"{role}.net.{name}: {None if got is None else tuple(got.shape)}, expected {tuple(tensor.shape)}"
                    )

    return check


def layout_of(config: Any, coord: Coord, rows: int, cols: int, epoch: int) -> Topology | ClassGrid:
    """The grid an assignment puts a cell on: the rows×cols torus, or (partitioned runs) its class's
    rows×cols sub-grid, found from the cell id's band of rows."""
    kind = config.grid.neighbourhood
    if config.partitioned:
        return class_grid_at(coord, config.data.labels, config.grid.per_class_shape, (rows, cols), kind, epoch)
    return Topology(rows, cols, kind, epoch)


@dataclass
class Links:
    """What an assignment uses of its worker."""

    settings: ServiceSettings
    worker: str
    device: str
    control: ControlChannel
    orchestrator: str  # the orchestrator's address
    liveness: Any
    stop: asyncio.Event  # set: finish the iteration, checkpoint, leave
    take_resize: Callable[[], Resize | None]  # the newest Resize not yet applied, if any
    set_ttl: Callable[[float], None]


@dataclass
class Training:
    """An assignment's cell and what it trains with (made by `Assignment.run`)."""

    config: Any
    dataset: Any
    cell: Any
    bus: RabbitSnapshotBus
    scoring: ScoreQueue | None
    scored: set[int] = field(default_factory=set)


class Assignment:
    def __init__(self, links: Links, assign: Assign, payload: bytes) -> None:
        self.links, self.assign, self.payload = links, assign, payload
        self.experiment = assign.experiment

    async def run(self) -> None:
        from palomino.runs.loop import LoopSettings, run_cell

        try:
            config, dataset, cell = await asyncio.to_thread(self._build)
        except (ValueError, KeyError) as error:  # a config or dataset that does not fit
            raise PalominoError(f"cannot set up cell {tuple(self.assign.coord)}: {error}") from None
        self.links.set_ttl(config.distributed.heartbeat_ttl)
        a = self.assign
        log.info("training cell %s of %s (%d×%d, epoch %d) from iteration %d", cell.coord, self.experiment, a.rows, a.cols, a.epoch, cell.iteration)  # fmt: skip
        async with AsyncExitStack() as stack:  # the bus and the score queue close whatever happens
            links = self.links
            bus = RabbitSnapshotBus(
                links.settings.broker_url, self.experiment, max_bytes=config.distributed.max_snapshot_bytes,
                validator=fits(cell), key=links.settings.signer,
            )  # fmt: skip
            await bus.connect()
            stack.push_async_callback(bus.close)
            training = Training(config, dataset, cell, bus, await self._scoring(stack, config), {cell.iteration})
            recorder = ControlRecorder(links.control, links.orchestrator, self.experiment, links.worker, dataset.kind, dataset.modes)  # fmt: skip
            if cell.coord == Coord(0, 0) and cell.iteration == 0:  # one picture of the real data per run
                await recorder.real_samples(cell.coord, dataset, config.seed)
            settings = LoopSettings.of(config, links.worker, distributed=True)

            async def between_iterations() -> None:
                await self._apply_layout(training)
                await self._periodic_score(training)

            await run_cell(
                cell, bus, links.liveness, recorder, settings, links.stop, before_iteration=between_iterations
            )
            if cell.iteration >= config.training.iterations:
                await self._report_done(training)

    def _build(self) -> tuple[Any, Any, Any]:
        """(config, dataset, cell); in a thread: building networks and reading data must not starve the heartbeats."""
        from palomino.coevolution import Cell
        from palomino.data import load_dataset
        from palomino.runs.checkpoints import decode_tensors
        from palomino.wire import decode_snapshot

        assign, payload = self.assign, self.payload
        config = parse_config(assign.config)
        check_data_dir(config.data.dir, data_roots(self.links.settings.data_roots))  # this worker's own roots too
        dataset = load_dataset(config.data, config.seed)
        topology = layout_of(config, Coord(*assign.coord), assign.rows, assign.cols, assign.epoch)
        cell = Cell(
            Coord(*assign.coord), topology, config, dataset, experiment=self.experiment, device=self.links.device
        )
        source = (assign.restore_meta or {}).get("from", "checkpoint")
        try:
            if payload and source == "snapshot":
                # Newer than any checkpoint: the individuals as the dead cell last published them.
                cell.adopt(decode_snapshot(payload, max_bytes=config.distributed.max_snapshot_bytes))
            elif payload:
                cell.restore(decode_tensors(payload, "assigned checkpoint"), assign.restore_meta or {})
        except (ValueError, KeyError, RuntimeError, PalominoError) as error:  # does not load, or does not fit
            raise RestoreError(f"cell {tuple(assign.coord)}: the assigned {source} does not load: {error}") from None
        return config, dataset, cell

    async def _scoring(self, stack: AsyncExitStack, config: Any) -> ScoreQueue | None:
        """The score queue for periodic scoring (scoring.every), or None."""
        if not config.scoring.every:
            return None
        settings = self.links.settings
        queue = ScoreQueue(settings.broker_url, settings.namespace, key=settings.signer)
        try:
            await queue.connect()
        except PalominoError as error:
            log.warning("periodic scoring is off for this cell: %s", error)
            return None
        stack.push_async_callback(queue.close)
        return queue

    async def _apply_layout(self, training: Training) -> None:
        """A Resize that arrived meanwhile: move the cell, or leave for the spares."""
        resize = self.links.take_resize()
        if resize is None or resize.experiment != self.experiment:
            return
        if resize.coord is None:
            log.info("released to the spares by epoch %d", resize.epoch)
            self.links.stop.set()
            return
        cell, coord = training.cell, Coord(*resize.coord)
        cell.relocate(coord, layout_of(training.config, coord, resize.rows, resize.cols, resize.epoch))
        await training.bus.bind(cell.topology.neighbours(cell.coord), resize.epoch)
        log.info("moved to %s of %d×%d (epoch %d)", cell.coord, resize.rows, resize.cols, resize.epoch)

    async def _periodic_score(self, training: Training) -> None:
        from palomino.runs.finish import neighbourhood_mixture

        cell, config, every = training.cell, training.config, training.config.scoring.every
        if training.scoring is None or cell.iteration % every or cell.iteration in training.scored:
            return
        if cell.iteration >= config.training.iterations:
            return  # the final mixtures are the orchestrator's to queue
        training.scored.add(cell.iteration)
        snapshots = {c: s for c in cell.topology.neighbours(cell.coord) if (s := await training.bus.newest(c))}
        mixture = await asyncio.to_thread(
            neighbourhood_mixture, cell, snapshots, training.dataset, self.experiment, False
        )
        payload, description = await asyncio.to_thread(mixture.encode)
        job = ScoreJob.of(self.experiment, config, str(cell.coord), description, iteration=cell.iteration)
        try:
            await training.scoring.enqueue(job, payload)
        except PalominoError as error:
            log.warning("periodic score job %s not queued: %s", job.job, error)

    async def _report_done(self, training: Training) -> None:
        """The cell's final neighbourhood mixture, scored, to the orchestrator."""
        from palomino.runs.finish import cell_result

        cell = training.cell
        snapshots = {c: s for c in cell.topology.neighbours(cell.coord) if (s := await training.bus.newest(c))}
        result = await asyncio.to_thread(cell_result, cell, snapshots, training.dataset, self.experiment)
        done = Done(
            experiment=self.experiment, worker=self.links.worker, coord=tuple(cell.coord), iteration=cell.iteration,
            score=result.score, components=result.components, weights=result.weights, mixture=result.description,
            samples_png=base64.b64encode(result.samples_png).decode(),
        )  # fmt: skip
        await self.links.control.send(self.links.orchestrator, done, result.payload)
        log.info("cell %s of %s done (score %.4g)", cell.coord, self.experiment, result.score)
