"""Sampling through the grid's discriminators (palomino.coevolution.rejection) and where it is kept."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from palomino.coevolution.rejection import MAX_ROUNDS, CriticFilter
from palomino.config import NetworkConfig


class Near(nn.Module):
    """A critic whose logit is minus the distance to `centre`: real data is near it."""

    def __init__(self, centre: float) -> None:
        super().__init__()
        self.centre = nn.Parameter(torch.tensor([centre, 0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -(x - self.centre).norm(dim=1)


def test_the_threshold_rejects_the_asked_share_of_real_data() -> None:
    real = torch.randn(4000, 2) * 0.1
    rule = CriticFilter.calibrate([Near(0.0)], real, 0.05)
    assert float((rule.logits(real) < rule.threshold).float().mean()) == pytest.approx(0.05, abs=0.002)


def test_filtered_draws_keep_only_what_the_critics_believe() -> None:
    # Half the candidates are far from the data (a bridge); none of them passes.
    rng = torch.Generator().manual_seed(0)

    def generate(k: int) -> torch.Tensor:
        far = torch.rand(k, generator=rng) < 0.5
        return torch.randn(k, 2, generator=rng) * 0.1 + far[:, None] * torch.tensor([3.0, 0.0])

    rule = CriticFilter.calibrate([Near(0.0)], torch.randn(2000, 2) * 0.1, 0.01)
    out = rule.draw(generate, 1000)
    assert len(out) == 1000
    assert float(out[:, 0].abs().max()) < 1.0


def test_the_critics_judge_together_by_their_mean_logit() -> None:
    critics = [Near(0.0), Near(2.0)]
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    assert CriticFilter(critics, 0.0).logits(x).tolist() == pytest.approx([-1.0, -1.0, -1.0])


def test_a_generator_its_critics_never_believe_still_answers_with_its_best_candidates() -> None:
    calls = []

    def generate(k: int) -> torch.Tensor:
        calls.append(k)
        return torch.linspace(5, 6, k)[:, None] * torch.tensor([1.0, 0.0])

    out = CriticFilter([Near(0.0)], threshold=-1.0).draw(generate, 10)
    assert len(out) == 10 and len(calls) == MAX_ROUNDS
    assert float(out[:, 0].max()) == pytest.approx(5.0, abs=1e-3)  # the nearest of the last round's


def _ring_mixture(threshold: float | None):
    from palomino.nn import build_discriminator, build_generator

    network = NetworkConfig(name="mlp", latent_dim=4, hidden=8, activation="tanh")
    torch.manual_seed(0)
    generators = [build_generator(network, (2,), "points") for _ in range(2)]
    critics = [build_discriminator(network, (2,), "points") for _ in range(2)]
    return _two_cells(network, generators, critics, ["0-0", "0-1"], threshold=threshold)


def _two_cells(network: NetworkConfig, generators: list, critics: list, critic_cells: list[str], **rule):
    """A grid result of cells 0-0 and 0-1 at equal weights, with their critics and filter `rule`."""
    from palomino.runs.mixture import Mixture

    return Mixture(
        generators,
        np.array([0.5, 0.5]),
        ["0-0", "0-1"],
        network,
        (2,),
        "points",
        {"cell": "grid"},
        critics=critics,
        critic_cells=critic_cells,
        quantile=0.05,
        **rule,
    )


def test_a_saved_result_keeps_its_critics_and_filter_and_samples_through_them(tmp_path: Path) -> None:
    from palomino.runs.mixture import Mixture

    mixture = _ring_mixture(threshold=None)
    probe = mixture.sample(4000, seed=1, data_space=False)
    threshold = float(torch.quantile(CriticFilter(mixture.critics, 0.0).logits(probe), 0.5))
    mixture.threshold = threshold
    mixture.save(tmp_path)
    loaded = Mixture.load(tmp_path)
    assert isinstance(loaded, Mixture)
    assert loaded.critic_cells == ["0-0", "0-1"] and loaded.threshold == pytest.approx(threshold)
    samples = loaded.sample(500, seed=2, data_space=False)
    assert len(samples) == 500
    assert bool((CriticFilter(loaded.critics, 0.0).logits(samples) >= threshold).all())
    assert torch.equal(samples, mixture.sample(500, seed=2, data_space=False))  # same seed, same samples


def test_critics_without_a_threshold_do_not_filter(tmp_path: Path) -> None:
    from palomino.runs.mixture import Mixture

    mixture = _ring_mixture(threshold=None)
    mixture.save(tmp_path)
    plain = Mixture(mixture.generators, mixture.weights, mixture.components, mixture.network, (2,), "points", {})
    assert torch.equal(Mixture.load(tmp_path).sample(100, seed=3), plain.sample(100, seed=3))


def test_the_distributed_grid_gathers_every_cells_own_discriminator() -> None:
    from safetensors.numpy import load, save

    from palomino.runs.result import CellResult, grid_components

    def result(cell: str, value: float) -> CellResult:
        payload = save(
            {
                "component.0.w": np.full(2, value, dtype=np.float32),
                "component.1.w": np.full(2, -1, dtype=np.float32),
                "critic.0.v": np.full(3, value + 0.5, dtype=np.float32),
            }
        )
        return CellResult(cell, 0.1, [cell, "9-9"], [0.5, 0.5], payload, {"network": {}, "critics": [cell]})

    payload, description = grid_components([result("0-1", 2.0), result("0-0", 1.0)], "x")
    tensors = load(payload)
    assert description["critics"] == ["0-0", "0-1"]
    assert tensors["critic.0.v"].tolist() == [1.5] * 3 and tensors["critic.1.v"].tolist() == [2.5] * 3


def test_a_scorer_filter_without_critics_or_with_a_bad_threshold_is_refused(tmp_path: Path) -> None:
    from palomino.runs.directory import RunDirectory
    from palomino.runs.result import write_ensemble

    run = RunDirectory(tmp_path)
    summary = {"weights": [1.0], "held_out_score": 0.1, "score_name": "mmd2", "filter": {"threshold": 0.5}}
    with pytest.raises(ValueError, match="critics"):
        write_ensemble(run, b"", {"components": ["0-0"]}, summary, b"")
    with pytest.raises(ValueError, match="is malformed"):
        write_ensemble(
            run, b"", {"components": ["0-0"], "critics": ["0-0"]}, {**summary, "filter": {"threshold": "inf"}}, b""
        )


@pytest.mark.parametrize("quantile", [-0.1, 0.6])
def test_the_critic_quantile_is_bounded(quantile: float) -> None:
    from pydantic import ValidationError

    from palomino.config import ExperimentConfig

    with pytest.raises(ValidationError, match="critic_quantile"):
        ExperimentConfig.model_validate(
            {"name": "x", "data": {"name": "gaussian_ring"}, "training": {"ensemble": {"critic_quantile": quantile}}}
        )


class Around(nn.Module):
    """A generator whose samples spread widely around `centre` (z is ignored but for its batch size)."""

    def __init__(self, centre: float) -> None:
        super().__init__()
        self.centre = nn.Parameter(torch.tensor([centre, 0.0]))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.centre + z[:, :2]


def _two_specialists(thresholds: list[float] | None, threshold: float | None = None):
    network = NetworkConfig(name="mlp", latent_dim=2, hidden=8)
    # The critics are stored in another order than the components: they are matched by name.
    generators, critics = [Around(0.0), Around(3.0)], [Near(3.0), Near(0.0)]
    return _two_cells(network, generators, critics, ["0-1", "0-0"], threshold=threshold, thresholds=thresholds)


def test_rule_own_passes_each_component_through_its_own_critic_alone(tmp_path: Path) -> None:
    from palomino.runs.mixture import Mixture

    samples = _two_specialists(thresholds=[-0.5, -0.5]).sample(1000, seed=0, data_space=False)
    near = torch.cdist(samples, torch.tensor([[0.0, 0.0], [3.0, 0.0]])).min(1)
    assert float(near.values.max()) <= 0.5  # each one within its own critic's reach
    assert torch.bincount(near.indices).tolist() == [500, 500]  # and every component keeps its share
    # Judged together, the specialists' critics believe neither mode: (0 − 3) / 2 < −0.5 at both.
    together = _two_specialists(thresholds=None, threshold=-0.5).sample(1000, seed=0, data_space=False)
    assert float(torch.cdist(together, torch.tensor([[0.0, 0.0], [3.0, 0.0]])).min(1).values.max()) > 0.5

    mixture = _ring_mixture(threshold=None)
    mixture.thresholds = [-0.5, -0.25]
    mixture.save(tmp_path)
    loaded = Mixture.load(tmp_path)
    assert isinstance(loaded, Mixture) and loaded.thresholds == [-0.5, -0.25]
    assert json.loads((tmp_path / "mixture.json").read_text())["filter"]["rule"] == "own"
    assert torch.equal(loaded.sample(300, seed=4), mixture.sample(300, seed=4))


def test_a_saved_own_rule_that_does_not_fit_its_components_is_refused(tmp_path: Path) -> None:
    from palomino.errors import PalominoError
    from palomino.runs.mixture import Mixture

    mixture = _ring_mixture(threshold=None)
    mixture.thresholds = [-0.5, -0.5]
    mixture.save(tmp_path)
    description = json.loads((tmp_path / "mixture.json").read_text())
    description["filter"]["thresholds"] = [-0.5]
    (tmp_path / "mixture.json").write_text(json.dumps(description))
    with pytest.raises(PalominoError, match="does not fit the mixture's components and critics"):
        Mixture.load(tmp_path)


def test_a_scorer_rule_is_checked_against_the_components() -> None:
    from palomino.runs.filter_rule import FilterRule

    cells = ["0-0", "0-1"]
    rule = {"rule": "own", "thresholds": [1, -0.5], "quantile": 0.05}
    assert FilterRule.checked(rule, cells, cells).encode() == {
        "rule": "own",
        "thresholds": [1.0, -0.5],
        "quantile": 0.05,
    }
    for bad in ([1.0, float("nan")], [1.0, "2"], [True, 1.0], "1,2"):
        with pytest.raises(ValueError, match="is malformed"):
            FilterRule.checked({**rule, "thresholds": bad}, cells, cells)
    with pytest.raises(ValueError, match="does not fit"):
        FilterRule.checked({**rule, "thresholds": [1.0]}, cells, cells)
    with pytest.raises(ValueError, match="does not fit"):
        FilterRule.checked(rule, cells, ["0-0"])  # 0-1 has no critic of its own
    mean = {"threshold": -0.5, "quantile": 0.05}
    assert FilterRule.checked(mean, cells, ["0-0"]).encode() == mean  # one threshold for the critics together
    for bad in ({"threshold": True}, {"threshold": float("inf")}, {"threshold": 1.0, "thresholds": [1.0, 1.0]}, {}):
        with pytest.raises(ValueError, match="is malformed"):
            FilterRule.checked(bad, cells, cells)
    with pytest.raises(ValueError, match="does not fit"):
        FilterRule.checked(mean, cells, [])  # no critics to filter with


def test_the_grid_ensemble_calibrates_each_cells_own_critic_on_its_own_region() -> None:
    from conftest import tiny

    from palomino.coevolution.cell_data import cell_dataset
    from palomino.config import parse_config
    from palomino.data import load_dataset
    from palomino.grid import Coord, Topology
    from palomino.runs.grid_ensemble import grid_ensemble

    config = parse_config(
        tiny(
            grid={"rows": 2, "cols": 2},
            training={"data_regions": True, "ensemble": {"critic_quantile": 0.1, "critic": "own", "es_steps": 5}},
        )
    )
    dataset = load_dataset(config.data, 0)
    cells = [Coord(r, c) for r in range(2) for c in range(2)]
    regions = [cell_dataset(dataset, config, coord, Topology(2, 2), None).samples for coord in cells]
    # Each cell's critic finds real what is near its region's mean, and each generator is a copy of
    # its region's data shifted a little.
    critics = [Near(0.0) for _ in cells]
    for critic, region in zip(critics, regions):
        critic.centre.data = region.mean(0)
    grid = grid_ensemble([Around(0.0) for _ in cells], [str(c) for c in cells], dataset, config, critics=critics)
    assert grid.rule == "own" and grid.filters is not None
    for critic, region, judge in zip(critics, regions, grid.filters):
        assert list(judge.critics) == [critic]
        own_share = float((CriticFilter([critic], 0.0).logits(region) < judge.threshold).float().mean())
        assert own_share == pytest.approx(0.1, abs=0.03)  # its own region's 10 % quantile, not all the data's
    rule = grid.summary()["filter"]
    assert rule["rule"] == "own" and len(rule["thresholds"]) == 4
