"""A tile's life through the ports: the cell loop (loop.py) for many cells in lockstep.

Every iteration each cell of the tile gathers its neighbours' snapshots of the previous
iteration (synchronous, whatever `training.synchronous` says: the tile's cells are never
apart), the tile iterates them all at once, then each cell publishes, reports and
checkpoints as it would alone. A record's `seconds.train` is the tile's whole iteration
(shared by its `tile` cells).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from palomino.coevolution.tile import Tile
from palomino.runs.loop import LoopSettings, due, gather_neighbours, heartbeat, unless_set
from palomino.transport import Liveness, Recorder, SnapshotBus


async def run_tile(
    tile: Tile,
    bus: SnapshotBus,
    liveness: Liveness,
    recorder: Recorder,
    settings: LoopSettings,
    stop: asyncio.Event,
    compute: Callable[..., Awaitable] | None = None,
) -> None:
    """Iterate every cell until `settings.iterations` or `stop`; always ends with checkpoints."""
    compute = compute or asyncio.to_thread
    cells = tile.cells
    for cell in cells:
        await bus.bind(cell.topology.neighbours(cell.coord), cell.topology.epoch)
        await bus.publish(cell.snapshot())
    await heartbeat(liveness, settings)
    last = settings.iterations
    while tile.iteration < last and not stop.is_set():
        started = time.perf_counter()
        gathering = asyncio.gather(*(gather_neighbours(cell, bus, True, settings.neighbour_timeout) for cell in cells))
        neighbours = await unless_set(gathering, stop)
        if neighbours is None:
            break
        waited = time.perf_counter()
        reports = await compute(tile.iterate, {cell.coord: found for cell, found in zip(cells, neighbours)})
        trained = time.perf_counter()
        for cell in cells:
            await bus.publish(await compute(cell.snapshot))
        await heartbeat(liveness, settings)
        published = time.perf_counter()
        seconds = {"wait": waited - started, "train": trained - waited, "communicate": published - trained}
        for report in reports:
            await recorder.metrics({**report.to_json(), "seconds": seconds, "tile": len(cells)})
        done = tile.iteration
        for cell in cells:
            if due(settings.sample_every, done, last):
                await recorder.samples(cell.coord, done, await compute(cell.samples, settings.sample_count))
            if due(settings.checkpoint_every, done, last):
                await recorder.checkpoint(cell.coord, done, *cell.state())
    if stop.is_set() and tile.iteration < last:
        for cell in cells:
            await recorder.checkpoint(cell.coord, cell.iteration, *cell.state())
