"""Data regions (training.data_regions): k-means clusters of the data, one per cell."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import tiny

from palomino.coevolution import Cell
from palomino.config import parse_config
from palomino.data import load_dataset
from palomino.data.regions import kmeans, region_labels
from palomino.errors import DatasetError
from palomino.grid import Coord, Topology


def test_kmeans_finds_well_separated_blobs() -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[-5.0, -5.0], [-5.0, 5.0], [5.0, -5.0], [5.0, 5.0]])
    points = torch.cat([c + 0.1 * torch.randn(50, 2, generator=g) for c in centres])
    found = kmeans(points, 4, seed=3)
    # Every true centre has a centroid within 0.1 of it: none was split or merged.
    assert torch.cdist(centres, found.float()).min(1).values.max() < 0.1


def test_region_labels_are_seeded_and_cover_the_ring_mode_by_mode() -> None:
    dataset = load_dataset(parse_config(tiny()).data, 0)  # 8 Gaussians on a ring
    labels = region_labels(dataset, 8, seed=1)
    again = dataset.rows(torch.arange(len(dataset)))  # the same samples, another instance: computed anew
    assert not again.derived and torch.equal(labels, region_labels(again, 8, seed=1))
    assert region_labels(dataset, 8, seed=1) is labels  # asked again (another cell): computed once
    assert not torch.equal(labels, region_labels(dataset, 8, seed=2))  # the seed is part of what is kept
    # 8 regions of 8 separated modes: each region is exactly one mode.
    pairs = {(int(r), int(m)) for r, m in zip(labels, dataset.labels)}
    assert len(pairs) == 8 and len({r for r, _ in pairs}) == 8


def test_the_cells_of_a_grid_partition_the_data_and_a_single_cell_keeps_it_all() -> None:
    cfg = parse_config(tiny(grid={"rows": 2, "cols": 2}, training={"data_regions": True}))
    dataset = load_dataset(cfg.data, 0)
    topology = Topology(2, 2)
    cells = [Cell(c, topology, cfg, dataset, experiment="t") for c in topology.cells()]
    assert sum(len(c.data) for c in cells) == len(dataset)
    together = torch.cat([c.data.samples for c in cells])
    assert len(torch.unique(together, dim=0)) == len(torch.unique(dataset.samples, dim=0))  # disjoint
    # Each cell's region is a part of the ring: its points lie near few modes.
    for cell in cells:
        near = torch.cdist(cell.data.samples, dataset.modes.float()).argmin(1)
        assert len(torch.unique(near)) <= 4
    alone = Cell(Coord(0, 0), Topology(1, 1), cfg, dataset, experiment="t")
    assert len(alone.data) == len(dataset)


def test_a_relocated_cell_trains_on_its_new_region() -> None:
    cfg = parse_config(tiny(grid={"rows": 2, "cols": 2}, training={"data_regions": True}))
    dataset = load_dataset(cfg.data, 0)
    cell = Cell(Coord(0, 0), Topology(2, 2), cfg, dataset, experiment="t")
    there = Cell(Coord(0, 1), Topology(1, 2, epoch=1), cfg, dataset, experiment="t")
    cell.relocate(Coord(0, 1), Topology(1, 2, epoch=1))
    assert torch.equal(cell.data.samples, there.data.samples)
    cell.iterate({})  # and trains on it


def test_an_empty_region_is_a_clear_error() -> None:
    cfg = parse_config(tiny(grid={"rows": 2, "cols": 2}, training={"data_regions": True}))
    dataset = load_dataset(cfg.data, 0)
    three = dataclasses.replace(dataset, samples=dataset.samples[:3], labels=dataset.labels[:3])
    with pytest.raises(DatasetError, match="data_regions"):
        Cell(Coord(1, 1), Topology(2, 2), cfg, three, experiment="t")
