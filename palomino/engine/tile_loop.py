"""A tile's life through the ports: the cell loop (loop.py) for many cells in lockstep.

Every iteration each cell of the tile gathers its neighbours' snapshots of the previous
iteration (the tile's own cells are never apart, so a synchronous and an asynchronous run
differ only in how they wait for neighbours hosted elsewhere), the tile iterates them all at
once, then each cell reports, publishes and checkpoints as it would alone. A record's
`seconds.train` is the tile's whole iteration (shared by its `tile` cells).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from palomino.coevolution import Cell
from palomino.coevolution.tile import Tile
from palomino.engine.loop import LoopSettings, due, gather_neighbours, heartbeat, unless_set
from palomino.grid import Coord
from palomino.transport import Liveness, Recorder, SnapshotBus

# Between iterations: the cells to go on with (a service relocates cells or lets some go here).
Adjust = Callable[[list[Cell]], Awaitable[list[Cell]]]


async def run_tile(
    tile: Tile,
    bus: SnapshotBus,
    liveness: Liveness,
    recorder: Recorder,
    settings: LoopSettings,
    stop: asyncio.Event,
    compute: Callable[..., Awaitable] | None = None,
    before_iteration: Adjust | None = None,
) -> None:
    """Iterate every cell until `settings.iterations` or `stop`; always ends with checkpoints."""
    compute = compute or asyncio.to_thread
    began = time.perf_counter()
    for cell in tile.cells:
        await bus.bind(cell.topology.neighbours(cell.coord), cell.topology.epoch)
        await bus.publish(cell.snapshot())
    await heartbeat(liveness, settings)
    communicated = time.perf_counter() - began
    last = settings.iterations
    silent: dict[Coord, set[Coord]] = {}
    while tile.iteration < last and not stop.is_set():
        if before_iteration is not None:
            kept = await before_iteration(list(tile.cells))
            if not kept:
                return  # every cell was let go
            if kept != tile.cells:
                tile = Tile(kept, tile.workers)
        cells = tile.cells
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
            break
        waited = time.perf_counter()
        reports = await compute(tile.iterate, {cell.coord: found for cell, found in zip(cells, neighbours)})
        trained = time.perf_counter()
        seconds = {"wait": waited - started, "train": trained - waited, "communicate": communicated}
        for report in reports:  # records before snapshots, as in run_cell
            await recorder.metrics({**report.to_json(), "seconds": seconds, "tile": len(cells)})
        for cell in cells:
            await bus.publish(await compute(cell.snapshot))
        await heartbeat(liveness, settings)
        communicated = time.perf_counter() - trained
        done = tile.iteration
        for cell in cells:
            if due(settings.sample_every, done, last):
                await recorder.samples(cell.coord, done, await compute(cell.samples, settings.sample_count))
            if due(settings.checkpoint_every, done, last):
                await recorder.checkpoint(cell.coord, done, *cell.state())
    if stop.is_set() and tile.iteration < last:
        for cell in tile.cells:
            await recorder.checkpoint(cell.coord, cell.iteration, *cell.state())
