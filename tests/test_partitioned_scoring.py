"""Scoring a class-partitioned run: the class mixture against all of the run's classes (with the TVD
of its class distribution), each class's best mixture and each cell against its own class's data
only, real statistics cached per class, and the same for a single mixture of one class (what the
scorer service gets from a partitioned distributed run).

The MNIST tests use MNIST's test split (the `mnist_dir` fixture), three of its classes, and the
session's classifier (the `mnist_classifier` fixture, trained at reduced size in seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import last_line, palomino, tiny, write_yaml
from safetensors.torch import load_file
from torch import nn

from palomino.config import load_config
from palomino.data import class_counts, load_dataset
from palomino.errors import DatasetError, PalominoError
from palomino.runs import Mixture
from palomino.scoring import ClassDraws, ScoringContext, ScoringOptions, mixture_class, score_mixture, score_run
from palomino.scoring.metrics import build_metrics, compute_metrics
from palomino.scoring.tvd import ClassHitRate

CLASSES = [0, 1, 7]


def features_in(width: int) -> nn.Module:
    module = nn.Identity()
    module.num_features = width
    return module


def test_hit_rate_is_the_share_classified_as_the_class() -> None:
    hit = ClassHitRate(features_in(10), label=3)
    hit.update(torch.nn.functional.one_hot(torch.tensor([3, 3, 3, 1, 7, 3, 3, 0]), 10).float())
    hit.update(torch.nn.functional.one_hot(torch.tensor([3, 2]), 10).float())
    assert compute_metrics({"hit": hit}, seed=0)["hit"] == {"value": pytest.approx(0.6)}
    with pytest.raises(ValueError, match="needs the label"):
        build_metrics(["hit"], None, None, samples=10)  # type: ignore[arg-type]


# --- the toys: no extractor, mode coverage class by class -------------------------------------------


class Points:
    """A stand-in mixture of 2-D points: `centre` plus a little noise, optionally of one class."""

    kind, sample_shape = "points", (2,)

    def __init__(self, centre: torch.Tensor, label: int | None) -> None:
        self.centre = centre
        self.info = {} if label is None else {"class": label}

    def sample(self, n: int, seed: int = 0) -> torch.Tensor:
        return self.centre + 0.01 * torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))


def partitioned_toy() -> dict:
    raw = tiny(name="ptoy", data={"name": "gaussian_ring", "size": 800, "partition": "labels", "classes": [0, 3, 5]})
    raw["grid"] = {"per_class": "1x2"}
    return raw


def test_a_partitioned_toy_run_is_scored_class_by_class(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "ptoy.yaml", partitioned_toy())
    trained = palomino("train", config, "--out", tmp_path / "runs", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = Path(last_line(trained.stdout))

    # A distributed run's scores.json holds its scorers' periodic scores: `palomino score` keeps them.
    periodic = {"0-1@2": {"iteration": 2, "scorer": "s", "metrics": {}}}
    (run / "scores.json").write_text(json.dumps({"run": run.name, "cells": {"0-1": {}}, "periodic": periodic}))
    done = palomino("score", run, "--samples", "500", "--workers", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "class mixture" in done.stdout and "class 3 (1-" in done.stdout and "1-0 (class 3)" in done.stdout
    report = json.loads((run / "scores.json").read_text())
    assert report["periodic"] == periodic
    assert report["best"]["cell"] is None and report["best"]["metrics"]["modes"]["modes"] == 8  # all the ring's modes
    assert "class" not in report["best"] and "class_references" not in report  # no extractor, no real features
    assert set(report["classes"]) == {"0", "3", "5"} and report["class_metrics"] == ["modes"]
    description = json.loads((run / "result" / "mixture.json").read_text())
    for label, entry in report["classes"].items():
        assert entry["class"] == int(label) and entry["mixture"] == f"result/classes/{label}"
        assert entry["cell"] == description["classes"][label]["cell"]
        assert entry["metrics"]["modes"]["modes"] == 1  # its own mode only
        assert entry["metrics"] == report["cells"][entry["cell"]]["metrics"]  # the same mixture as its cell's
    assert {name: cell["class"] for name, cell in report["cells"].items()} == {
        f"{row}-{col}": label for row, label in enumerate([0, 3, 5]) for col in range(2)
    }

    # One mixture of one class: against that class's mode alone, wherever it is scored.
    data = load_config(run / "config.yaml").data
    ring = load_dataset(data, 7)
    on_mode_3 = score_mixture(Points(ring.modes[3], 3), data, ScoringOptions(samples=200), data_seed=7)
    assert on_mode_3["class"] == 3
    assert on_mode_3["metrics"]["modes"] == {
        "value": 1,
        "modes_covered": 1,
        "modes": 1,
        "high_quality": 1.0,
        "counts": [200],
    }
    # The same points as a mixture of class 5: off its class's mode, none of them counts.
    on_mode_3_said_5 = score_mixture(Points(ring.modes[3], 5), data, ScoringOptions(samples=200), data_seed=7)
    assert (
        on_mode_3_said_5["metrics"]["modes"]["value"] == 0 and on_mode_3_said_5["metrics"]["modes"]["high_quality"] == 0
    )
    # Without a class: against all 8 modes, as before.
    unlabelled = score_mixture(Points(ring.modes[3], None), data, ScoringOptions(samples=200), data_seed=7)
    assert "class" not in unlabelled and unlabelled["metrics"]["modes"]["modes"] == 8
    with pytest.raises(DatasetError, match="scoring a mixture of class 4 .*class 4 has no samples"):
        score_mixture(Points(ring.modes[4], 4), data, ScoringOptions(samples=200))

    cell = Mixture.load(run / "result" / "cells" / "2-1")
    assert mixture_class(cell) == 5
    with pytest.raises(PalominoError, match="unconditional mixture cannot be drawn"):
        ClassDraws(cell, 5)


# --- MNIST: FID / KID / TVD / hit against each class's own digits -----------------------------------


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory: pytest.TempPathFactory, mnist_dir: Path, mnist_classifier: Path) -> tuple[Path, Path]:
    """(a finished 3-class partitioned MNIST run made here in seconds, the session's MNIST classifier)."""
    folder = tmp_path_factory.mktemp("partitioned-scoring")
    raw = tiny(
        name="pmnist",
        training={"iterations": 2, "batches_per_iteration": 5, "checkpoint_every": 0, "sample_every": 0},
        data={
            "name": "mnist",
            "dir": str(mnist_dir),
            "split": "test",
            "size": 0,
            "partition": "labels",
            "classes": CLASSES,
        },
        network={"name": "mlp", "hidden": 32, "latent_dim": 8},
    )
    raw["grid"] = {"per_class": "1x2"}
    done = palomino("train", write_yaml(folder / "pmnist.yaml", raw), "--out", folder / "runs", cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(last_line(done.stdout)), mnist_classifier


def test_palomino_score_scores_each_class_against_its_own_digits(mnist_run: tuple[Path, Path], tmp_path: Path) -> None:
    run, classifier = mnist_run
    cache = tmp_path / "cache"
    args = ("score", run, "--classifier", classifier, "--samples", "300", "--cache-dir", cache)
    done = palomino(*args, "--workers", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert last_line(done.stdout) == str(run / "scores.json")
    for row in (
        "class mixture",
        "class 0 (0-",
        "class 1 (1-",
        "class 7 (2-",
        "2-1 (class 7)",
        "hit ↑",
        "one class's samples",
    ):
        assert row in done.stdout, row
    report = json.loads((run / "scores.json").read_text())
    data = load_config(run / "config.yaml").data
    counts = class_counts(load_dataset(data))
    assert counts == {0: 980, 1: 1135, 7: 1028}  # the t10k split's

    # The class mixture: all three classes' digits, and the TVD of its class distribution from theirs.
    best = report["best"]
    assert best["cell"] is None and "class" not in best and "hit" not in best["metrics"]
    assert report["reference"]["n"] == sum(counts.values()) and report["reference"]["class_source"] == "labels"
    assert 0.0 <= best["metrics"]["tvd"]["value"] <= 1.0 and best["metrics"]["is"]["value"] >= 1.0
    whole = load_file(report["reference"]["path"])["class_distribution"]
    assert whole.tolist() == pytest.approx([counts.get(c, 0) / sum(counts.values()) for c in range(10)])

    # Each class: against its own digits only, with statistics of their own in the cache.
    assert report["class_metrics"] == ["fid", "is", "kid", "tvd", "memorization", "hit"]
    cached = sorted(p.name for p in (cache / "real-statistics").glob("*.safetensors"))
    assert len(cached) == 4 and [sum(f"-class{c}-{counts[c]}-" in name for name in cached) for c in CLASSES] == [
        1,
        1,
        1,
    ]
    description = json.loads((run / "result" / "mixture.json").read_text())
    for c in CLASSES:
        reference = report["class_references"][str(c)]
        assert reference["n"] == counts[c] and reference["class_source"] == "labels"
        assert load_file(reference["path"])["class_distribution"].tolist() == [float(k == c) for k in range(10)]
        entry = report["classes"][str(c)]
        assert entry["class"] == c and entry["cell"] == description["classes"][str(c)]["cell"]
        assert entry["reference"]["class"] == c and entry["reference"]["n"] == counts[c]
        assert Path(reference["path"]).stem == entry["reference"]["key"]
        assert entry["metrics"] == report["cells"][entry["cell"]]["metrics"]  # the same mixture as its cell's
    for name, cell in report["cells"].items():
        c = CLASSES[int(name.split("-")[0])]
        metrics = cell["metrics"]
        assert cell["class"] == c and cell["reference"]["class"] == c and cell["reference"]["n"] == counts[c]
        assert metrics["is"]["value"] is None and "one class" in metrics["is"]["not_applicable"]
        assert metrics["fid"]["value"] > 0 and metrics["kid"]["value"] is not None
        # Against class c alone (one-hot), the TVD is the share not classified as c.
        assert metrics["tvd"]["value"] == pytest.approx(1 - metrics["hit"]["value"])

    # Serially, in this process, from the filled cache: the same numbers.
    serial = score_run(run, ScoringOptions(classifier=classifier, samples=300, cache_dir=cache), workers=1)
    assert serial["workers"] == 1 and metrics_of(serial) == metrics_of(report)
    # What the scorer service does with a cell's final (or periodic) job: the same, against the cell's class.
    from palomino.services.scorer.scorer import score_job
    from palomino.wire.score_messages import ScoreJob

    folder = run / "result" / "cells" / "1-0"
    job = ScoreJob(
        job="t:1-0", experiment="pmnist", target="1-0", mixture=json.loads((folder / "mixture.json").read_text()),
        data=data.model_dump(mode="json"), options={"classifier": str(classifier), "samples": 300, "cache_dir": str(cache)},
    )  # fmt: skip
    scored, ensemble, png = score_job(job, (folder / "mixture.safetensors").read_bytes())
    assert ensemble is None and png is None  # no ensemble asked for
    assert scored["class"] == 1 and scored["reference"] == report["cells"]["1-0"]["reference"]
    assert scored["metrics"] == report["cells"]["1-0"]["metrics"]


def metrics_of(report: dict) -> dict:
    return {
        "best": report["best"]["metrics"],
        **{f"class {c}": entry["metrics"] for c, entry in report["classes"].items()},
        **{cell: entry["metrics"] for cell, entry in report["cells"].items()},
    }


class RealDigits:
    """A 'generator' that draws real digits of the run's data: a perfect class-c mixture (`label`),
    or one that says nothing of its class."""

    kind, sample_shape = "image", (1, 28, 28)

    def __init__(self, images: torch.Tensor, label: int | None) -> None:
        self.images = images
        self.info = {} if label is None else {"class": label}

    def sample(self, n: int, seed: int = 0) -> torch.Tensor:
        return self.images[torch.randint(len(self.images), (n,), generator=torch.Generator().manual_seed(seed))]


def test_a_perfect_class_generator_scores_well_only_against_its_class(
    mnist_run: tuple[Path, Path], tmp_path: Path
) -> None:
    run, classifier = mnist_run
    data = load_config(run / "config.yaml").data
    dataset = load_dataset(data)
    digits = dataset.to_data_space(dataset.samples)
    sevens = digits[dataset.labels == 7]
    options = ScoringOptions(classifier=classifier, samples=500, cache_dir=tmp_path, metrics=["fid", "is", "tvd"])

    as_seven = score_mixture(RealDigits(sevens, 7), data, options)
    everything = ScoringContext.prepare(data, options)
    assert everything.real is not None and everything.real.n == len(dataset)
    sevens_against_all = everything.score(RealDigits(sevens, None))  # the same digits, no class said
    all_against_all = everything.score(RealDigits(digits, None))

    assert as_seven["class"] == 7 and as_seven["reference"]["n"] == int((dataset.labels == 7).sum())
    assert as_seven["metrics"]["hit"]["value"] > 0.8 and as_seven["metrics"]["tvd"]["value"] < 0.2
    assert as_seven["metrics"]["is"]["value"] is None
    # Against its own class a perfect generator of 7s is as good as real digits against all; against all it is not.
    assert as_seven["metrics"]["fid"]["value"] < 0.5 * sevens_against_all["metrics"]["fid"]["value"]
    assert all_against_all["metrics"]["fid"]["value"] < 0.5 * sevens_against_all["metrics"]["fid"]["value"]
    # The class distribution: balanced as the data ≈ 0; only 7s = 1 − p(7) (up to the classifier's errors).
    p7 = float((dataset.labels == 7).double().mean())
    assert all_against_all["metrics"]["tvd"]["value"] < 0.1
    assert sevens_against_all["metrics"]["tvd"]["value"] == pytest.approx(1 - p7, abs=0.1)
    # The context asked for class 7 again comes back from memory; another class's mixture is not scored against 7's.
    assert everything.for_class(7) is everything.for_class(7)
    with pytest.raises(PalominoError, match="class 1 cannot be scored against class 7"):
        everything.for_class(7).for_class(1)
