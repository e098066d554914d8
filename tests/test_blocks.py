"""Multi-cell workers (`palomino cell --cells K`) without the servers: where a worker's cells go on
the grid, the bus that serves a block's own cells from memory, the orchestrator's view of a
worker's slots, and the hosting loop letting cells go between iterations (tiled and not).

The end-to-end test — real RabbitMQ and Redis, a multi-cell worker killed — is in test_distributed.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import tiny

from palomino.coevolution import Cell
from palomino.config import parse_config
from palomino.data import load_dataset
from palomino.engine.hosting import host_cells
from palomino.engine.loop import LoopSettings
from palomino.grid import Coord, Topology
from palomino.grid.blocks import cut_pairs, place_blocks, runs, snake
from palomino.services.common.service_settings import ServiceSettings
from palomino.services.local import worker_sizes
from palomino.services.orchestrator.experiment import Worker
from palomino.services.orchestrator.placement import in_blocks
from palomino.services.orchestrator.shared import Shared
from palomino.transport import InMemoryLiveness, InMemorySnapshotBus
from palomino.transport.block_bus import BlockBus


def extent(block: list[Coord]) -> tuple[set[int], set[int]]:
    return {c.row for c in block}, {c.col for c in block}


# --- placement -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "cut", "row_major"), [("von_neumann", 48, 48), ("moore", 136, 144)])
def test_four_workers_of_36_cells_get_the_four_6x6_quarters_of_a_12x12_grid(
    kind: str, cut: int, row_major: int
) -> None:
    grid = Topology(12, 12, kind)
    blocks = place_blocks(grid, [36] * 4)
    assert sorted(len(b) for b in blocks) == [36] * 4
    assert all(len(rows) == 6 and len(cols) == 6 for rows, cols in map(extent, blocks))
    # On a von Neumann torus three full rows cut as few pairs as a quarter; the squarer patch wins the tie.
    assert cut_pairs(grid, blocks) == cut and cut_pairs(grid, runs(list(grid.cells()), [36] * 4)) == row_major


def test_nine_cell_workers_on_a_6x6_grid_cut_fewer_pairs_than_row_major_runs() -> None:
    grid = Topology(6, 6, "von_neumann")
    blocks = place_blocks(grid, [9] * 4)
    assert all(len(rows) == 3 and len(cols) == 3 for rows, cols in map(extent, blocks))
    assert cut_pairs(grid, blocks) == 24 < cut_pairs(grid, runs(list(grid.cells()), [9] * 4)) == 28


def test_one_cell_workers_keep_the_row_major_order() -> None:
    grid = Topology(3, 4, "moore")
    assert [b[0] for b in place_blocks(grid, [1] * 12)] == list(grid.cells())


def test_uneven_workers_each_get_a_connected_patch_and_the_grid_is_covered_once() -> None:
    grid = Topology(5, 5, "von_neumann")
    blocks = place_blocks(grid, [9, 9, 4, 8])  # 30 slots for 25 cells: the last worker gets 3
    assert [len(b) for b in blocks] == [9, 9, 4, 3]
    assert sorted(c for b in blocks for c in b) == list(grid.cells())
    for block in blocks:  # every cell of a patch touches another of it
        assert len(block) == 1 or all(any(n in block for n in grid.neighbours(c)) for c in block)


@pytest.mark.parametrize("kind", ["von_neumann", "moore"])
def test_the_bands_left_untried_would_not_have_won(kind: str) -> None:
    # place_blocks tries bands up to twice the largest block; trying all of them chooses the same.
    def every_band(topology: Topology, sizes: list[int]) -> list[list[Coord]]:
        def key(band: int) -> tuple[int, int]:
            blocks = runs(snake(topology.rows, topology.cols, band), sizes)
            return cut_pairs(topology, blocks), sum(len({c.row for c in b}) + len({c.col for c in b}) for b in blocks)

        best = min(range(1, topology.rows + 1), key=key)  # the first of equals, as place_blocks
        return [b for b in runs(snake(topology.rows, topology.cols, best), sizes) if b]

    for rows, cols in [(1, 5), (2, 2), (3, 7), (5, 5), (8, 6), (12, 12), (16, 9)]:
        topology = Topology(rows, cols, kind, 0)
        for sizes in ([k] * -(-rows * cols // k) for k in (1, 2, 3, 4, 5, 8)):
            assert place_blocks(topology, sizes) == every_band(topology, sizes), (rows, cols, sizes[0])
        uneven = [1 + (i * 7) % 5 for i in range(rows * cols)]
        assert place_blocks(topology, uneven) == every_band(topology, uneven), (rows, cols, "uneven")


def test_the_snake_walks_each_band_down_and_up() -> None:
    assert snake(2, 3, 2) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)]


def test_a_worker_of_no_cells_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one cell"):
        place_blocks(Topology(2, 2), [2, 0])


def test_workers_for_up_host_per_worker_cells_each_and_the_last_the_rest() -> None:
    assert worker_sizes(10, 4) == [4, 4, 2] and worker_sizes(8, 4) == [4, 4] and worker_sizes(3, 1) == [1, 1, 1]


# --- the orchestrator's view of slots --------------------------------------------------------------


def shared_with(workers: dict[str, str]) -> Shared:
    """An orchestrator state whose idle, live workers are `workers` (slot → the process it is in)."""
    shared = Shared(ServiceSettings(), runs=None)  # type: ignore[arg-type]
    for slot, block in workers.items():
        shared.workers[slot] = Worker(slot, block=block, last_seen=time.monotonic())
    shared.alive = set(workers)
    return shared


def test_spares_come_by_process_the_largest_first_and_slots_in_number_order() -> None:
    slots = {f"big/{i}": "big" for i in (0, 1, 2, 10)} | {"solo": "", "a/0": "a", "a/1": "a"}
    assert shared_with(slots).spare_blocks(ttl=5.0) == [["big/0", "big/1", "big/2", "big/10"], ["a/0", "a/1"], ["solo"]]


def test_slot_names_from_the_wire_that_are_no_slot_numbers_are_ordered_by_name() -> None:
    # Register.worker is a hostile string: int() of "²" or of 5,000 digits raises, which would stall placement.
    slots = {"h/" + "9" * 5000: "h", "h/²": "h", "h/1": "h"}
    assert shared_with(slots).spare_blocks(ttl=5.0) == [["h/" + "9" * 5000, "h/²", "h/1"]]


def test_a_2x4_grid_on_two_workers_of_four_gives_each_a_2x2_patch() -> None:
    shared = shared_with({f"w{w}/{i}": f"w{w}" for w in (1, 2) for i in range(4)})
    cells = in_blocks(Topology(2, 4), shared.spare_blocks(ttl=5.0))
    assert sorted(cells) == list(Topology(2, 4).cells())
    for worker in ("w1", "w2"):
        rows, cols = extent([c for c, slot in cells.items() if slot.startswith(worker + "/")])
        assert rows == {0, 1} and len(cols) == 2


# --- the block's bus -------------------------------------------------------------------------------


class Remote(InMemorySnapshotBus):
    """The broker's side of a BlockBus (the real one is RabbitMQ, in test_distributed.py): records
    what the block binds and publishes, and holds only what `deliver` brings (as the broker
    delivers only the cells bound)."""

    def __init__(self) -> None:
        super().__init__()
        self.bound: list[Coord] = []
        self.published: list[Coord] = []

    async def bind(self, neighbours: Any, epoch: int) -> None:
        self.bound = list(neighbours)

    async def publish(self, snapshot: Any) -> None:
        self.published.append(Coord(*snapshot.header.cell))

    async def deliver(self, snapshot: Any) -> None:
        await super().publish(snapshot)


def test_a_block_reads_its_own_cells_from_memory_and_binds_only_the_others() -> None:
    cfg = parse_config(tiny(grid={"rows": 1, "cols": 4}))
    dataset = load_dataset(cfg.data, 0)
    grid = Topology(1, 4, cfg.grid.neighbourhood)
    mine, theirs = [Cell(Coord(0, c), grid, cfg, dataset, experiment="t") for c in (0, 1)], Cell(Coord(0, 2), grid, cfg, dataset, experiment="t")  # fmt: skip

    async def go() -> None:
        remote = Remote()
        bus = BlockBus(remote)
        await bus.layout({c.coord: grid.neighbours(c.coord) for c in mine}, epoch=0)
        assert sorted(remote.bound) == [Coord(0, 2), Coord(0, 3)]  # 0-0's and 0-1's neighbours outside
        for cell in mine:
            await bus.publish(cell.snapshot())
        await remote.deliver(theirs.snapshot())  # another worker's cell, through the broker
        assert remote.published == [Coord(0, 0), Coord(0, 1)]  # every own snapshot still goes out
        assert tuple((await bus.wait(Coord(0, 1), -1, timeout=1)).header.cell) == (0, 1)  # from memory
        assert tuple((await bus.newest(Coord(0, 2))).header.cell) == (0, 2)
        await bus.layout({Coord(0, 0): grid.neighbours(Coord(0, 0))}, epoch=1)  # 0-1 left the block
        assert sorted(remote.bound) == [Coord(0, 1), Coord(0, 3)] and await bus.newest(Coord(0, 1)) is None

    asyncio.run(go())


# --- letting cells go between iterations -----------------------------------------------------------


class Recorded:
    def __init__(self) -> None:
        self.checkpoints: list[tuple[Coord, int]] = []
        self.records: list[dict] = []

    async def metrics(self, record: dict) -> None:
        self.records.append(record)

    async def samples(self, coord: Coord, iteration: int, samples: Any) -> None:
        return None

    async def checkpoint(self, coord: Coord, iteration: int, tensors: dict, meta: dict) -> None:
        self.checkpoints.append((Coord(*coord), iteration))


@pytest.mark.parametrize("tiles", ["on", "off"])
def test_a_cell_let_go_between_iterations_stops_and_the_others_finish(tiles: str) -> None:
    cfg = parse_config(tiny(grid={"rows": 2, "cols": 2}, training={"iterations": 4}, tiles=tiles))
    dataset = load_dataset(cfg.data, 0)
    grid = Topology(2, 2, cfg.grid.neighbourhood)
    cells = [Cell(Coord(*c), grid, cfg, dataset, experiment="t") for c in grid.cells()]
    leaving = cells[1]

    async def adjust(these: list[Cell]) -> list[Cell]:
        return [c for c in these if not (c is leaving and c.iteration >= 2)]

    async def go() -> Recorded:
        recorder = Recorded()
        settings = LoopSettings.of(cfg, "t", distributed=False)
        # The others' neighbour `leaving` goes quiet: asynchronous runs go on with its newest snapshot.
        settings = LoopSettings(**{**settings.__dict__, "synchronous": False})
        await host_cells(
            cells, InMemorySnapshotBus(), InMemoryLiveness(), recorder, settings, asyncio.Event(),
            tiled=tiles == "on", before_iteration=adjust,
        )  # fmt: skip
        return recorder

    recorder = asyncio.run(go())
    assert leaving.iteration == 2 and all(c.iteration == 4 for c in cells if c is not leaving)
    assert {r["iteration"] for r in recorder.records if tuple(r["cell"]) == leaving.coord} == {0, 1}
    if tiles == "on":  # one tile of four, then of three
        assert {(r["iteration"], r["tile"]) for r in recorder.records} == {(0, 4), (1, 4), (2, 3), (3, 3)}
    else:  # its own loop ends with a checkpoint of where it stopped
        assert all("tile" not in r for r in recorder.records) and (leaving.coord, 2) in recorder.checkpoints
