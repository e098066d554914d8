"""A block: the cells one worker trains for one experiment — one cell, or with `palomino cell
--cells K` up to K, built from the Assigns that reached its slots together.

Each cell is held by one slot (a worker name the orchestrator knows: its Assign, heartbeat,
metrics, checkpoints and result go by that name), built and restored from what its Assign
carried, and trained with the library's loop (palomino/engine/hosting.py: one tile where it pays,
else a loop per cell). Neighbours inside the block are read from memory; the rest come over
RabbitMQ (palomino/transport/block_bus.py). A Resize moves a slot's cell or lets it go.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from palomino.config import parse_config
from palomino.config.data_roots import check_data_dir, data_roots
from palomino.errors import PalominoError
from palomino.grid import Coord, Topology
from palomino.grid.partition import ClassGrid, class_grid_at
from palomino.services.cell.control_recorder import ControlRecorder
from palomino.services.cell.outbox import Outbox
from palomino.services.common.service_settings import ServiceSettings
from palomino.transport.block_bus import BlockBus
from palomino.transport.rabbitmq import RabbitSnapshotBus
from palomino.transport.score_queue import ScoreQueue
from palomino.wire import Snapshot
from palomino.wire.control_messages import Assign, Done, Resize
from palomino.wire.score_messages import ScoreJob

log = logging.getLogger(__name__)


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
    """What a block uses of its worker."""

    settings: ServiceSettings
    device: str
    outbox: Outbox  # every message to the orchestrator
    liveness: Any
    take_resize: Callable[[str], Resize | None]  # a slot's newest Resize not yet applied, if any
    set_ttl: Callable[[str, float], None]  # a slot's heartbeat time-to-live


class SlotsLiveness:
    """The loops' heartbeats, for every slot of the block (their cells iterate together): one
    command for all of them, at most one per BEAT_GAP — K untiled cells each beating for all K
    slots every iteration would be K² entries written."""

    BEAT_GAP = 0.5  # seconds; the worker's own beat runs every second whatever the loops do

    def __init__(self, liveness: Any, slots: Callable[[], list[str]]) -> None:
        self.liveness, self.slots = liveness, slots
        self._last: tuple[float, float] | None = None  # (when, ttl) of the last beat sent

    async def heartbeat(self, worker: str, ttl: float) -> None:
        now = time.monotonic()
        if self._last is not None and self._last[1] == ttl and now - self._last[0] < self.BEAT_GAP:
            return
        self._last = (now, ttl)
        await self.liveness.heartbeat_many(self.slots(), ttl)

    async def alive(self) -> set[str]:
        return await self.liveness.alive()


@dataclass
class Built:
    """What `Block.build` made: the experiment, its data, each slot's restored cell, and the slots
    whose checkpoint or snapshot did not load (slot → why)."""

    config: Any
    dataset: Any
    cells: dict[str, Any]
    unrestored: dict[str, str] = field(default_factory=dict)


class Block:
    def __init__(self, links: Links, experiment: str, assigns: dict[str, tuple[Assign, bytes]]) -> None:
        self.links, self.experiment, self.assigns = links, experiment, assigns
        self.stop = asyncio.Event()  # set: finish the iteration, checkpoint, leave
        self.cells: dict[str, Any] = {}  # slot → its cell, while it trains
        self.holds = set(assigns)  # the slots this block keeps busy (a released one is free again)
        self._scored: set[tuple[Coord, int]] = set()
        self._released: dict[str, Any] = {}
        self._slot_at: dict[Coord, str] = {}  # coordinate → slot, kept by `_index` as cells move

    @property
    def slots(self) -> list[str]:
        return list(self.assigns)

    def slot_of(self, coord: Coord) -> str:
        """The slot holding the cell at `coord` (a released one for its last checkpoint, which the
        orchestrator then drops: the slot no longer holds that coordinate)."""
        try:
            return self._slot_at[Coord(*coord)]
        except KeyError:
            raise KeyError(f"no cell of this block is at {tuple(coord)}") from None

    def _index(self) -> None:
        """Where each slot's cell is now; a training cell wins a coordinate over a released one."""
        self._slot_at = {cell.coord: slot for cells in (self._released, self.cells) for slot, cell in cells.items()}

    async def run(self) -> None:
        try:
            built = await asyncio.to_thread(self.build)
        except (ValueError, KeyError) as error:  # a config or dataset that does not fit
            raise PalominoError(f"cannot set up cells {self._coords()}: {error}") from None
        for slot, why in built.unrestored.items():  # the orchestrator falls back to an older state for these
            self.holds.discard(slot)
            log.error("training %s: %s", self.experiment, why)
            await self.report_failure(slot, why, restore_failed=True)
        self.cells = built.cells
        self._index()
        self._scored = {(cell.coord, cell.iteration) for cell in self.cells.values()}  # scored before it left
        if not self.cells:
            return
        config, dataset = built.config, built.dataset
        for slot in self.cells:
            self.links.set_ttl(slot, config.distributed.heartbeat_ttl)
        log.info("training %s of %s from iterations %s", self._coords(), self.experiment, sorted({c.iteration for c in self.cells.values()}))  # fmt: skip
        async with AsyncExitStack() as stack:  # the bus and the score queue close whatever happens
            links = self.links
            first = next(iter(self.cells.values()))
            remote = RabbitSnapshotBus(
                links.settings.broker_url, self.experiment, max_bytes=config.distributed.max_snapshot_bytes,
                validator=fits(first), key=links.settings.signer, connection=links.outbox.connection,
            )  # fmt: skip
            await remote.connect()
            stack.push_async_callback(remote.close)
            bus = BlockBus(remote)
            await self._bind(bus)
            scoring = await self._scoring(stack, config)
            recorder = ControlRecorder(links.outbox, self.experiment, self.slot_of, dataset.kind, dataset.modes)
            origin = next((c for c in self.cells.values() if c.coord == Coord(0, 0) and c.iteration == 0), None)
            if origin is not None:  # one picture of the real data per run
                await recorder.real_samples(origin.coord, dataset, config.seed)
            await self._train(config, dataset, bus, scoring, recorder)
            for slot, cell in list(self.cells.items()):
                if cell.iteration >= config.training.iterations:
                    await self._report_done(slot, cell, bus, dataset)

    async def _train(self, config: Any, dataset: Any, bus: BlockBus, scoring: Any, recorder: Any) -> None:
        from palomino.coevolution.tile import use_tile
        from palomino.engine.hosting import host_cells
        from palomino.engine.loop import LoopSettings

        cells = list(self.cells.values())
        tiled = len(cells) > 1 and use_tile(config, cells)
        settings = LoopSettings.of(config, self.slots[0], distributed=True)
        liveness = SlotsLiveness(self.links.liveness, lambda: list(self.cells))

        async def between_iterations(cells: list[Any]) -> list[Any]:
            kept = await self._apply_layout(cells, config, bus)
            for cell in kept:
                await self._periodic_score(cell, config, bus, scoring, dataset)
            return kept

        await host_cells(
            cells, bus, liveness, recorder, settings, self.stop, tiled=tiled, before_iteration=between_iterations
        )

    def build(self) -> Built:
        """In a thread: building networks and reading data must not starve the heartbeats."""
        from palomino.coevolution import Cell
        from palomino.data import load_dataset
        from palomino.runs.checkpoints import decode_tensors
        from palomino.wire import decode_snapshot

        first = next(iter(self.assigns.values()))[0]
        config = parse_config(first.config)  # one object: a tile's cells share their experiment
        for slot, (assign, _) in self.assigns.items():
            if assign.config != first.config:
                raise ValueError(f"slot {slot} was assigned another configuration of experiment {self.experiment}")
        check_data_dir(config.data.dir, data_roots(self.links.settings.data_roots))  # this worker's own roots too
        dataset = load_dataset(config.data, config.seed)
        built = Built(config, dataset, {})
        for slot, (assign, payload) in self.assigns.items():
            topology = layout_of(config, Coord(*assign.coord), assign.rows, assign.cols, assign.epoch)
            cell = Cell(Coord(*assign.coord), topology, config, dataset, experiment=self.experiment, device=self.links.device)  # fmt: skip
            source = (assign.restore_meta or {}).get("from", "checkpoint")
            try:
                if payload and source == "snapshot":
                    # Newer than any checkpoint: the individuals as the dead cell last published them.
                    cell.adopt(decode_snapshot(payload, max_bytes=config.distributed.max_snapshot_bytes))
                elif payload:
                    cell.restore(decode_tensors(payload, "assigned checkpoint"), assign.restore_meta or {})
            except (ValueError, KeyError, RuntimeError, PalominoError) as error:  # does not load, or does not fit
                built.unrestored[slot] = f"cell {tuple(assign.coord)}: the assigned {source} does not load: {error}"
                continue
            built.cells[slot] = cell
        return built

    async def _bind(self, bus: BlockBus) -> None:
        cells = list(self.cells.values())
        epoch = max(cell.topology.epoch for cell in cells)
        await bus.layout({cell.coord: cell.topology.neighbours(cell.coord) for cell in cells}, epoch)

    async def _scoring(self, stack: AsyncExitStack, config: Any) -> ScoreQueue | None:
        """The score queue for periodic scoring (scoring.every), or None."""
        if not config.scoring.every:
            return None
        settings = self.links.settings
        queue = ScoreQueue(
            settings.broker_url, settings.namespace, key=settings.signer, connection=self.links.outbox.connection
        )
        try:
            await queue.connect()
        except PalominoError as error:
            log.warning("periodic scoring is off for this block: %s", error)
            return None
        stack.push_async_callback(queue.close)
        return queue

    async def _apply_layout(self, cells: list[Any], config: Any, bus: BlockBus) -> list[Any]:
        """Resizes that arrived meanwhile for these cells' slots: move them, or let them go."""
        kept, changed = [], False
        slot_of_cell = {id(cell): slot for slot, cell in self.cells.items()}
        for cell in cells:
            slot = slot_of_cell[id(cell)]
            resize = self.links.take_resize(slot)
            if resize is None or resize.experiment != self.experiment:
                kept.append(cell)
                continue
            changed = True
            if resize.coord is None:
                log.info("slot %s released to the spares by epoch %d", slot, resize.epoch)
                self._released[slot] = released = self.cells.pop(slot)
                released.let_go()
                self.holds.discard(slot)
                continue
            coord = Coord(*resize.coord)
            cell.relocate(coord, layout_of(config, coord, resize.rows, resize.cols, resize.epoch))
            kept.append(cell)
            log.info("slot %s moved to %s of %d×%d (epoch %d)", slot, cell.coord, resize.rows, resize.cols, resize.epoch)  # fmt: skip
        if changed:
            self._index()
        if changed and self.cells:
            await self._bind(bus)
            for cell in kept:  # under its new coordinate at once: its new neighbours wait for it
                await bus.publish(await asyncio.to_thread(cell.snapshot))
        return kept

    async def _periodic_score(self, cell: Any, config: Any, bus: BlockBus, scoring: Any, dataset: Any) -> None:
        from palomino.runs.finish import neighbourhood_mixture

        every = config.scoring.every
        if scoring is None or cell.iteration % every or (cell.coord, cell.iteration) in self._scored:
            return
        if cell.iteration >= config.training.iterations:
            return  # the final mixtures are the orchestrator's to queue
        self._scored.add((cell.coord, cell.iteration))
        snapshots = await _neighbour_snapshots(cell, bus)
        mixture = await asyncio.to_thread(neighbourhood_mixture, cell, snapshots, dataset, self.experiment, False)
        payload, description = await asyncio.to_thread(mixture.encode)
        job = ScoreJob.of(self.experiment, config, str(cell.coord), description, iteration=cell.iteration)
        try:
            await scoring.enqueue(job, payload)
        except PalominoError as error:
            log.warning("periodic score job %s not queued: %s", job.job, error)

    async def _report_done(self, slot: str, cell: Any, bus: BlockBus, dataset: Any) -> None:
        """The cell's final neighbourhood mixture, scored, to the orchestrator."""
        from palomino.runs.finish import cell_result

        snapshots = await _neighbour_snapshots(cell, bus)
        result = await asyncio.to_thread(cell_result, cell, snapshots, dataset, self.experiment)
        done = Done(
            experiment=self.experiment, worker=slot, coord=tuple(cell.coord), iteration=cell.iteration,
            score=result.score, components=result.components, weights=result.weights, mixture=result.description,
            samples_png=base64.b64encode(result.samples_png).decode(),
        )  # fmt: skip
        await self.links.outbox.done(done, result.payload)
        log.info("cell %s of %s done (score %.4g)", cell.coord, self.experiment, result.score)

    async def report_failure(
        self, slot: str, reason: str, restore_failed: bool = False, transient: bool = False
    ) -> None:
        await self.links.outbox.failed(
            experiment=self.experiment,
            worker=slot,
            reason=f"{slot}: {reason}",
            restore_failed=restore_failed,
            transient=transient,
        )

    def _coords(self) -> list[tuple[int, int]]:
        return [tuple(assign.coord) for assign, _ in self.assigns.values()]


async def _neighbour_snapshots(cell: Any, bus: BlockBus) -> dict[Coord, Snapshot]:
    """The newest snapshot held of each of `cell`'s neighbours (those heard from)."""
    return {c: s for c in cell.topology.neighbours(cell.coord) if (s := await bus.newest(c))}
