"""The scoring library: FID/IS/KID through torchmetrics, TVD, the real-statistics cache, the extractors'
errors, and `palomino score` on real finished runs (a toy run; an MNIST run with the session's classifier).

The metrics' arithmetic is checked against closed forms computed independently in the tests; the
classifier-backed tests use MNIST's test split (the `mnist_dir` fixture) and a classifier that
`palomino classifier train` trains at reduced size once a session (the `mnist_classifier` fixture
in conftest.py; its accuracy is checked here).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import last_line, palomino, tiny, write_yaml
from torch import nn

from palomino.config import DataConfig
from palomino.data import load_dataset
from palomino.errors import ConfigError, PalominoError
from palomino.runs import Mixture
from palomino.scoring import ScoringContext, ScoringOptions, mode_coverage, parse_metrics, score_mixture, score_run
from palomino.scoring.extractors import build_extractor
from palomino.scoring.metrics import compute_metrics, fid_metric, inception_score_metric, kid_metric
from palomino.scoring.real_statistics import RealStatistics
from palomino.scoring.tvd import ClassDistributionTVD, total_variation


def features_in(width: int) -> nn.Module:
    """The identity as torchmetrics' `feature` module: the 'images' given are already feature vectors."""
    module = nn.Identity()
    module.num_features = width
    return module


def statistics(features: torch.Tensor, classes: int = 10) -> RealStatistics:
    return RealStatistics(features.float(), torch.full((classes,), 1 / classes, dtype=torch.float64), "labels", "test")


def gaussian(n: int, mean: torch.Tensor, cov: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return mean + torch.randn(n, len(mean), generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T


def frechet_closed_form(m1: torch.Tensor, c1: torch.Tensor, m2: torch.Tensor, c2: torch.Tensor) -> float:
    """‖μ1−μ2‖² + Tr(Σ1 + Σ2 − 2 (Σ1^½ Σ2 Σ1^½)^½), through symmetric eigendecompositions
    (torchmetrics uses the eigenvalues of Σ1Σ2: a different route to the same number)."""

    def sqrtm(m: torch.Tensor) -> torch.Tensor:
        values, vectors = torch.linalg.eigh(m)
        return vectors @ torch.diag(values.clamp(min=0).sqrt()) @ vectors.T

    root = sqrtm(c1)
    return float((m1 - m2).square().sum() + torch.trace(c1 + c2 - 2 * sqrtm(root @ c2 @ root)))


def fid_of(real: torch.Tensor, fake: torch.Tensor) -> float:
    metric = fid_metric(features_in(real.shape[1]), statistics(real))
    for batch in fake.float().split(1000):
        metric.update(batch, real=False)
    return float(metric.compute())


# --- FID ---------------------------------------------------------------------------------------


def test_fid_of_a_set_against_itself_is_zero() -> None:
    cov = torch.tensor([[1.0, 0.3, 0.0], [0.3, 2.0, -0.4], [0.0, -0.4, 0.5]], dtype=torch.float64)
    x = gaussian(5000, torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), cov, seed=1)
    assert abs(fid_of(x, x)) < 1e-3


def test_fid_against_a_shifted_gaussian_set_matches_the_closed_form() -> None:
    cov = torch.tensor(
        [[1.0, 0.5, 0.0, 0.0], [0.5, 1.5, 0.2, 0.0], [0.0, 0.2, 0.8, 0.1], [0.0, 0.0, 0.1, 1.2]], dtype=torch.float64
    )
    real = gaussian(20_000, torch.zeros(4, dtype=torch.float64), cov, seed=2)
    shift = torch.tensor([1.0, -0.5, 0.7, 0.3], dtype=torch.float64)
    # The same set shifted by δ: equal covariances, so the closed form is ‖δ‖².
    assert fid_of(real, real + shift) == pytest.approx(float(shift.square().sum()), rel=0.01)


def test_fid_of_two_gaussian_sets_matches_the_closed_form() -> None:
    mean1, mean2 = torch.zeros(4, dtype=torch.float64), torch.tensor([1.0, -0.5, 0.7, 0.3], dtype=torch.float64)
    cov1 = torch.tensor(
        [[1.0, 0.5, 0.0, 0.0], [0.5, 1.5, 0.2, 0.0], [0.0, 0.2, 0.8, 0.1], [0.0, 0.0, 0.1, 1.2]], dtype=torch.float64
    )
    cov2 = torch.tensor(
        [[2.0, -0.3, 0.0, 0.4], [-0.3, 0.6, 0.0, 0.0], [0.0, 0.0, 1.1, 0.0], [0.4, 0.0, 0.0, 1.0]], dtype=torch.float64
    )
    real, fake = gaussian(60_000, mean1, cov1, seed=2), gaussian(60_000, mean2, cov2, seed=3)
    fid = fid_of(real, fake)
    # Exactly the closed form of the two sets' own moments (an independent route to the matrix square root) ...
    empirical = frechet_closed_form(real.mean(0), torch.cov(real.T), fake.mean(0), torch.cov(fake.T))
    assert fid == pytest.approx(empirical, rel=1e-4)
    # ... and the population's within sampling error (about 1 % at 60,000 samples).
    assert fid == pytest.approx(frechet_closed_form(mean1, cov1, mean2, cov2), rel=0.03)


# --- IS, KID, TVD ------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*degrees of freedom:UserWarning")  # one split has no spread
@pytest.mark.parametrize("classes", [2, 10])
def test_inception_score_of_uniform_predictions_is_one_and_of_balanced_one_hot_is_k(classes: int) -> None:
    uniform = inception_score_metric(features_in(classes), splits=1)
    uniform.update(torch.zeros(1000, classes))
    assert compute_metrics({"is": uniform}, seed=0)["is"]["value"] == pytest.approx(1.0, abs=1e-6)

    one_hot = inception_score_metric(features_in(classes), splits=1)
    labels = torch.arange(1000) % classes
    one_hot.update(torch.nn.functional.one_hot(labels, classes).float() * 50)  # logits of certain predictions
    assert compute_metrics({"is": one_hot}, seed=0)["is"]["value"] == pytest.approx(classes, rel=1e-4)

    collapsed = inception_score_metric(features_in(classes), splits=1)
    collapsed.update(torch.nn.functional.one_hot(torch.zeros(1000, dtype=torch.long), classes).float() * 50)
    assert compute_metrics({"is": collapsed}, seed=0)["is"]["value"] == pytest.approx(1.0, abs=1e-4)


def test_kid_is_near_zero_for_one_distribution_and_positive_for_another() -> None:
    cov = torch.eye(3, dtype=torch.float64)
    real = gaussian(2000, torch.zeros(3, dtype=torch.float64), cov, seed=4).float()
    same = kid_metric(features_in(3), statistics(real), samples=2000, subsets=20)
    same.update(gaussian(2000, torch.zeros(3, dtype=torch.float64), cov, seed=5).float(), real=False)
    shifted = kid_metric(features_in(3), statistics(real), samples=2000, subsets=20)
    shifted.update(gaussian(2000, torch.full((3,), 1.0, dtype=torch.float64), cov, seed=5).float(), real=False)
    scores = compute_metrics({"same": same, "shifted": shifted}, seed=0)
    assert abs(scores["same"]["value"]) < 0.01 < scores["shifted"]["value"]
    assert compute_metrics({"same": same}, seed=0) == compute_metrics({"same": same}, seed=0)  # seeded subsets


def test_tvd_of_a_balanced_sample_is_zero_and_of_a_collapsed_one_is_one_minus_its_share() -> None:
    uniform = torch.full((10,), 0.1, dtype=torch.float64)
    balanced = ClassDistributionTVD(features_in(10), uniform)
    balanced.update(torch.nn.functional.one_hot(torch.arange(5000) % 10, 10).float())
    assert float(balanced.compute()) == pytest.approx(0.0, abs=1e-12)

    collapsed = ClassDistributionTVD(features_in(10), uniform)
    collapsed.update(torch.nn.functional.one_hot(torch.full((300,), 3), 10).float())
    assert float(collapsed.compute()) == pytest.approx(0.9)

    assert float(total_variation(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.5, 0.5]))) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="sums to 1"):
        ClassDistributionTVD(features_in(10), torch.ones(10))


# --- options, extractors' errors ------------------------------------------------------------------


def test_metric_names_and_options_are_validated_with_the_flag_named() -> None:
    assert parse_metrics("fid, IS,kid,fid") == ["fid", "is", "kid"]
    with pytest.raises(ConfigError, match=r"--metrics 'fid,fdi': unknown metric fdi; choose from fid,is,kid,tvd,modes"):
        parse_metrics("fid,fdi")
    with pytest.raises(ConfigError, match="--samples"):
        ScoringOptions.build(samples=1)
    with pytest.raises(ConfigError, match="--extractor"):
        ScoringOptions.build(extractor="vgg")


def test_inception_without_weights_says_which_flag_or_variable_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # an empty hub cache: nothing to find, nothing fetched
    monkeypatch.delenv("PALOMINO_INCEPTION_WEIGHTS", raising=False)
    with pytest.raises(ConfigError) as error:
        build_extractor("inception")
    message = str(error.value)
    assert "--inception-weights" in message and "PALOMINO_INCEPTION_WEIGHTS" in message and "never downloads" in message
    assert str(tmp_path / "torch" / "hub" / "checkpoints") in message and "--extractor classifier" in message

    with pytest.raises(ConfigError, match="--inception-weights .*missing.pth: no such file"):
        build_extractor("inception", inception_weights=tmp_path / "missing.pth")


def test_inception_weights_without_torch_fidelity_say_what_to_install(tmp_path: Path) -> None:
    try:
        import torch_fidelity  # noqa: F401 — only whether it imports matters here

        pytest.skip("torch-fidelity imports here: this checks the message where it does not")
    except Exception:
        pass
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes(b"not read before the import fails")
    with pytest.raises(
        PalominoError, match=r"needs torch-fidelity.*pip install 'palomino\[vision\]'.*--extractor classifier"
    ):
        build_extractor("inception", inception_weights=weights)


def test_classifier_extractor_without_a_file_says_which_command_makes_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PALOMINO_CLASSIFIER", raising=False)
    with pytest.raises(
        ConfigError, match=r"--classifier FILE \(or set PALOMINO_CLASSIFIER\).*palomino classifier train --data mnist"
    ):
        build_extractor("classifier")


# --- toy runs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toy")
    config = write_yaml(folder / "ring.yaml", tiny(grid={"rows": 1, "cols": 2}))
    done = palomino("train", config, "--out", folder / "runs", cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(last_line(done.stdout))


def test_palomino_score_on_a_toy_run_reports_modes_for_every_mixture_in_parallel(toy_run: Path) -> None:
    done = palomino("score", toy_run, "--metrics", "modes,fid", "--workers", "2", cwd=toy_run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert last_line(done.stdout) == str(toy_run / "scores.json")
    assert "modes" in done.stdout and "n/a" in done.stdout  # the table; FID does not apply to points
    report = json.loads((toy_run / "scores.json").read_text())
    assert set(report["cells"]) == {"0-0", "0-1"} and report["workers"] == 2
    assert report["best"]["cell"] == "grid"  # the result: the whole grid's ensemble
    best = report["best"]
    assert best["metrics"]["fid"] == {
        "value": None,
        "not_applicable": "fid scores images; gaussian_ring is 2-D points (use modes)",
    }
    modes = best["metrics"]["modes"]
    assert best["n"] == 2500 and modes["modes"] == 8 and modes["value"] == sum(c >= 20 for c in modes["counts"])
    assert sum(modes["counts"]) == round(modes["high_quality"] * 2500)

    # The same numbers in this process, from the mixture itself: the parallel workers changed nothing.
    mixture = Mixture.load(toy_run / "result")
    again = score_mixture(
        mixture, DataConfig(name="gaussian_ring", size=500), ScoringOptions(metrics=["modes"]), data_seed=7
    )
    assert again["metrics"]["modes"] == modes
    cell = Mixture.load(toy_run / "result" / "cells" / "0-1")
    assert score_mixture(cell, DataConfig(name="gaussian_ring"), ScoringOptions(metrics=["modes"]), data_seed=7)[
        "metrics"
    ] == {"modes": report["cells"]["0-1"]["metrics"]["modes"]}


def test_mode_coverage_of_the_real_toy_data_is_complete() -> None:
    ring = load_dataset(DataConfig(name="gaussian_ring", size=2500), seed=0)
    coverage = mode_coverage(ring.samples, ring.modes, ring.mode_std)
    # A 2-D Gaussian puts 1 − e^(−9/2) ≈ 98.9 % of its mass within 3σ of its centre.
    assert coverage.covered == 8 and coverage.high_quality == pytest.approx(1 - math.exp(-4.5), abs=0.005)


def test_palomino_score_rejects_bad_flags_and_unfinished_runs(toy_run: Path, tmp_path: Path) -> None:
    bad = palomino("score", toy_run, "--metrics", "fid,precision", cwd=tmp_path)
    assert bad.returncode == 2 and "--metrics 'fid,precision': unknown metric precision" in bad.stderr
    with pytest.raises(ConfigError, match="not a run directory"):
        score_run(tmp_path, ScoringOptions())
    (tmp_path / "config.yaml").write_text((toy_run / "config.yaml").read_text())
    with pytest.raises(PalominoError, match="no result/mixture.json; did the run finish?"):
        score_run(tmp_path, ScoringOptions())


def test_scoring_section_of_the_experiment_is_validated(tmp_path: Path) -> None:
    from palomino.config import parse_config

    config = parse_config(tiny(scoring={"metrics": ["fid", "tvd"], "samples": 5000, "every": 10}))
    assert config.scoring.metrics == ["fid", "tvd"] and config.scoring.every == 10
    options = ScoringOptions.build(config.scoring, samples=100)
    assert options.metrics == ["fid", "tvd"] and options.samples == 100 and options.extractor == "classifier"
    with pytest.raises(ConfigError, match=r"scoring\.metrics\.0"):
        parse_config(tiny(scoring={"metrics": ["fdi"]}))
    config_file = write_yaml(tmp_path / "bad.yaml", tiny(scoring={"samples": 1}))
    done = palomino("train", config_file, "--out", tmp_path, cwd=tmp_path)
    assert done.returncode == 2 and "scoring.samples" in done.stderr


# --- MNIST, with a classifier trained here -----------------------------------------------------------


@pytest.fixture(scope="module")
def mnist(mnist_dir: Path) -> DataConfig:
    return DataConfig(name="mnist", dir=mnist_dir, split="test")


@pytest.mark.slow
def test_the_classifier_trains_on_the_mnist_test_split_and_beats_95_percent(mnist_classifier: Path) -> None:
    meta = json.loads(mnist_classifier.with_suffix(".json").read_text())
    assert meta["accuracy"] > 0.95, meta
    assert meta["dataset"] == "mnist" and meta["image_shape"] == [1, 28, 28] and len(meta["classes"]) == 10
    assert meta["train_size"] == 4000 and meta["test_size"] == 1000 and meta["epochs"] == 4
    assert meta["split"] == "only the test split is here: 8000 of its images for training, 2000 for testing"


@pytest.mark.slow
def test_real_mnist_scores_well_against_itself_through_the_classifier(
    mnist_classifier: Path, mnist: DataConfig, tmp_path: Path
) -> None:
    options = ScoringOptions(classifier=mnist_classifier, cache_dir=tmp_path, real_samples=4000, samples=2000)
    context = ScoringContext.prepare(mnist, options)
    assert context.real is not None and context.real.n == 4000 and context.real.class_source == "labels"
    assert not context.real.cached and context.real.path is not None and context.real.path.is_file()

    dataset = load_dataset(mnist)
    with_labels = dataset.to_data_space(dataset.samples)
    from palomino.scoring.metrics import build_metrics, update_metrics

    def scores_of(images: torch.Tensor) -> dict:
        metrics = build_metrics(["fid", "is", "tvd"], context.extractor, context.real, samples=len(images))
        for batch in images.split(500):
            update_metrics(metrics, batch)
        return compute_metrics(metrics, seed=0)

    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))
    same = scores_of(with_labels[order[:4000]])  # the reference set itself (the first 4,000 of the same seeded shuffle)
    held_out = scores_of(with_labels[order[-2000:]])  # other real digits
    ones = scores_of(with_labels[dataset.labels == 1][:1000])  # one class only: mode collapse
    noise = scores_of(torch.rand(1000, 1, 28, 28, generator=torch.Generator().manual_seed(0)))
    assert abs(same["fid"]["value"]) < 1e-2
    assert same["tvd"]["value"] < 0.03 and held_out["tvd"]["value"] < 0.05  # balanced: the classifier errs little
    assert held_out["fid"]["value"] < ones["fid"]["value"] and held_out["fid"]["value"] < noise["fid"]["value"]
    share_of_ones = float((dataset.labels == 1).double().mean())
    assert ones["tvd"]["value"] == pytest.approx(1 - share_of_ones, abs=0.02)  # all ones: TVD = 1 − p(1)
    assert ones["is"]["value"] < 1.5 and held_out["is"]["value"] > 8  # one class vs ten, confidently

    # The second time the real statistics come from the cache, identical.
    again = ScoringContext.prepare(mnist, options)
    assert again.real.cached and torch.equal(again.real.features, context.real.features)
    # A corrupt cache file is recomputed, not trusted.
    context.real.path.write_bytes(b"garbage")
    third = ScoringContext.prepare(mnist, options)
    assert not third.real.cached and torch.allclose(third.real.features, context.real.features)


@pytest.mark.slow
def test_palomino_score_on_an_mnist_run(mnist_classifier: Path, mnist_dir: Path, tmp_path: Path) -> None:
    config = write_yaml(
        tmp_path / "mnist.yaml",
        tiny(
            name="mnist-tiny",
            grid={"rows": 1, "cols": 2},
            training={"iterations": 2, "batches_per_iteration": 5, "checkpoint_every": 0, "sample_every": 0},
            data={"name": "mnist", "dir": str(mnist_dir), "split": "test", "size": 1000},
            network={"name": "mlp", "hidden": 32, "latent_dim": 8},
        ),
    )
    trained = palomino("train", config, "--out", tmp_path / "runs", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = Path(last_line(trained.stdout))

    missing = palomino("score", run, "--samples", "300", cwd=tmp_path)
    assert missing.returncode == 2
    assert f"palomino classifier train --data mnist --data-dir {mnist_dir} --out FILE.safetensors" in missing.stderr

    cache = tmp_path / "cache"
    args = (
        "score",
        run,
        "--classifier",
        mnist_classifier,
        "--samples",
        "300",
        "--real-samples",
        "1000",
        "--cache-dir",
        cache,
    )
    done = palomino(*args, "--workers", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FID" in done.stdout and "TVD" in done.stdout and "best (" in done.stdout
    report = json.loads((run / "scores.json").read_text())
    assert report["metrics"] == ["fid", "is", "kid", "tvd", "memorization"] and report["samples"] == 300
    assert report["reference"]["n"] == 1000 and report["reference"]["class_source"] == "labels"
    assert len(list((cache / "real-statistics").glob("*.safetensors"))) == 1
    for scores in [report["best"], *report["cells"].values()]:
        metrics = scores["metrics"]
        assert metrics["fid"]["value"] > 1.0  # two iterations of a tiny GAN are far from real digits
        assert 1.0 <= metrics["is"]["value"] <= 10.0 and metrics["is"]["std"] >= 0
        assert 0.0 <= metrics["tvd"]["value"] <= 1.0 and math.isfinite(metrics["kid"]["value"])
        assert scores["extractor"].startswith("classifier-") and scores["n"] == 300
        memorization = metrics["memorization"]  # against the run's 1,000 digits, calibrated by others of t10k
        assert memorization["training_images"] == 1000 and memorization["samples"] == 300 and memorization["value"] > 0

    # Serially, in this process, the same numbers: workers and sharing the extractor's pass change nothing.
    serial = palomino(*args, "--workers", "1", cwd=tmp_path)
    assert serial.returncode == 0, serial.stderr[-3000:]
    again = json.loads((run / "scores.json").read_text())
    assert {k: v["metrics"] for k, v in again["cells"].items()} == {k: v["metrics"] for k, v in report["cells"].items()}
    assert again["best"]["metrics"] == report["best"]["metrics"] and again["workers"] == 1
