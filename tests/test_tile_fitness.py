"""A tile's fitness of all its cells in one stacked evaluation gives each cell the tables it would
compute alone (palomino/coevolution/tile_fitness.py), read back once."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import tiny

from palomino.coevolution import Cell
from palomino.coevolution.tile_fitness import batchable, tile_fitness
from palomino.config import parse_config
from palomino.data import load_dataset
from palomino.grid import Coord, Topology
from palomino.nn import host


def cells_of(changes: dict[str, Any]) -> list[Cell]:
    base = {"grid": {"rows": 3, "cols": 3}, "training": {"fitness": {"sample_size": 16}}}
    for key, value in changes.items():
        base[key] = {**base.get(key, {}), **value}
    config = parse_config(tiny(**base))
    dataset = load_dataset(config.data, 0)
    topology = Topology(3, 3, config.grid.neighbourhood)
    return [Cell(Coord(*c), topology, config, dataset, experiment="test") for c in topology.cells()]


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="default"),
        pytest.param({"network": {"minibatch_std": True}}, id="minibatch-std"),
        pytest.param({"training": {"population_size": 2}}, id="population-2"),
        pytest.param({"training": {"selection": {"migration": 0.0}}}, id="migration-0"),
        pytest.param({"network": {"conditional": True, "minibatch_std": True}}, id="conditional"),
        pytest.param({"grid": {"neighbourhood": "none"}}, id="no-neighbours"),
    ],
)
def test_each_cell_gets_the_tables_it_computes_alone(changes: dict[str, Any]) -> None:
    cells = cells_of(changes)
    snapshots = {cell.coord: cell.snapshot() for cell in cells}
    prepared = [cell.prepare({n: snapshots[n] for n in cell.topology.neighbours(cell.coord)}) for cell in cells]
    jobs = [cell.fitness_job(p) for cell, p in zip(cells, prepared)]
    assert batchable(jobs)
    with host.counting() as traffic:
        results = tile_fitness(jobs)
    assert traffic.reads == 1  # the whole tile's tables in one read
    alone = changes.get("training", {}).get("selection", {}).get("migration") == 0
    for cell, p, result in zip(cells, prepared, results):
        fakes, g_table, d_table = cell.fitness(p)
        # To float rounding, not bit for bit: the kernel a CPU's BLAS takes for a stack of products
        # depends on its instruction set (bit-equal on one machine, not on an AVX-512 one). Runs stay
        # bit-identical because a CPU tile evaluates its cells one by one (Tile(batched=None)).
        torch.testing.assert_close(result.g_table, g_table, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(result.d_table, d_table, rtol=1e-5, atol=1e-6)
        if alone:  # only the cell's own rows and columns, as fitness_tables evaluates them
            assert result.g_table.shape[0] == len(cell.generators)
            assert result.d_table.shape[1] == len(cell.discriminators)
        assert all(torch.equal(a, b) for a, b in zip(result.fakes, fakes))


def test_jobs_of_different_shapes_are_not_batched() -> None:
    cells = cells_of({})
    snapshots = {cell.coord: cell.snapshot() for cell in cells}
    jobs = [
        cell.fitness_job(cell.prepare({n: snapshots[n] for n in cell.topology.neighbours(cell.coord)}))
        for cell in cells
    ]
    jobs[1].real = jobs[1].real[:-1]
    assert not batchable(jobs)
    assert not batchable([])


def test_a_tile_reads_its_own_neighbours_in_place_and_others_from_their_snapshots() -> None:
    from palomino.coevolution.tile import Tile

    cells = cells_of({})
    inside, outside = cells[:6], cells[6:]  # a tile of six cells; three neighbours elsewhere
    snapshots = {cell.coord: cell.snapshot() for cell in cells}
    tile = Tile(inside)
    tile.iterate({cell.coord: {n: snapshots[n] for n in cell.topology.neighbours(cell.coord)} for cell in inside})
    outside_coords = {cell.coord for cell in outside}
    for cell in inside:
        built = {coord for coord, _ in cell.slots._slots}
        expected = {Coord(*n) for n in cell.topology.neighbours(cell.coord)} & outside_coords
        assert built == expected, cell.coord  # a slot (a copy) only for a neighbour outside the tile


def test_a_batch_of_mixtures_scores_as_each_alone() -> None:
    from palomino.coevolution.mixture_weights import MixtureScore

    generator = torch.Generator().manual_seed(0)
    fakes = torch.randn(4, 3, 20, 2, generator=generator) + torch.arange(3.0)[None, :, None, None]
    real = torch.randn(4, 60, 2, generator=generator)
    with host.counting() as traffic:
        batch = MixtureScore.from_batch(fakes, real)
    assert traffic.reads == 1
    weights = [1 / 3, 1 / 3, 1 / 3]
    for j, score in enumerate(batch):
        alone = MixtureScore.from_samples(list(fakes[j].unbind()), real[j])
        assert torch.allclose(score.k_fake, alone.k_fake, atol=1e-6)
        assert torch.allclose(score.k_cross_mean, alone.k_cross_mean, atol=1e-6)
        assert score.bandwidths == pytest.approx(alone.bandwidths, rel=1e-6)
        assert score(weights) == pytest.approx(alone(weights), abs=1e-6)


def test_a_tile_too_large_for_one_evaluation_goes_in_chunks_and_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from palomino.coevolution import mixture_weights
    from palomino.coevolution import tile_fitness as module
    from palomino.coevolution.mixture_weights import MixtureScore

    cells = cells_of({})
    snapshots = {cell.coord: cell.snapshot() for cell in cells}
    prepared = [cell.prepare({n: snapshots[n] for n in cell.topology.neighbours(cell.coord)}) for cell in cells]
    jobs = [cell.fitness_job(p) for cell, p in zip(cells, prepared)]
    whole = module.tile_fitness(jobs)
    monkeypatch.setitem(module.ACTIVATION_BUDGET, "cpu", 1)  # one job a chunk
    with host.counting() as traffic:
        chunked = module.tile_fitness(jobs)
    assert traffic.reads == 1
    for a, b in zip(whole, chunked):  # to float rounding: BLAS may multiply a smaller stack with another kernel
        torch.testing.assert_close(a.g_table, b.g_table)
        torch.testing.assert_close(a.d_table, b.d_table)

    fakes = torch.randn(5, 3, 10, 2, generator=torch.Generator().manual_seed(1))
    real = torch.randn(5, 30, 2, generator=torch.Generator().manual_seed(2))
    at_once = MixtureScore.from_batch(fakes, real)
    monkeypatch.setitem(mixture_weights.BATCH_BUDGET, "cpu", 1)
    with host.counting() as traffic:
        in_chunks = MixtureScore.from_batch(fakes, real)
    assert traffic.reads == 1
    assert all(torch.allclose(a.k_fake, b.k_fake) for a, b in zip(at_once, in_chunks))
