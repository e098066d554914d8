"""A group of cells' life through the ports — a tile, or one cell alone: wait for neighbours,
iterate, record, publish, checkpoint.

The embedded trainer and a cell worker run one loop a tile, or a loop a cell untiled (hosting.py),
with in-memory or RabbitMQ/Redis adapters. The loop cannot tell which.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from palomino.coevolution import Cell
from palomino.coevolution.iteration import IterationReport
from palomino.coevolution.tile import Tile
from palomino.config import ExperimentConfig
from palomino.errors import PalominoError
from palomino.grid import Coord
from palomino.transport import Liveness, Recorder, SnapshotBus
from palomino.wire import Snapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopSettings:
    iterations: int
    synchronous: bool
    worker: str
    sample_every: int = 0
    checkpoint_every: int = 0
    sample_count: int = 64
    heartbeat_ttl: float = 5.0
    neighbour_timeout: float | None = None  # None: wait for neighbours for ever (embedded)

    @classmethod
    def of(cls, config: ExperimentConfig, worker: str, *, distributed: bool) -> LoopSettings:
        """The experiment's settings for one cell's loop; a distributed one's heartbeats and timeouts."""
        t, d = config.training, config.distributed
        return cls(
            iterations=t.iterations,
            synchronous=t.synchronous,
            worker=worker,
            sample_every=t.sample_every,
            checkpoint_every=t.checkpoint_every,
            **({"heartbeat_ttl": d.heartbeat_ttl, "neighbour_timeout": d.neighbour_timeout} if distributed else {}),
        )


def due(every: int, done: int, last: int) -> bool:
    return done == last or (every > 0 and done % every == 0)


async def gather_neighbours(
    cell: Cell, bus: SnapshotBus, synchronous: bool, timeout: float | None, silent: set[Coord] | None = None
) -> dict[Coord, Snapshot]:
    """Synchronous: each neighbour's iteration i−1 exactly. Asynchronous: the newest held.

    A neighbour that stayed silent for `timeout` is left out; asynchronous runs then stop
    waiting for it (it has finished or died) until it is heard from again. `timeout` bounds the
    wait for all neighbours together: four silent ones cost one timeout, not four.
    """
    wanted = cell.iteration - 1
    silent = set() if silent is None else silent
    found: dict[Coord, Snapshot] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    for coord in cell.topology.neighbours(cell.coord):
        snapshot = None if synchronous else await bus.newest(coord)
        if snapshot is None and not (coord in silent and not synchronous):
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                snapshot = await bus.wait(coord, wanted if synchronous else -1, left)
            except TimeoutError:
                # The timeout bounds the whole gather: a later neighbour may have had less of it.
                log.warning(
                    "cell %s: no snapshot from neighbour %s within the %s s neighbour timeout; going on without it",
                    cell.coord,
                    coord,
                    timeout,
                )
                silent.add(coord)
        if snapshot is not None:
            silent.discard(coord)
            found[coord] = snapshot
            if synchronous and snapshot.iteration != wanted:  # its exact one went unheard: say so
                log.warning(
                    "cell %s: neighbour %s's snapshot of iteration %d is not held (missed or pushed out); training against its "
                    "iteration %d, so this synchronous run will not repeat bit for bit",
                    cell.coord, coord, wanted, snapshot.iteration,
                )  # fmt: skip
    return found


async def heartbeat(liveness: Liveness, settings: LoopSettings) -> None:
    try:
        await liveness.heartbeat(settings.worker, settings.heartbeat_ttl)
    except PalominoError as error:  # Redis away: keep training; the next heartbeat may get through
        log.warning("heartbeat failed: %s", error)


async def unless_set(work: Awaitable, stop: asyncio.Event):
    """`work`'s result, or None if `stop` is set first (`work` is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for pending in (task, stopper):
        if pending not in done:
            pending.cancel()
    return task.result() if task in done else None


class Alone:
    """One cell as a group of its own: its loop, `run_group`'s, is the tile's, its iteration its own."""

    def __init__(self, cell: Cell) -> None:
        self.cells = [cell]

    @property
    def iteration(self) -> int:
        return self.cells[0].iteration

    def iterate(self, neighbours: Mapping[Coord, Mapping[Coord, Snapshot]]) -> list[IterationReport]:
        return [self.cells[0].iterate(neighbours[self.cells[0].coord])]


# Between iterations: the cells to go on with (a service relocates cells or lets some go here).
Adjust = Callable[[list[Cell]], Awaitable[list[Cell]]]


async def run_group(
    group: Alone | Tile,
    bus: SnapshotBus,
    liveness: Liveness,
    recorder: Recorder,
    settings: LoopSettings,
    stop: asyncio.Event,
    compute: Callable[..., Awaitable] | None = None,
    before_iteration: Adjust | None = None,
) -> None:
    """Iterate every cell of `group` until `settings.iterations` or `stop`; always ends with
    checkpoints. A tile's cells go in lockstep: each gathers its neighbours, the tile iterates
    them all at once, then each reports, publishes and checkpoints as it would alone (a tiled
    record's `seconds.train` is the tile's whole iteration, shared by its `tile` cells).

    `before_iteration` lets a service apply a new layout (relocate cells, let some go) between
    iterations: the cells it returns go on; none, and the loop ends without a checkpoint (a
    cell it must stop with one, it stops through `stop`).
    """
    compute = compute or asyncio.to_thread
    began = time.perf_counter()
    for cell in group.cells:
        await bus.bind(cell.topology.neighbours(cell.coord), cell.topology.epoch)
        await bus.publish(cell.snapshot())
    await heartbeat(liveness, settings)
    communicated = time.perf_counter() - began
    last = settings.iterations
    silent: dict[Coord, set[Coord]] = {}
    while group.iteration < last and not stop.is_set():
        if before_iteration is not None:
            kept = await before_iteration(list(group.cells))
            if not kept:
                return  # every cell was let go
            if stop.is_set():
                break  # stopped meanwhile: checkpoints below
            if kept != group.cells:
                group = Tile(kept, group.workers) if isinstance(group, Tile) else Alone(kept[0])
        cells = group.cells
        started = time.perf_counter()
        gathering = asyncio.gather(
            *(
                gather_neighbours(
                    cell, bus, settings.synchronous, settings.neighbour_timeout, silent.setdefault(cell.coord, set())
                )
                for cell in cells
            )
        )
        neighbours = await unless_set(gathering, stop)
        if neighbours is None:
            break  # stopped while waiting (a neighbour may have stopped first)
        waited = time.perf_counter()
        reports = await compute(group.iterate, {cell.coord: found for cell, found in zip(cells, neighbours)})
        trained = time.perf_counter()
        seconds = {"wait": waited - started, "train": trained - waited, "communicate": communicated}
        tiled = {"tile": len(cells)} if isinstance(group, Tile) else {}
        # The records before the snapshots: every snapshot published is of a recorded iteration, so
        # a spare resumes from the newest one whenever its cell is killed (killed between the two,
        # the record goes and the iteration is trained again).
        for report in reports:
            await recorder.metrics({**report.to_json(), "seconds": seconds, **tiled})
        for cell in cells:
            await bus.publish(await compute(cell.snapshot))
        await heartbeat(liveness, settings)
        communicated = time.perf_counter() - trained
        done = group.iteration
        for cell in cells:
            if due(settings.sample_every, done, last):
                await recorder.samples(cell.coord, done, await compute(cell.samples, settings.sample_count))
            if due(settings.checkpoint_every, done, last):
                await recorder.checkpoint(cell.coord, done, *cell.state())
    if stop.is_set() and group.iteration < last:
        for cell in group.cells:
            await recorder.checkpoint(cell.coord, cell.iteration, *cell.state())
