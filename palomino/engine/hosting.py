"""The cells one process hosts, iterated side by side: the whole grid of an embedded run, the
block of a cell worker (`palomino cell --cells K`).

Tiled (coevolution/tile.py), the cells that are at the same iteration train as one tile in
lockstep (normally all of them; restored cells may start apart, and each group stays a tile of
its own). Untiled, each cell runs its own loop, as many iterating at once as pay.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from itertools import groupby

import torch

from palomino.coevolution import Cell
from palomino.coevolution.tile import Tile
from palomino.config import ExperimentConfig
from palomino.engine.loop import Adjust, Alone, LoopSettings, run_group
from palomino.transport import Liveness, Recorder, SnapshotBus


def parallel_cells(config: ExperimentConfig, cells: int) -> int:
    """How many cells iterate at once (a tile: in how many stacks). On the CPU, one per core with
    the cores' torch threads shared out among them (never more than the process had): a small
    network's ops are too short for torch's threads to help, while cells in threads run side by
    side (torch releases the GIL inside ops). On a GPU, one at a time."""
    if config.device != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = max(1, min(cores, cells))
    # Never more threads than the process had: OMP_NUM_THREADS=1 (one worker process per core) stays 1.
    torch.set_num_threads(max(1, min(torch.get_num_threads(), cores // workers)))
    return workers


async def host_cells(
    cells: list[Cell],
    bus: SnapshotBus,
    liveness: Liveness,
    recorder: Recorder,
    settings: LoopSettings,
    stop: asyncio.Event,
    *,
    tiled: bool,
    before_iteration: Adjust | None = None,
) -> None:
    """Every cell's loop until the last iteration or `stop`; `before_iteration` may relocate cells
    or let some go (those it does not return stop: untiled with a checkpoint of where they are, as
    a stopped cell; a tile simply goes on without them)."""
    if not cells:
        return
    threads = torch.get_num_threads()
    workers = parallel_cells(cells[0].config, len(cells))  # sets torch's threads to match
    try:
        if tiled:
            groups = [list(g) for _, g in groupby(sorted(cells, key=_at), key=_at)]
            await asyncio.gather(
                *(
                    run_group(Tile(group, workers), bus, liveness, recorder, settings, stop, None, before_iteration)
                    for group in groups
                )
            )
            return
        gate = asyncio.Semaphore(workers)

        async def compute(fn: Callable, *args: object) -> object:
            async with gate:
                return await asyncio.to_thread(fn, *args)

        async def one(cell: Cell) -> None:
            if before_iteration is None:
                await run_group(Alone(cell), bus, liveness, recorder, settings, stop, compute)
                return
            mine = asyncio.Event()  # set by `stop`, or when `before_iteration` lets this cell go
            relay = asyncio.ensure_future(stop.wait())
            relay.add_done_callback(lambda _: mine.set())

            async def adjust(cells: list[Cell]) -> list[Cell]:
                if not await before_iteration(cells):
                    mine.set()  # let go: it stops with a checkpoint of where it is
                return cells

            try:
                await run_group(Alone(cell), bus, liveness, recorder, settings, mine, compute, adjust)
            finally:
                relay.cancel()

        await asyncio.gather(*(one(cell) for cell in cells))
    finally:
        torch.set_num_threads(threads)  # the process's setting, as the caller had it


def _at(cell: Cell) -> int:
    return cell.iteration
