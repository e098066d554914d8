"""benchmarks/quality.py, the referee: every image case's scores carry the memorization ratio beside
FID (real MNIST digits: copies of the training digits flagged, held-out digits not), and the table
and its JSON rows show it, a row below 0.9 marked as memorizing."""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import pytest
import torch
import yaml
from conftest import benchmark_module

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quality() -> ModuleType:
    return benchmark_module("quality")


def test_the_referee_scores_images_with_the_memorization_ratio_beside_fid(
    quality: ModuleType, mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from palomino.config.loading import load_config
    from palomino.scoring.classifier import save_classifier, train_classifier

    monkeypatch.setattr(quality, "MNIST_DIR", mnist_dir)
    case = quality.CASES["mnist-1x1"]
    overrides = [*case.overrides, f"data.dir={mnist_dir}", "seed=0"]
    config = load_config(REPO / "examples" / f"{case.example}.yaml", overrides)
    train, held_out, none = quality.split_data(config, 0)
    assert (len(train), len(held_out), none) == (8000, 2000, None)
    kept, same, validation = quality.split_data(config, 0, validation=1000)  # a sweep's: 1,000 more aside
    assert (len(kept), len(validation)) == (7000, 1000) and torch.equal(same.samples, held_out.samples)
    assert torch.equal(torch.cat([kept.samples, validation.samples]), train.samples)
    # The referee trains its classifier once per output folder; a small one here, where it looks.
    small = train_classifier(config.data, holdout=quality.IMAGE_SAMPLES, train_size=1000, test_size=200, epochs=1)
    save_classifier(small, tmp_path / f"classifier-{config.data.name}.safetensors")
    referee = quality.Referee(config, train, held_out, tmp_path)

    copies = train.samples[:2000] + 0.01 * torch.randn(2000, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    copied = referee.score(copies.clamp(-1, 1))
    assert set(copied) == {"fid", "tvd", "memorization"} and copied["memorization"] < 0.1
    fresh = referee.score(held_out.samples[:1000])  # real digits the GANs never saw
    assert fresh["memorization"] == pytest.approx(1.0, abs=0.1)


def test_the_table_and_its_rows_flag_a_memorizing_method(quality: ModuleType) -> None:
    Result = quality.Result
    results = [
        Result("mnist-3x3", seed, method, 1000, 10.0, {"fid": fid, "tvd": 0.1, "memorization": ratio})
        for seed in (0, 1)
        for method, fid, ratio in (("grid", 30.0 + seed, 1.02), ("indep-regions", 8.0 + seed, 0.5 + 0.1 * seed))
    ]
    rows = quality.summarise(results)
    grid, regions = rows
    assert grid["memorizing"] is False and regions["memorizing"] is True
    assert regions["memorization"]["values"] == [0.5, 0.6] and regions["memorization"]["mean"] == pytest.approx(0.55)
    table = quality.format_table(rows).splitlines()
    assert "memorization" in table[0] and "fid" in table[0]
    assert "1.020 ±0.000" in table[1] and "!" not in table[1]
    assert "0.550!±0.050" in table[2]
    assert table[-1].startswith("memorization: median distance") and "! = below 0.9: memorizing" in table[-1]
    # The toys' table is as it was: no memorization column, no legend.
    toy = quality.format_table(quality.summarise([Result("ring-3x3", 0, "grid", 10, 1.0, {"modes": 8, "hq": 1.0})]))
    assert "memorization" not in toy and "!" not in toy


def test_a_sweep_shows_each_method_at_the_rate_its_validation_split_chose(quality: ModuleType) -> None:
    Result = quality.Result

    def result(method: str, rate: float, valid_fid: float, test_fid: float) -> Result:
        return Result("mnist-3x3", 0, method, 100, 1.0, {"fid": test_fid}, rate, {"fid": valid_fid})

    every = [
        result("grid", 1e-3, 30.0, 31.0),
        result("plain", 1e-3, 800.0, 790.0),
        result("grid", 2e-4, 35.0, 20.0),  # better on the held-out split: must not be picked for that
        result("plain", 2e-4, 240.0, 245.0),
    ]
    chosen = quality.pick(every)
    assert [(r.method, r.rate) for r in chosen] == [("grid", 1e-3), ("plain", 2e-4)]
    toys = [
        Result("ring-3x3", 0, "plain", 1, 1.0, {}, rate, {"modes": modes, "hq": hq})
        for rate, modes, hq in ((1e-3, 7, 0.99), (5e-4, 8, 0.90), (2e-4, 8, 0.95))
    ]
    assert quality.pick(toys)[0].rate == 2e-4  # modes first, then the high-quality share
    rows = quality.summarise(chosen)
    assert rows[1]["lr"] == [2e-4] and "lr 0.0002" in quality.format_table(rows)


def short_ring(*changes: str) -> list[str]:
    """--set arguments for a short 2×2 run of the ring case; no discriminator filter (rejection
    sampling from untrained GANs draws for half a minute), which the case otherwise samples through."""
    base = ("grid.rows=2", "grid.cols=2", "training.batches_per_iteration=2", "training.fitness.sample_size=64")
    return [f"--set={change}" for change in (*base, "training.ensemble.critic_quantile=0", *changes)]


def test_the_referee_runs_a_short_sweep_with_the_ablation_end_to_end(quality: ModuleType, tmp_path: Path) -> None:
    import json

    short = short_ring("training.iterations=2")
    args = ["ring-3x3", "--seeds", "0", "--rates", "1e-3", "2e-4", "--ablations", *short, "--out", str(tmp_path)]
    assert quality.main(args) == 0
    table = json.loads((tmp_path / "table.json").read_text())
    methods = {"grid", "grid-alone", "grid-no-selection", "grid-no-mutation", "plain", "indep-best", "indep-mix"}
    methods |= {"indep-regions", "indep-regions-search"}
    assert {row["method"] for row in table["rows"]} == methods
    assert all(row["lr"][0] in (1e-3, 2e-4) and "hq" in row for row in table["rows"])
    swept = {(r["method"], r["rate"]) for r in table["sweep"]}
    assert swept == {(m, rate) for m in methods for rate in (1e-3, 2e-4)}
    assert all(set(r["validation"]) == {"modes", "hq"} for r in table["sweep"])
    assert (tmp_path / "table.png").stat().st_size > 0
    # The ring selects nothing (one individual a cell, no migrants, generational): no-selection is the grid's run.
    by_method = {(r["method"], r["rate"]): r for r in table["sweep"]}
    for rate in (1e-3, 2e-4):
        assert by_method[("grid-no-selection", rate)]["scores"] == by_method[("grid", rate)]["scores"]
    assert not (tmp_path / "ring-3x3" / "no-selection").exists()
    # grid-alone: the same grid with no neighbours (its own run directory, a config that says so)
    alone = [yaml.safe_load(p.read_text()) for p in (tmp_path / "ring-3x3" / "alone").glob("*/config.yaml")]
    assert len(alone) == 2 and all(c["grid"]["neighbourhood"] == "none" for c in alone)  # one run per rate
    # grid-no-mutation: the ring mutates its rates, so a run of its own whose cells do not
    fixed = [yaml.safe_load(p.read_text()) for p in (tmp_path / "ring-3x3" / "no-mutation").glob("*/config.yaml")]
    assert len(fixed) == 2 and all(c["training"]["mutation"]["probability"] == 0 for c in fixed)
    assert table["ablations"] == ["grid-alone", "grid-no-selection", "grid-no-mutation"]
    assert table["finished"] is True


def test_the_fashion_case_trains_on_its_data_size(quality: ModuleType, fashion_mnist_dir: Path) -> None:
    # classifier_split takes whole splits: the case's data.size=10000 was dropped and the GANs saw 60,000.
    from palomino.config.loading import load_config

    case = quality.CASES["fashion-3x3"]
    config = load_config(REPO / "examples" / f"{case.example}.yaml", [*case.overrides, f"data.dir={fashion_mnist_dir}"])
    train, held_out, _ = quality.split_data(config, 0)
    assert (len(train), len(held_out)) == (10_000, 10_000)
    assert len(train.labels.unique()) == 10


def test_the_full_fashion_cases_train_on_every_training_image(quality: ModuleType, fashion_mnist_dir: Path) -> None:
    from palomino.config.loading import load_config

    for n in (1, 5):
        case = quality.CASES[f"fashion-full-{n}x{n}"]
        config = load_config(
            REPO / "examples" / f"{case.example}.yaml", [*case.overrides, f"data.dir={fashion_mnist_dir}"]
        )
        assert (config.grid.rows, config.grid.cols) == (n, n)
        train, held_out, _ = quality.split_data(config, 0)
        assert (len(train), len(held_out)) == (60_000, 10_000)


def test_the_referee_trains_only_the_baselines_asked_for(quality: ModuleType, tmp_path: Path) -> None:
    import json

    short = short_ring("training.iterations=1")
    assert quality.main(["ring-3x3", "--seeds", "0", "--baselines", "regions", *short, "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "table.json").read_text())
    assert [row["method"] for row in table["rows"]] == ["grid", "indep-regions", "indep-regions-search"]
    assert table["baselines"] == ["regions"]
    with pytest.raises(SystemExit):  # argparse names the choices
        quality.main(["ring-3x3", "--baselines", "everything"])


def test_the_plain_gan_can_see_the_grids_samples_in_larger_batches(quality: ModuleType, tmp_path: Path) -> None:
    import json

    from conftest import tiny

    from palomino.baselines import Budget
    from palomino.config import parse_config

    config = parse_config(tiny(training={"batch_size": 50}))
    assert quality.plain_setting(config, Budget(900, 1800), 1) == (config, Budget(900, 1800), "plain")
    scaled, budget, name = quality.plain_setting(config, Budget(900, 1800), 4)
    assert (scaled.training.batch_size, budget, name) == (200, Budget(225, 450), "plain-batch×4")  # same samples
    assert config.training.batch_size == 50  # the grid's own config untouched

    short = short_ring("training.iterations=1")
    args = ["ring-3x3", "--seeds", "0", "--baselines", "plain", "--plain-scale", "2", *short, "--out", str(tmp_path)]
    assert quality.main(args) == 0
    table = json.loads((tmp_path / "table.json").read_text())
    grid, plain = table["rows"]
    assert (plain["method"], table["plain_scale"]) == ("plain-batch×2", 2)
    assert plain["steps"] == grid["steps"] // 2
    with pytest.raises(SystemExit):
        quality.main(["ring-3x3", "--plain-scale", "0"])


def test_the_no_selection_ablation_takes_fitness_out_of_selection_and_replacement(quality: ModuleType) -> None:
    from conftest import tiny

    from palomino.config import parse_config

    lipizzaner = parse_config(tiny(training={"population_size": 2, "tournament_size": 2}))
    assert quality.selects(lipizzaner)
    free = quality.without_selection(lipizzaner)
    assert not quality.selects(free) and free.training.selection.migration == 1.0  # migrants come, at random
    assert free.training.tournament_size == 1 and free.training.selection.replacement == "generational"
    assert free.training.population_size == 2 and free.grid == lipizzaner.grid  # nothing else moves
    regions = parse_config(
        tiny(training={"data_regions": True, "selection": {"migration": 0.0, "replacement": "generational"}})
    )
    assert not quality.selects(regions)  # one individual, no migrants, generational: nothing to remove
    elitist = parse_config(tiny(training={"selection": {"migration": 0.0}}))
    assert quality.selects(elitist)  # the parent survives when fitter than its offspring


def test_the_no_mutation_ablation_takes_the_cells_own_policies_out(quality: ModuleType) -> None:
    from conftest import tiny

    from palomino.config import parse_config

    mustangs = parse_config(tiny(training={"losses": ["minimax", "nonsaturating", "mse"]}))
    assert quality.mutates(mustangs)
    fixed = quality.without_mutation(mustangs)
    assert not quality.mutates(fixed)
    assert fixed.training.losses == ["minimax"] and fixed.training.mutation.probability == 0  # the baselines' loss
    assert fixed.grid == mustangs.grid and fixed.training.selection == mustangs.training.selection
    assert mustangs.training.losses == ["minimax", "nonsaturating", "mse"]  # the grid's own config untouched
    one_loss = parse_config(tiny(training={"losses": ["nonsaturating"], "mutation": {"probability": 0.5}}))
    assert quality.mutates(one_loss)  # its rates still move
    still = parse_config(tiny(training={"losses": ["nonsaturating"], "mutation": {"alpha": 0.0}}))
    assert not quality.mutates(still)  # nothing to take away: the grid's own run is the row
    alone = quality.without_neighbours(mustangs)  # grid-alone: likewise its own row where nothing communicates
    assert quality.communicates(mustangs) and not quality.communicates(alone) and alone.training == mustangs.training


def test_the_referee_runs_only_the_ablations_named_and_keeps_each_seed(quality: ModuleType, tmp_path: Path) -> None:
    import json

    short = short_ring("training.iterations=1", "training.mutation.alpha=0")
    args = ["ring-3x3", "--seeds", "0", "1", "--ablations", "grid-no-mutation", "--baselines", *short]
    assert quality.main([*args, "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "table.json").read_text())
    assert [row["method"] for row in table["rows"]] == ["grid", "grid-no-mutation"]
    grid, fixed = table["rows"]
    assert fixed["modes"] == grid["modes"] and fixed["hq"] == grid["hq"]  # nothing mutates: the grid's own run
    assert not (tmp_path / "ring-3x3" / "no-mutation").exists() and table["finished"] is True
    with pytest.raises(SystemExit):  # argparse names the choices
        quality.main(["ring-3x3", "--ablations", "grid-without-anything"])


def test_a_stopped_referee_leaves_the_seeds_it_finished(
    quality: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    calls: list[int] = []
    real = quality.evaluate_case

    def stops_at_the_second_seed(name: str, seed: int, *rest: object, **kwargs: object) -> list[object]:
        calls.append(seed)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(name, seed, *rest, **kwargs)

    monkeypatch.setattr(quality, "evaluate_case", stops_at_the_second_seed)
    short = short_ring("training.iterations=1")
    with pytest.raises(KeyboardInterrupt):
        quality.main(["ring-3x3", "--seeds", "3", "4", "--baselines", *short, "--out", str(tmp_path)])
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["finished"] == [["ring-3x3", 3]] and [row["method"] for row in table["rows"]] == ["grid"]
    assert table["rows"][0]["seeds"] == 1


def test_the_referee_scores_on_lipizzaners_cnn_when_asked(
    quality: ModuleType, mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import palomino.scoring.classifier as classifier

    monkeypatch.setattr(quality, "MNIST_DIR", mnist_dir)
    # This checks the plumbing: a small held-out split, and a classifier of one epoch on 1,000 images.
    monkeypatch.setattr(quality.referee_scoring, "IMAGE_SAMPLES", 200)  # where the referee reads it
    quick = functools.partial(classifier.train_classifier, epochs=1, train_size=1000, test_size=200)
    monkeypatch.setattr(classifier, "train_classifier", quick)
    short = [
        f"--set={change}"
        for change in ("training.iterations=1", "training.batches_per_iteration=2", "training.fitness.sample_size=64")
    ]
    args = ["mnist-1x1", "--seeds", "0", "--baselines", "--extractor", "lipizzaner", *short, "--out", str(tmp_path)]
    assert quality.main(args) == 0
    trained = classifier.load_classifier(tmp_path / "classifier-mnist-lipizzaner.safetensors")
    assert trained.arch == "lipizzaner" and not (tmp_path / "classifier-mnist.safetensors").exists()
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["extractor"] == "lipizzaner" and [r["method"] for r in table["rows"]] == ["grid"]
    assert table["rows"][0]["fid"]["mean"] > 0
