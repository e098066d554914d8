"""Lipizzaner's faithful mode (examples/lipizzaner-mnist-3x3.yaml): each setting that departs from
Palomino's defaults does what Lipizzaner does, and a test fails without it; its scoring protocol on
Lipizzaner's own CNN weights; and benchmarks/lipizzaner.py end to end in its quick form."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import REPO, benchmark_module, tiny

from palomino.coevolution import Cell
from palomino.coevolution.ensemble_search import FrechetScore
from palomino.coevolution.plan import IterationPlan, draw_plan
from palomino.coevolution.selection import replace, replace_if_fitter
from palomino.coevolution.training import Training
from palomino.config import ExperimentConfig, parse_config
from palomino.config.loading import load_config
from palomino.data import load_dataset
from palomino.errors import ConfigError
from palomino.grid import Coord, Topology
from palomino.nn import apply, get_loss

FAITHFUL = {  # what the example sets beside Palomino's defaults, on the tiny ring
    "training": {
        "losses": ["nonsaturating"],
        "discriminator_skip_each_nth_step": 1,
        "selection": {"replacement": "if_fitter", "opponents": "per_batch"},
        "mutation": {"reaches_optimizer": False},
        "ensemble": {"scope": "neighbourhood"},
    }
}


def config(*changes: dict[str, Any]) -> ExperimentConfig:
    raw = tiny()
    for change in changes:
        raw = _merge(raw, change)
    return parse_config(raw)


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in change.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cells_of(cfg: ExperimentConfig) -> dict[Coord, Cell]:
    topology = Topology(cfg.grid.rows, cfg.grid.cols, cfg.grid.neighbourhood)
    dataset = load_dataset(cfg.data, 0)
    return {Coord(*c): Cell(Coord(*c), topology, cfg, dataset, experiment="t") for c in topology.cells()}


def recording_plans(monkeypatch: pytest.MonkeyPatch) -> list[IterationPlan]:
    """Every plan a cell's training draws, in order."""
    plans: list[IterationPlan] = []
    original = Training.plan

    def plan(self: Training, *args: Any, **kwargs: Any) -> IterationPlan:
        drawn = original(self, *args, **kwargs)
        plans.append(drawn)
        return drawn

    monkeypatch.setattr(Training, "plan", plan)
    return plans


def replay(
    cfg: ExperimentConfig,
    cell: Cell,
    plans: list[IterationPlan],
    generator: torch.nn.Module,
    discriminator: torch.nn.Module,
    frozen_g: list[torch.nn.Module] = (),  # type: ignore[assignment]
    frozen_d: list[torch.nn.Module] = (),  # type: ignore[assignment]
) -> None:
    """One plain GAN (torch's own Adam, fixed rate) taking the plans' batches, noise and opponents:
    opponent 0 is its own live partner, opponents 1… the frozen ones."""
    training = cfg.training
    loss = get_loss(training.losses[0])
    adam_g = torch.optim.Adam(generator.parameters(), lr=training.learning_rate, betas=training.adam_betas)
    adam_d = torch.optim.Adam(discriminator.parameters(), lr=training.learning_rate, betas=training.adam_betas)
    pool_d, pool_g = [discriminator, *frozen_d], [generator, *frozen_g]
    for plan in plans:
        for step, drawn in enumerate(plan.steps):
            real = cell.data.samples[torch.from_numpy(plan.batches[step])]
            for move in drawn.generators:
                adam_g.zero_grad()
                loss.generator(apply(pool_d[move.opponent], generator(plan.noise[move.noise]))).backward(
                    inputs=list(generator.parameters())
                )
                adam_g.step()
            for move in drawn.discriminators:
                with torch.no_grad():
                    fake = pool_g[move.opponent](plan.noise[move.noise])
                adam_d.zero_grad()
                loss.discriminator(discriminator, real, fake).backward(inputs=list(discriminator.parameters()))
                adam_d.step()


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a.parameters(), b.parameters()))


# ---- selection off: a 1×1 grid is one plain GAN; a cell trains its own against the neighbourhood ----


@pytest.mark.parametrize("reaches", [False, True], ids=["faithful", "mutation-reaching-adam"])
def test_a_1x1_grid_without_selection_is_one_plain_gan_of_the_same_steps(
    monkeypatch: pytest.MonkeyPatch, reaches: bool
) -> None:
    """Selection off, the mutation kept from Adam (Lipizzaner's effect): the cell's generator and
    discriminator are a plain GAN's after the same batches, noise and skip rule, to float rounding.
    With the mutation reaching Adam (a large alpha makes it show) they are not."""
    cfg = config(
        FAITHFUL,
        {
            "grid": {"rows": 1, "cols": 1},
            "training": {
                "iterations": 3,
                "batches_per_iteration": 6,
                "selection": {"enabled": False},
                "mutation": {"probability": 1.0, "alpha": 0.5, "reaches_optimizer": reaches},
            },
        },
    )
    (cell,) = cells_of(cfg).values()
    generator = copy.deepcopy(cell.generators.best.network)
    discriminator = copy.deepcopy(cell.discriminators.best.network)
    plans = recording_plans(monkeypatch)
    for _ in range(3):
        cell.iterate({})
    assert [len(s.discriminators) for s in plans[0].steps] == [1, 0, 1, 0, 1, 0]  # the skip: every second batch
    replay(cfg, cell, plans, generator, discriminator)
    same = same_weights(generator, cell.generators.best.network) and same_weights(
        discriminator, cell.discriminators.best.network
    )
    assert same is not reaches
    rate = cell.generators.best.optimizer.param_groups[0]["lr"]
    assert (rate == cfg.training.learning_rate) is not reaches


def test_without_selection_a_cell_trains_its_own_against_the_whole_neighbourhood(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The centre of a 3×3 grid: its own generator and discriminator go on (no tournament, no
    replacement), each batch against an opponent drawn from its own live partner and the four
    neighbours' frozen copies, which it never changes. With selection on it is not so."""
    for enabled in (False, True):
        cfg = config(
            FAITHFUL,
            {
                "grid": {"rows": 3, "cols": 3},
                "training": {"batches_per_iteration": 12, "selection": {"enabled": enabled}},
            },
        )
        cells = cells_of(cfg)
        centre = cells[Coord(1, 1)]
        neighbours = {Coord(*c): cells[Coord(*c)] for c in centre.topology.neighbours(centre.coord)}
        snapshots = {c: n.snapshot() for c, n in neighbours.items()}
        before = {c: copy.deepcopy(n.discriminators.best.network) for c, n in neighbours.items()}
        generator = copy.deepcopy(centre.generators.best.network)
        discriminator = copy.deepcopy(centre.discriminators.best.network)
        frozen_g = [copy.deepcopy(n.generators.best.network) for n in neighbours.values()]
        frozen_d = [copy.deepcopy(n.discriminators.best.network) for n in neighbours.values()]
        plans = recording_plans(monkeypatch)
        centre.iterate(snapshots)
        opponents = {m.opponent for s in plans[-1].steps for m in [*s.generators, *s.discriminators]}
        if enabled:
            assert opponents == {0}  # with selection the pair trains against itself
            continue
        assert opponents - {0}, "some batches drew a neighbour"
        replay(cfg, centre, plans[-1:], generator, discriminator, frozen_g, frozen_d)
        assert same_weights(generator, centre.generators.best.network)
        assert same_weights(discriminator, centre.discriminators.best.network)
        for coord, neighbour in neighbours.items():  # their copies only lent their numbers
            assert same_weights(before[coord], neighbour.discriminators.best.network)


# ---- replacement: only a strictly fitter trained individual ----------------------------------------


def test_if_fitter_replacement_keeps_the_local_individual_unless_the_trained_one_is_strictly_fitter() -> None:
    local, trained = ["a", "b", "c"], ["x", "y"]
    assert replace_if_fitter(local, [0.1, 0.5, 0.9], trained, [0.95, 2.0], 1) == ["a", "b", "c"]
    assert replace_if_fitter(local, [0.1, 0.5, 0.9], trained, [0.9, 2.0], 1) == ["a", "b", "c"]  # equal: kept
    assert replace_if_fitter(local, [0.1, 0.5, 0.9], trained, [0.2, 2.0], 1) == ["a", "x", "b"]
    # n = 2, Lipizzaner's pairing: the best trained one against the 2nd worst, the next against the worst
    assert replace_if_fitter(local, [0.1, 0.5, 0.9], trained, [0.6, 0.7], 2) == ["a", "b", "y"]
    assert replace(local, [0.1, 0.5, 0.9], trained, [0.95, 2.0], 1, "elitist") == ["a", "b", "x"]


@pytest.mark.parametrize("policy", ["if_fitter", "elitist"])
def test_a_cell_keeps_its_own_individual_when_its_trained_one_scores_worse(
    monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    cfg = config({"grid": {"rows": 1, "cols": 1}, "training": {"selection": {"replacement": policy}}})
    (cell,) = cells_of(cfg).values()
    before = (cell.generators.best, cell.discriminators.best)
    worse = lambda self, selected: (torch.full((1, 1), 1e9), torch.full((1, 1), 1e9))  # noqa: E731
    monkeypatch.setattr(Cell, "re_evaluate", worse)
    cell.iterate({})
    kept = (cell.generators.best, cell.discriminators.best) == before
    assert kept is (policy == "if_fitter")


# ---- one opponent a batch; the mutation drawn but kept from Adam -------------------------------------


def plan_of(cfg: ExperimentConfig, members: int = 3) -> IterationPlan:
    (cell,) = cells_of(cfg).values()
    rates = [cfg.training.learning_rate] * members
    rng = np.random.default_rng(0)
    return draw_plan(cfg.training, cell.data, rng, torch.Generator().manual_seed(0), 8, (rates, rates), 8)


def test_one_opponent_a_batch_is_shared_by_every_attacker() -> None:
    grid = {"grid": {"rows": 1, "cols": 1}, "training": {"population_size": 3, "tournament_size": 3}}
    shared = plan_of(config(grid, {"training": {"selection": {"opponents": "per_batch"}}}))
    own = plan_of(config(grid))
    for plan, one in ((shared, True), (own, False)):
        per_step = [{m.opponent for m in s.generators} for s in plan.steps] + [
            {m.opponent for m in s.discriminators} for s in plan.steps
        ]
        assert all(len(o) == 1 for o in per_step) is one


def test_a_mutation_that_never_reaches_adam_draws_the_same_stream_and_keeps_the_rate() -> None:
    grid = {"grid": {"rows": 1, "cols": 1}, "training": {"mutation": {"probability": 1.0, "alpha": 0.5}}}
    reaching = plan_of(config(grid))
    kept = plan_of(config(grid, {"training": {"mutation": {"reaches_optimizer": False}}}))
    rates = {m.rate for s in kept.steps for m in [*s.generators, *s.discriminators]}
    assert rates == {2e-4}
    assert len({m.rate for s in reaching.steps for m in s.generators}) > 1
    opponents = [[(m.opponent, m.noise) for m in s.generators] for s in reaching.steps]
    assert opponents == [[(m.opponent, m.noise) for m in s.generators] for s in kept.steps]
    assert np.array_equal(reaching.batches, kept.batches) and torch.equal(reaching.noise, kept.noise)


# ---- the mixture's FID on Lipizzaner's CNN; the example; the scorer's weights ------------------------


def test_the_mixture_evolves_on_fid_of_lipizzaners_cnn_and_only_for_digits(mnist_dir: Path) -> None:
    raw = tiny(
        grid={"rows": 1, "cols": 1},
        data={"name": "mnist", "dir": str(mnist_dir), "split": "test", "size": 300},
        network={"name": "mlp", "hidden": 16, "latent_dim": 8},
        training={"mixture": {"score": "fid", "score_samples": 128}, "batches_per_iteration": 1},
    )
    cfg = parse_config(raw)
    (cell,) = cells_of(cfg).values()
    report = cell.iterate({})
    score = cell.mixture_score([cell.generators.best], 128)
    assert isinstance(score, FrechetScore) and score.means.shape == (1, 10)  # 10 logits: Lipizzaner's features
    assert report.score > 50  # an untrained generator is far from digits on them
    with pytest.raises(ConfigError, match="training.mixture.score: fid .* not gaussian_ring"):
        parse_config(tiny(training={"mixture": {"score": "fid"}}))


def test_the_example_sets_lipizzaners_mnist_values_and_palominos_defaults_stay() -> None:
    cfg = load_config(REPO / "examples" / "lipizzaner-mnist-3x3.yaml", [])
    t = cfg.training
    assert (t.iterations, t.batch_size, t.batches_per_iteration, t.population_size, t.tournament_size) == (
        200,
        100,
        0,
        1,
        2,
    )
    assert (t.learning_rate, t.adam_betas, t.losses, t.discriminator_skip_each_nth_step) == (
        2e-4,
        (0.5, 0.999),
        ["nonsaturating"],
        1,
    )
    assert (t.mutation.probability, t.mutation.alpha, t.mutation.reaches_optimizer) == (0.5, 1e-4, False)
    assert (t.fitness.sample_size, t.fitness.mode, t.mixture.sigma, t.mixture.score, t.mixture.es_steps) == (
        1000,
        "average",
        0.01,
        "fid",
        1,
    )
    assert (t.selection.replacement, t.selection.opponents, t.selection.enabled, t.ensemble.scope) == (
        "if_fitter",
        "per_batch",
        True,
        "neighbourhood",
    )
    assert (cfg.network.latent_dim, cfg.network.hidden, cfg.network.activation) == (64, 256, "leaky_relu")
    default = parse_config({})
    assert default.training.selection.replacement == "elitist" and default.training.mixture.score == "mmd"
    assert default.training.mutation.reaches_optimizer and default.training.selection.opponents == "per_member"
    dumped = default.model_dump(mode="json")["training"]  # a run of the defaults reads as before
    assert "opponents" not in dumped["selection"] and "score" not in dumped["mixture"]


def test_lipizzaners_own_cnn_classifies_9927_of_the_mnist_test_digits(mnist_dir: Path) -> None:
    from palomino.config import DataConfig
    from palomino.scoring.classifier import accuracy, adapt_images
    from palomino.scoring.lipizzaner_protocol import lipizzaners_mnist_cnn

    test = load_dataset(DataConfig(name="mnist", dir=mnist_dir, split="test"), 0)
    assert len(test) == 10_000
    images = adapt_images(test.to_data_space(test.samples), (1, 28, 28))
    assert accuracy(lipizzaners_mnist_cnn(), images, test.labels) == pytest.approx(0.9927, abs=5e-5)
    meta = json.loads((REPO / "palomino" / "nn" / "weights" / "lipizzaner-mnist-cnn.json").read_text())
    assert meta["accuracy"] == 0.9927 and meta["imported_from"]["file"] == "mnist_cnn.pkl"


def test_lipizzaners_fid_protocol_puts_real_digits_near_each_other_and_noise_far(mnist_dir: Path) -> None:
    from palomino.config import DataConfig
    from palomino.scoring.lipizzaner_protocol import lipizzaners_mnist_cnn, protocol_fid

    test = load_dataset(DataConfig(name="mnist", dir=mnist_dir, split="test"), 0)
    images = test.to_data_space(test.samples)
    net = lipizzaners_mnist_cnn()
    halves = protocol_fid(net, images[:5000], images[5000:])  # 4,992 each: whole batches of 64
    thousand = protocol_fid(net, images[:1000], images[5000:6000])  # the protocol's own size: 960 each
    noise = protocol_fid(net, torch.rand(1000, 1, 28, 28, generator=torch.Generator().manual_seed(0)), images[:1000])
    assert halves < 12 and thousand < 20 and noise > 300
    with pytest.raises(ValueError, match="at least one batch of 64"):
        protocol_fid(net, images[:63], images[:1000])


@pytest.mark.slow
@pytest.mark.timeout(1500)  # ~3 min alone (six arms, a rescore; the referee's classifier comes trained)
def test_the_lipizzaner_benchmark_runs_every_arm_in_its_quick_form(referee_classifier: Path, tmp_path: Path) -> None:
    bench = benchmark_module("lipizzaner")
    for made in referee_classifier.glob("classifier-*"):  # found in --out and reused, not trained again
        shutil.copy(made, tmp_path)
    assert bench.main(["--quick", "--sizes", "2", "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "table.json").read_text())
    assert [line["arm"] for line in table["lines"]] == list(bench.ARMS)
    for row in table["rows"]:
        assert row["command"].startswith("python benchmarks/lipizzaner.py --arms ") and "--quick" in row["command"]
        assert 0 < row["lipizzaner"]["fid"] < 5000 and 0 < row["held_out"]["fid"] < 5000
        assert set(row["held_out"]) >= {"fid", "fid_lipizzaner_cnn", "tvd", "tvd_lipizzaner_cnn", "memorization"}
    by_arm = {row["arm"]: row for row in table["rows"]}
    assert len(by_arm["full"]["lipizzaner"]["per_cell"]) == 4  # every cell's neighbourhood mixture scored
    assert by_arm["one-gan-grid"]["steps"]["generator"] == 4 * by_arm["one-gan-cell"]["steps"]["generator"]
    assert by_arm["palomino"]["lipizzaner"]["cell"] == "grid"
    # A rerun keeps the rows it finds (the table grows across sessions); scored again, every row's
    # run (a one-GAN arm's generator too) gives the figures it gave.
    assert bench.main(["--quick", "--sizes", "2", "--arms", "full", "--out", str(tmp_path)]) == 0
    assert bench.main(["--rescore", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "table.json").read_text())["rows"]
    assert [(r["lipizzaner"], r["held_out"]) for r in again] == [
        (r["lipizzaner"], r["held_out"]) for r in table["rows"]
    ]
