"""One cell's life through the ports: wait for neighbours, iterate, record, publish.

The embedded trainer runs one of these per cell on one event loop; the cell service
runs exactly one with the RabbitMQ/Redis adapters. The loop cannot tell which.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from palomino.coevolution import Cell
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


async def run_cell(
    cell: Cell,
    bus: SnapshotBus,
    liveness: Liveness,
    recorder: Recorder,
    settings: LoopSettings,
    stop: asyncio.Event,
    compute: Callable[..., Awaitable] | None = None,
    before_iteration: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Iterate until `settings.iterations` or `stop`; always ends with a checkpoint.

    `before_iteration` lets a service apply a new layout (relocate, rebind) between iterations.
    """
    compute = compute or asyncio.to_thread
    await bus.bind(cell.topology.neighbours(cell.coord), cell.topology.epoch)
    began = time.perf_counter()
    await bus.publish(cell.snapshot())
    await heartbeat(liveness, settings)
    communicated = time.perf_counter() - began
    last = settings.iterations
    silent: set[Coord] = set()
    while cell.iteration < last and not stop.is_set():
        if before_iteration is not None:
            await before_iteration()
            if stop.is_set():
                break  # let go (a new layout without it) or stopped meanwhile
        started = time.perf_counter()
        neighbours = await unless_set(
            gather_neighbours(cell, bus, settings.synchronous, settings.neighbour_timeout, silent), stop
        )
        if neighbours is None:
            break  # stopped while waiting (a neighbour may have stopped first)
        waited = time.perf_counter()
        report = await compute(cell.iterate, neighbours)
        trained = time.perf_counter()
        record = report.to_json()
        record["seconds"] = {"wait": waited - started, "train": trained - waited, "communicate": communicated}
        # The record before the snapshot: every snapshot published is of a recorded iteration, so a
        # spare resumes from the newest one whenever its cell is killed (killed between the two, the
        # record goes and the iteration is trained again).
        await recorder.metrics(record)
        await bus.publish(await compute(cell.snapshot))
        await heartbeat(liveness, settings)
        communicated = time.perf_counter() - trained
        done = cell.iteration
        if due(settings.sample_every, done, last):
            await recorder.samples(cell.coord, done, await compute(cell.samples, settings.sample_count))
        if due(settings.checkpoint_every, done, last):
            await recorder.checkpoint(cell.coord, done, *cell.state())
    if stop.is_set() and cell.iteration < last:
        await recorder.checkpoint(cell.coord, cell.iteration, *cell.state())
