"""Diversity policies (who is selected, who is replaced), data dieting, and the whole-grid ensemble's rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny

from palomino.coevolution import Cell
from palomino.coevolution.ensemble_search import FrechetScore, frechet_distance, greedy_forward, optimise_ensemble
from palomino.coevolution.mixture_weights import MixtureScore
from palomino.coevolution.schedule import decay_factor
from palomino.coevolution.selection import generational, neighbourhood_select, replace
from palomino.config import parse_config
from palomino.config.models import DecayConfig
from palomino.data import diet, load_dataset
from palomino.errors import ConfigError
from palomino.grid import Coord, Topology
from palomino.nn import build_generator, get_loss
from palomino.nn.factory import mlp_activation

LOCAL, FOREIGN = "local", ["north", "south", "east", "west"]


# ---- selection: migration and margin ----------------------------------------------------------


def test_without_migration_only_the_cells_own_individuals_are_selected() -> None:
    rng = np.random.default_rng(0)
    # The neighbours are all fitter: with neighbours in the tournament they win almost always.
    fitness = [1.0, 0.1, 0.2, 0.3, 0.4]
    for _ in range(200):
        assert neighbourhood_select([LOCAL, *FOREIGN], fitness, 1, 1, 2, rng, migration=0.0) == [LOCAL]


def test_migration_rate_is_the_share_of_iterations_neighbours_enter() -> None:
    rng = np.random.default_rng(1)
    fitness = [1.0, 0.1, 0.1, 0.1, 0.1]  # any neighbour beats the local one
    trials = 20_000
    foreign = sum(
        neighbourhood_select([LOCAL, *FOREIGN], fitness, 1, 1, 5, rng, migration=0.25) != [LOCAL] for _ in range(trials)
    )
    assert foreign / trials == pytest.approx(0.25, abs=5 * np.sqrt(0.25 * 0.75 / trials))


def test_a_marginally_fitter_neighbour_does_not_overwrite_the_local_lineage() -> None:
    candidates, fitness = [LOCAL, "north"], [1.00, 0.95]
    rng = np.random.default_rng(2)
    assert neighbourhood_select(candidates, fitness, 1, 3, 2, rng, margin=0.0) == ["north"] * 3
    assert neighbourhood_select(candidates, fitness, 1, 3, 2, rng, margin=0.1) == [LOCAL] * 3
    # Clearly fitter still wins.
    assert neighbourhood_select(candidates, [1.0, 0.5], 1, 3, 2, rng, margin=0.1) == ["north"] * 3


def test_default_policy_is_plain_tournament_selection_with_the_same_random_stream() -> None:
    from palomino.coevolution.selection import tournament_select

    fitness = [0.5, 0.1, 0.9, 0.3, 0.7]
    a = neighbourhood_select([LOCAL, *FOREIGN], fitness, 1, 6, 2, np.random.default_rng(3))
    b = tournament_select([LOCAL, *FOREIGN], fitness, 6, 2, np.random.default_rng(3))
    assert a == b


# ---- replacement ------------------------------------------------------------------------------


def test_elitist_replacement_keeps_a_fit_local_individual() -> None:
    local, new = ["a", "b"], ["x", "y"]
    assert replace(local, [0.1, 0.9], new, [0.5, 0.7], 1, "elitist") == ["a", "x"]


def test_generational_replacement_installs_every_offspring_however_fit_the_parents() -> None:
    local, new = ["a", "b"], ["x", "y"]
    assert replace(local, [0.1, 0.2], new, [0.7, 0.5], 1, "generational") == ["y", "x"]
    assert generational(["x"], [9.0]) == ["x"]


def test_a_cell_with_generational_replacement_holds_its_trained_offspring() -> None:
    cfg = parse_config(
        tiny(training={"population_size": 2, "replacements": 1, "selection": {"replacement": "generational"}})
    )
    dataset = load_dataset(cfg.data, 0)
    cell = Cell(Coord(0, 0), Topology(1, 1), cfg, dataset, experiment="t")
    before = {id(ind) for ind in cell.generators}
    cell.iterate({})
    assert not before & {id(ind) for ind in cell.generators}  # no parent kept
    assert len(cell.generators) == 2


# ---- the step size's decay ----------------------------------------------------------------------


def test_decay_is_flat_until_its_start_then_linear_down_to_its_final_multiplier() -> None:
    decay = DecayConfig(start=0.5, final=0.1)
    assert decay_factor(decay, 0.0) == decay_factor(decay, 0.5) == 1.0
    assert decay_factor(decay, 0.75) == pytest.approx(0.55)
    assert decay_factor(decay, 1.0) == pytest.approx(0.1)
    assert decay_factor(DecayConfig(), 0.99) == 1.0  # the default never decays


def test_a_cell_steps_with_the_decayed_rate_and_its_individuals_keep_their_own() -> None:
    cfg = parse_config(
        tiny(
            training={
                "iterations": 4,
                "learning_rate": 0.001,
                "mutation": {"probability": 0.0},
                "decay": {"start": 0.5, "final": 0.1},
            }
        )
    )
    cell = Cell(Coord(0, 0), Topology(1, 1), cfg, load_dataset(cfg.data, 0), experiment="t")
    steps = []
    for _ in range(4):
        cell.iterate({})
        g = cell.generators.best
        steps.append(g.optimizer.param_groups[0]["lr"])
        assert g.learning_rate == pytest.approx(0.001)  # inherited and mutated undecayed
    # iteration i steps at progress i/4: flat through 0.5, then 1 − 0.9·(0.75 − 0.5)/0.5
    assert steps == pytest.approx([0.001, 0.001, 0.001, 0.00055])


# ---- data dieting -----------------------------------------------------------------------------


def test_data_diet_gives_each_cell_its_own_share() -> None:
    cfg = parse_config(tiny(grid={"rows": 2, "cols": 2}, training={"data_diet": 0.25}))
    dataset = load_dataset(cfg.data, 0)
    topology = Topology(2, 2)
    cells = [Cell(c, topology, cfg, dataset, experiment="t") for c in topology.cells()]
    assert all(len(c.data) == round(len(dataset) * 0.25) for c in cells)
    assert not torch.equal(cells[0].data.samples, cells[1].data.samples)  # subsets differ between cells
    again = Cell(Coord(0, 0), topology, cfg, dataset, experiment="t")
    assert torch.equal(again.data.samples, cells[0].data.samples)  # and are seeded


def test_diet_keeps_labels_with_their_samples() -> None:
    dataset = load_dataset(parse_config(tiny()).data, 0)
    part = diet(dataset, 0.1, seed=5)
    assert len(part) == round(len(dataset) * 0.1)
    centres = dataset.modes[part.labels]
    assert torch.all((part.samples - centres).norm(dim=1) < 10 * dataset.mode_std)


# ---- networks and losses ----------------------------------------------------------------------


def test_activation_auto_is_tanh_for_points_and_leaky_relu_for_images() -> None:
    network = parse_config(tiny()).network
    assert mlp_activation(network, "points") == "tanh"
    assert mlp_activation(network, "image") == "leaky_relu"
    assert mlp_activation(network.model_copy(update={"activation": "relu"}), "points") == "relu"
    layers = build_generator(network, (2,), "points").net
    assert isinstance(layers[1], torch.nn.Tanh)


@pytest.mark.parametrize("old, new", [("bce", "nonsaturating"), ("heuristic", "nonsaturating")])
def test_old_loss_names_are_refused_with_the_new_ones(old: str, new: str) -> None:
    with pytest.raises(ConfigError, match=f"training.losses: .*'{old}' was renamed: use '{new}'"):
        parse_config(tiny(training={"losses": [old]}))
    with pytest.raises(ConfigError, match=new):
        get_loss(old)


# ---- the whole-grid ensemble ------------------------------------------------------------------


def _specialists(seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Real data: two clusters. Components: one on each cluster, and one smeared between them."""
    g = torch.Generator().manual_seed(seed)
    left, right = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 0.0])
    real = torch.cat([left + 0.05 * torch.randn(300, 2, generator=g), right + 0.05 * torch.randn(300, 2, generator=g)])
    smear = torch.cat([torch.rand(200, 1, generator=g) * 4 - 2, 0.05 * torch.randn(200, 1, generator=g)], dim=1)
    return [
        left + 0.05 * torch.randn(200, 2, generator=g),
        right + 0.05 * torch.randn(200, 2, generator=g),
        smear,
    ], real


def test_greedy_forward_selection_takes_the_specialists_and_leaves_the_smear() -> None:
    fakes, real = _specialists()
    score = MixtureScore.from_samples(fakes, real, (0.01, 0.03, 0.1, 0.3, 1.0))
    weights = greedy_forward(score, 3, rounds=12)
    assert weights[2] == 0 and weights[0] == pytest.approx(0.5) and weights[1] == pytest.approx(0.5)


def test_greedy_forward_stops_when_no_component_helps() -> None:
    calls = []

    def score(w: np.ndarray) -> float:
        calls.append(w)
        return float(abs(w[0] - 1.0))  # component 0 alone is best

    assert list(greedy_forward(score, 2, rounds=10)) == [1.0, 0.0]
    assert (
        len(calls) == 4
    )  # two rounds of two additions (nothing to remove from one share): the second finds nothing better


def test_optimised_ensemble_beats_equal_weights_on_held_out_samples() -> None:
    select_fakes, select_real = _specialists(0)
    held_fakes, held_real = _specialists(1)
    factors = (0.01, 0.03, 0.1, 0.3, 1.0)
    ensemble = optimise_ensemble(
        MixtureScore.from_samples(select_fakes, select_real, factors),
        MixtureScore.from_samples(held_fakes, held_real, factors),
        np.random.default_rng(0),
    )
    assert ensemble.weights.sum() == pytest.approx(1.0)
    assert ensemble.weights[2] < 0.05
    assert ensemble.held_out_score < ensemble.equal_weight_score


def test_frechet_score_of_a_weighted_mixture_equals_the_fid_of_its_pooled_samples() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(400, 3, generator=g), torch.randn(400, 3, generator=g) * 2 + 1
    real = torch.randn(500, 3, generator=g)
    score = FrechetScore.from_features([a, b], real)
    pooled = torch.cat([a, b]).double()  # equal weights: the two components' samples pooled
    expected = frechet_distance(
        pooled.mean(0), torch.cov(pooled.T, correction=0), real.double().mean(0), torch.cov(real.double().T)
    )
    assert score(np.array([0.5, 0.5])) == pytest.approx(expected, rel=1e-6)
    assert score(np.array([1.0, 0.0])) < score(np.array([0.0, 1.0]))  # a is drawn like the real data
