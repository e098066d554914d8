"""What tests/test_tiles.py and tests/test_compile.py share: the ring toy's cells, their
neighbourhoods, a tile's cases (every loss, Mustangs, populations, conditional networks), the
convolutional cases on random images, and the comparisons of two sets of cells and of their reports."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import float32_dataset, tiny

from palomino.coevolution import Cell
from palomino.config import ExperimentConfig, parse_config
from palomino.data import Dataset
from palomino.grid import Coord, Topology


def config(**changes: Any) -> ExperimentConfig:
    base = {"training": {"iterations": 4, "batches_per_iteration": 3, "fitness": {"sample_size": 16}}}
    return parse_config(tiny(**{**base, **changes}))


def ring64() -> Dataset:
    """The ring toy; make_cells moves the cells' data to the default dtype (float64 in these tests)."""
    return float32_dataset(config().data)


def make_cells(cfg: ExperimentConfig, dataset: Dataset) -> list[Cell]:
    topology = Topology(cfg.grid.rows, cfg.grid.cols, cfg.grid.neighbourhood)
    cells = [Cell(Coord(*c), topology, cfg, dataset, experiment="test") for c in topology.cells()]
    for cell in cells:
        cell.data.samples = cell.data.samples.to(torch.get_default_dtype())
    return cells


def neighbourhoods(cells: list[Cell]) -> dict[Coord, dict[Coord, Any]]:
    snapshots = {cell.coord: cell.snapshot() for cell in cells}
    return {cell.coord: {n: snapshots[n] for n in cell.topology.neighbours(cell.coord)} for cell in cells}


def assert_same_cells(left: list[Cell], right: list[Cell], tolerance: float = 1e-9) -> None:
    for a, b in zip(left, right):
        (ta, ma), (tb, mb) = a.state(), b.state()
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.allclose(ta[key].double(), tb[key].double(), rtol=tolerance, atol=tolerance), (a.coord, key)
        for key in ("iteration", "cursor", "rng", "mixture"):
            assert ma[key] == pytest.approx(mb[key], rel=tolerance) if key == "mixture" else ma[key] == mb[key], key
        for name, info in ma["individuals"].items():
            other = mb["individuals"][name]
            assert info["learning_rate"] == pytest.approx(other["learning_rate"], rel=1e-12), name
            assert (info["loss"], info["origin"]) == (other["loss"], other["origin"]), name
            assert info["fitness"] == pytest.approx(other["fitness"], rel=1e-7), name


def assert_same_reports(left: list[dict], right: list[dict]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right):
        assert (a["cell"], a["iteration"], a["losses_used"], a["steps"]) == (
            b["cell"],
            b["iteration"],
            b["losses_used"],
            b["steps"],
        )
        for role in ("generator", "discriminator"):
            assert a[role] == pytest.approx(b[role], rel=1e-7), (a["cell"], role)


# Two individuals a role, every rate mutated, the discriminator stepping every second batch
# (the perceptron case here; test_tiles' DCGAN one takes the same).
POPULATION_2_MUTATED_SKIP = {
    "population_size": 2,
    "mutation": {"probability": 1.0, "alpha": 0.5},
    "discriminator_skip_each_nth_step": 1,
}

CASES = [
    pytest.param({}, id="minimax-default"),
    pytest.param({"training": {"losses": ["nonsaturating"]}}, id="nonsaturating"),
    pytest.param({"training": {"losses": ["mse"]}}, id="mse"),
    pytest.param({"training": {"losses": ["wgan_gp"], "n_critic": 2, "batches_per_iteration": 4}}, id="wgan-gp"),
    pytest.param(
        {"training": {"losses": ["minimax", "nonsaturating", "mse", "wgan_gp"], "batches_per_iteration": 6}},
        id="mustangs-mixture",
    ),
    pytest.param({"training": POPULATION_2_MUTATED_SKIP}, id="population-2-mutated-rates-skip"),
    pytest.param(
        {
            "training": {
                "population_size": 2,
                "selection": {"enabled": False, "opponents": "per_batch"},
                "mutation": {"probability": 1.0, "alpha": 0.5, "reaches_optimizer": False},
            }
        },
        id="lipizzaner-no-selection-one-opponent-a-batch",
    ),
    pytest.param(
        {
            "training": {
                "population_size": 2,
                "selection": {"replacement": "if_fitter", "opponents": "per_batch"},
                "mutation": {"probability": 1.0, "alpha": 0.5},
                "discriminator_skip_each_nth_step": 1,
            }
        },
        id="lipizzaner-if-fitter",
    ),
    pytest.param({"network": {"conditional": True, "minibatch_std": True}}, id="conditional-minibatch-std"),
    pytest.param(
        {"training": {"data_regions": True, "decay": {"start": 0.25, "final": 0.1}}, "grid": {"rows": 3, "cols": 3}},
        id="regions-decay-3x3",
    ),
]


def images64(labelled: bool = False, shape: tuple[int, ...] = (1, 28, 28)) -> Dataset:
    """64 random images (and 3 labels), float32 by contract; make_cells moves them to float64."""
    generator = torch.Generator().manual_seed(0)
    samples = torch.rand(64, *shape, generator=generator, dtype=torch.float32) * 2 - 1
    labels = torch.arange(64) % 3 if labelled else None
    return Dataset("images", samples, labels, "image")


CONV_CASES = [
    pytest.param({"network": {"name": "dcgan"}}, id="dcgan-minimax"),
    pytest.param(
        {"network": {"name": "dcgan"}, "training": POPULATION_2_MUTATED_SKIP},
        id="dcgan-population-2-mutated-rates-skip",
    ),
    pytest.param(
        {"network": {"name": "sngan"}, "training": {"losses": ["minimax", "wgan_gp"], "batches_per_iteration": 4}},
        id="sngan-mustangs-wgan-gp",
    ),
    pytest.param({"network": {"name": "sngan", "conditional": True, "label_dim": 4}}, id="conditional-sngan"),
]


def conv_config(changes: dict[str, Any], **top: Any) -> ExperimentConfig:
    """Two cells of tiny convolutional networks (width 4, 8 latent dimensions) on images64, with `changes` merged by section."""
    merged: dict[str, Any] = {
        "grid": {"rows": 1, "cols": 2},
        "training": {"iterations": 3, "batches_per_iteration": 2, "batch_size": 8, "fitness": {"sample_size": 8}},
    }
    for section, values in changes.items():
        merged[section] = {**merged.get(section, {}), **values}
    merged["network"] = {"width": 4, "latent_dim": 8, **merged["network"]}
    return parse_config(tiny(**merged, **top))
