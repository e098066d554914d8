"""Scoring mixtures offline: one mixture (`score_mixture`, what the scorer service runs per job) or a
finished run's best mixture and every cell's neighbourhood mixture in parallel processes (`score_run`,
what `palomino score` runs), away from the cells' training loop as in Lipizzaner's thesis.

A mixture of one class (a partitioned run's cell or class component: its mixture.json has "class";
a conditional mixture drawn for one label, `ClassDraws`) is scored against that class's real data
only; the class mixture of a partitioned run against all of the run's classes.

`memorization` needs no extractor: pixels of the first MEMORIZATION_SAMPLES generated images against
the run's training images, calibrated by up to as many real images it never trained on (held_out.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from palomino.config import DataConfig
from palomino.data import Dataset, class_subset, load_dataset
from palomino.errors import ConfigError, DatasetError, PalominoError
from palomino.io import atomic_write
from palomino.runs.directory import RunDirectory, finite_json
from palomino.runs.mixture import ClassMixture, Mixture
from palomino.runs.result import CLASS_MIXTURE
from palomino.scoring.extractors import FeatureExtractor, build_extractor, scoring_cache_dir
from palomino.scoring.held_out import HeldOut, held_out_images
from palomino.scoring.memorization import MemorizationScale
from palomino.scoring.metrics import IMAGE_METRICS, build_metrics, compute_metrics, update_metrics
from palomino.scoring.modes import mode_coverage
from palomino.scoring.options import ScoringOptions
from palomino.scoring.real_statistics import RealStatistics, reference_statistics

log = logging.getLogger(__name__)
FORMAT = 1
MEMORIZATION_SAMPLES = 2000  # generated images per memorization ratio: as many as the held-out images


def _train_command(data: DataConfig, extractor: str = "classifier") -> str:
    where = f" --data-dir {data.dir}" if data.dir else ""
    arch = " --arch lipizzaner" if extractor == "lipizzaner" else ""
    return f"palomino classifier train{arch} --data {data.name}{where} --out FILE.safetensors"


def mixture_class(mixture: Any) -> int | None:
    """The one class a mixture generates ("class" in its mixture.json), else None (all of the run's classes)."""
    return _class_in(getattr(mixture, "info", None))


def _class_in(description: Any) -> int | None:
    label = description.get("class") if isinstance(description, dict) else None
    return None if label is None else int(label)


class ClassDraws:
    """A conditional mixture (a CGAN's, or a partitioned run's class mixture) drawing one label only:
    what ScoringContext.score needs (kind, sample_shape, sample), carrying "class" like a class's own mixture."""

    def __init__(self, mixture: Mixture | ClassMixture, label: int) -> None:
        if not mixture.conditional:
            raise PalominoError("an unconditional mixture cannot be drawn for one class")
        if label not in mixture.classes:
            raise PalominoError(f"class {label} was not trained in this run; its classes are {mixture.classes}")
        self.mixture, self.label = mixture, int(label)
        self.info = {"class": self.label}

    @property
    def kind(self) -> str:
        return self.mixture.kind

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.mixture.sample_shape)

    def sample(self, n: int, seed: int = 0) -> torch.Tensor:
        return self.mixture.sample(n, seed=seed, labels=[self.label] * n)


def class_dataset(dataset: Dataset, label: int) -> Dataset:
    """One class's real samples (what a partitioned cell of that class trains on); on the toys, only
    its own mode's centre is left, so mode coverage reads 0 or 1 of 1 mode."""
    try:
        subset = class_subset(dataset, label)
    except DatasetError as error:
        raise DatasetError(f"scoring a mixture of class {label} against its class's data: {error}") from None
    if subset.modes is not None and label < len(subset.modes):
        subset = replace(subset, modes=subset.modes[label : label + 1])
    return subset


@dataclass
class ScoringContext:
    """What scoring any number of mixtures of one dataset shares: the data, the extractor, the real statistics.

    `label`: this context scores against that class's samples only (see `for_class`)."""

    data: DataConfig
    options: ScoringOptions
    dataset: Dataset
    metrics: list[str]
    samples: int
    extractor: FeatureExtractor | None = None
    real: RealStatistics | None = None
    label: int | None = None
    held_out: HeldOut | None = None  # real images never trained on: `memorization` is calibrated by them
    no_held_out: str = ""  # why there are none
    _memorization_scale: MemorizationScale | None = field(default=None, repr=False)
    _per_class: dict[int, ScoringContext] = field(default_factory=dict, repr=False)

    @classmethod
    def prepare(
        cls, data: DataConfig, options: ScoringOptions, *, data_seed: int = 0, label: int | None = None
    ) -> ScoringContext:
        """Load the data, the extractor (only when an image metric needs it) and the real statistics (cached);
        with `label`, of that class's samples only (the whole data's statistics are then not computed)."""
        dataset = load_dataset(data, data_seed)
        metrics = options.metrics_for(dataset.kind)
        context = cls(data, options, dataset, metrics, options.samples_for(dataset.kind))
        if dataset.kind == "image" and any(m in IMAGE_METRICS for m in metrics):
            try:
                context.extractor = build_extractor(
                    options.extractor,
                    classifier=options.classifier,
                    inception_weights=options.inception_weights,
                    device=options.device,
                    cache_dir=options.cache_dir,
                )
            except ConfigError as error:
                if options.extractor != "inception":  # say exactly which command makes the missing file
                    raise ConfigError(
                        f"{error}. For this run's data: {_train_command(data, options.extractor)}"
                    ) from None
                raise
            trained_on = context.extractor.dataset
            if trained_on is not None and trained_on != dataset.name:
                raise ConfigError(
                    f"--classifier: {options.classifier or 'the classifier'} was trained on {trained_on}, "
                    f"but the data is {dataset.name}; train one for it: {_train_command(data, options.extractor)}"
                )
        if dataset.kind == "image" and "memorization" in metrics:
            context.held_out, context.no_held_out = held_out_images(data, dataset, seed=options.seed)
        if label is not None:
            context = context._class_context(label)
        context._load_reference()
        return context

    def _class_context(self, label: int) -> ScoringContext:
        held_out = self.held_out.for_class(label) if self.held_out is not None else None
        return ScoringContext(
            self.data, self.options, class_dataset(self.dataset, label), self.metrics, self.samples, self.extractor,
            label=int(label), held_out=held_out,
            no_held_out=self.no_held_out or ("" if held_out else f"no held-out images of class {label}"),
        )  # fmt: skip

    def _load_reference(self) -> None:
        if self.extractor is None:
            return
        self.real = reference_statistics(
            self.dataset,
            self.data.split,
            self.extractor,
            samples=self.options.real_samples,
            batch_size=self.options.batch_size,
            cache_dir=scoring_cache_dir(self.options.cache_dir),
            device=self.options.device,
            label=self.label,
        )

    def for_class(self, label: int) -> ScoringContext:
        """The context of class `label`'s real samples (the same extractor; its own real statistics, cached
        under a key naming the class); made once per class."""
        label = int(label)
        if self.label is not None:
            if label == self.label:
                return self
            raise PalominoError(f"a mixture of class {label} cannot be scored against class {self.label}'s data")
        if label not in self._per_class:
            context = self._class_context(label)
            context._load_reference()
            self._per_class[label] = context
        return self._per_class[label]

    @property
    def class_metrics(self) -> list[str]:
        """What a one-class score reports: the metrics asked for, then `hit` where an extractor classifies images."""
        return [*self.metrics, "hit"] if self.extractor is not None else list(self.metrics)

    def _not_applicable(self, name: str) -> str | None:
        if name in IMAGE_METRICS and self.dataset.kind != "image":
            return f"{name} scores images; {self.dataset.name} is 2-D points (use modes)"
        if name == "modes" and self.dataset.modes is None:
            return f"modes needs known mode centres (gaussian_ring, gaussian_grid); {self.dataset.name} has none"
        if name == "memorization" and self.dataset.kind != "image":
            return f"memorization compares images; {self.dataset.name} is 2-D points"
        if name == "memorization" and self.held_out is None:
            return f"memorization needs real images the run never trained on: {self.no_held_out}"
        if name == "is" and self.label is not None:
            return "is rewards confident predictions spread over many classes; one class's samples have one: see hit"
        if name == "hit":
            assert self.extractor is not None and self.label is not None
            if self.extractor.dataset != self.dataset.name or self.label >= len(self.extractor.classes):
                return (
                    f"hit needs a classifier trained on {self.dataset.name}: "
                    f"the {self.extractor.name} extractor's classes are not its labels"
                )
        return None

    def _memorization(self, samples: torch.Tensor) -> dict[str, Any]:
        """The memorization ratio of `samples` (data space, [0, 1]) in generator space, as the training images are."""
        assert self.held_out is not None
        if self._memorization_scale is None:  # once per context: the held-out images do not change
            self._memorization_scale = MemorizationScale.calibrate(self.dataset.samples, self.held_out.images)
        result = self._memorization_scale.of(samples * 2 - 1)
        return {**result.as_dict(), "held_out_source": self.held_out.source}

    def _chunks(self) -> list[tuple[int, int]]:
        """(seed, size) of each sampling batch: seeded from options.seed, so scores are reproducible."""
        sizes = [
            min(self.options.batch_size, self.samples - start)
            for start in range(0, self.samples, self.options.batch_size)
        ]
        seeds = torch.randint(2**62, (len(sizes),), generator=torch.Generator().manual_seed(self.options.seed)).tolist()
        return list(zip(seeds, sizes))

    def score(self, mixture: Mixture | ClassMixture | ClassDraws) -> dict[str, Any]:
        """Every requested metric of `mixture`: {"metrics": {name: {"value", ...}}, "n", "extractor", "seconds", ...}.

        A metric that does not apply to this data is reported with value None and `not_applicable` (why).
        A mixture of one class (`mixture_class`) is scored against that class's samples (`for_class`):
        its result also has "class", `is` is not applicable, and `hit` (the share classified as the class)
        is added."""
        label = mixture_class(mixture)
        if label is not None and label != self.label:
            return self.for_class(label).score(mixture)
        start = time.perf_counter()
        if mixture.kind != self.dataset.kind or tuple(mixture.sample_shape) != self.dataset.sample_shape:
            raise PalominoError(
                f"the mixture makes {mixture.kind} samples of shape {tuple(mixture.sample_shape)}, but {self.dataset.name} "
                f"holds {self.dataset.kind} samples of shape {self.dataset.sample_shape}: score it against its own run's data"
            )
        names = self.class_metrics if self.label is not None else self.metrics
        results: dict[str, dict[str, Any]] = {}
        applicable = []
        for name in names:
            why = self._not_applicable(name)
            if why:
                results[name] = {"value": None, "not_applicable": why}
            else:
                applicable.append(name)
        image_metrics = [m for m in applicable if m in IMAGE_METRICS or m == "hit"]
        if image_metrics or "memorization" in applicable:
            metrics = None
            if image_metrics:
                assert self.extractor is not None and self.real is not None
                metrics = build_metrics(
                    image_metrics,
                    self.extractor,
                    self.real,
                    samples=self.samples,
                    is_splits=self.options.is_splits,
                    label=self.label,
                )
            kept: list[torch.Tensor] = []  # the first MEMORIZATION_SAMPLES, for memorization
            for seed, size in self._chunks():  # generators sample on the CPU; the extractor runs on options.device
                if metrics is None and sum(map(len, kept)) >= MEMORIZATION_SAMPLES:
                    break
                images = mixture.sample(size, seed=seed)
                if "memorization" in applicable and sum(map(len, kept)) < MEMORIZATION_SAMPLES:
                    kept.append(images)
                if metrics is not None:
                    update_metrics(metrics, images.to(self.options.device))
            if metrics is not None:
                results.update(compute_metrics(metrics, self.options.seed))
            if "memorization" in applicable:
                results["memorization"] = self._memorization(torch.cat(kept)[:MEMORIZATION_SAMPLES])
        if "modes" in applicable:
            points = torch.cat([mixture.sample(size, seed=seed) for seed, size in self._chunks()])
            coverage = mode_coverage(points, self.dataset.modes, self.dataset.mode_std)
            results["modes"] = {"value": coverage.covered, **coverage.as_dict()}
        out: dict[str, Any] = {} if self.label is None else {"class": self.label}
        out.update(
            {
                "metrics": {name: results[name] for name in names},
                "n": self.samples,
                "extractor": self.extractor.identity if self.extractor is not None else None,
            }
        )
        if self.real is not None:
            out["reference"] = {"n": self.real.n, "class_source": self.real.class_source, "key": self.real.key}
            if self.label is not None:
                out["reference"]["class"] = self.label
        out["seconds"] = round(time.perf_counter() - start, 3)
        return out


def score_mixture(
    mixture: Mixture | ClassMixture | ClassDraws, data: DataConfig, options: ScoringOptions, *, data_seed: int = 0
) -> dict[str, Any]:
    """Score one mixture against `data` (what a score job carries). See ScoringContext.score for the result.

    A mixture of one class ("class" in its mixture.json: a partitioned run's cell, periodic or final) is
    scored against that class's samples of `data` only."""
    label = mixture_class(mixture)
    return ScoringContext.prepare(data, options, data_seed=data_seed, label=label).score(mixture)


def _digest(folder: Path) -> str:
    """What makes two folders the same mixture (the best is also saved as its cell's); a class mixture,
    whose parts live in subfolders, is only ever itself."""
    if not (folder / "mixture.safetensors").is_file():
        return f"folder:{folder}"
    digest = hashlib.sha256()
    for name in ("mixture.safetensors", "mixture.json"):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()


def run_mixtures(run_dir: Path) -> dict[str, Path]:
    """{"best": result/, "<r>-<c>": result/cells/<r>-<c>/, ...} of a finished run."""
    run = RunDirectory(run_dir)
    result = run.result_dir
    if not run.is_run():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml in it)")
    if not (result / "mixture.json").is_file():
        raise PalominoError(
            f"{run_dir}: no result/mixture.json; did the run finish? (continue it with palomino train --resume {run_dir})"
        )
    cells = sorted(p for p in (result / "cells").glob("*") if (p / "mixture.json").is_file())
    return {"best": result, **{p.name: p for p in cells}}


@dataclass(frozen=True)
class Target:
    """One mixture to score: the one saved in `folder`, or with `draw`, that (conditional) mixture drawn
    for the label `draw` only."""

    folder: Path
    draw: int | None = None

    def load(self) -> Mixture | ClassMixture | ClassDraws:
        mixture = Mixture.load(self.folder)
        return mixture if self.draw is None else ClassDraws(mixture, self.draw)

    def label(self) -> int | None:
        """The class it is scored against (None: all of the run's), read from mixture.json alone."""
        return self.draw if self.draw is not None else _class_in(_description(self.folder))


def _description(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "mixture.json").read_text())
    except (OSError, ValueError) as error:
        raise PalominoError(f"{folder}: no readable mixture.json ({error}); did the run finish?") from None


def run_classes(run_dir: Path) -> dict[int, tuple[Target, str | None]]:
    """label → (what to score for that class, the cell it came from) of a finished run: a partitioned
    run's result/classes/<c>/ (its class's best mixture), a conditional run's best mixture drawn for
    each label; {} for an unconditional run."""
    result = RunDirectory(run_dir).result_dir
    description = _description(result)
    if description.get("type") == CLASS_MIXTURE:
        return {
            int(label): (Target(result / entry["path"]), entry.get("cell"))
            for label, entry in sorted(description["classes"].items(), key=lambda item: int(item[0]))
        }
    if description.get("priors"):
        labels = sorted(int(label) for label in description["priors"])
        return {label: (Target(result, label), description.get("cell")) for label in labels}
    return {}


def _score_targets(
    targets: list[tuple[str, int | None]], data: dict[str, Any], options: dict[str, Any], data_seed: int
) -> list[dict[str, Any]]:
    """A worker's share, in a spawned process: one context (data, extractor, cached real statistics), then each mixture."""
    torch.set_num_threads(1)  # the workers are the parallelism; more threads each would fight over the cores
    context = ScoringContext.prepare(
        DataConfig.model_validate(data), ScoringOptions.model_validate(options), data_seed=data_seed
    )
    return [context.score(Target(Path(folder), draw).load()) for folder, draw in targets]


def score_run(
    run_dir: Path, options: ScoringOptions, workers: int | None = None, *, data: DataConfig | None = None
) -> dict[str, Any]:
    """Score the run's best mixture and every cell's neighbourhood mixture in `workers` spawned processes
    (1 torch thread each; default: one per core, at most one per mixture); writes scores.json atomically.

    A partitioned run: its class mixture (result/) against all of its classes as "best", each class's
    best mixture against that class's samples under "classes", each cell against its class's samples.
    A conditional run: also its best mixture drawn for each label, against that label's samples, under
    "classes". See docs/scoring.md for the layout."""
    start = time.perf_counter()
    run = RunDirectory(run_dir)
    folders = run_mixtures(run_dir)
    config = run.load_config()
    data = data or config.data
    classes = run_classes(run_dir)
    targets = {name: Target(folder) for name, folder in folders.items()}
    targets.update({f"class:{label}": target for label, (target, _) in classes.items()})
    # Validate, build the extractor and fill the real-statistics cache once, here, before any worker starts:
    # the whole data's and each class's that a mixture is scored against.
    context = ScoringContext.prepare(data, options, data_seed=config.seed)
    labels = sorted({label for target in targets.values() if (label := target.label()) is not None})
    per_class = {label: context.for_class(label) for label in labels}
    by_name, workers = _score_targets_once(targets, context, data, options, config.seed, workers)

    report = _report_head(run.path, data, options, context, per_class)
    report["best"] = {"cell": _description(folders["best"]).get("cell"), **by_name["best"]}
    if classes:
        report["classes"] = {
            str(label): {
                "cell": cell,
                "mixture": target.folder.relative_to(run.path).as_posix(),
                **({} if target.draw is None else {"drawn_for": target.draw}),
                **by_name[f"class:{label}"],
            }
            for label, (target, cell) in classes.items()
        }
    report["cells"] = {name: score for name, score in by_name.items() if name in folders and name != "best"}
    report["workers"] = workers
    report["seconds"] = round(time.perf_counter() - start, 2)
    periodic = _periodic(run.scores_path)
    if periodic:  # a distributed run's scores of its cells during training (scoring.every): history, kept
        report["periodic"] = periodic
    report = finite_json(report)
    atomic_write(run.scores_path, json.dumps(report, indent=2, allow_nan=False).encode())
    return report


def _score_targets_once(
    targets: dict[str, Target],
    context: ScoringContext,
    data: DataConfig,
    options: ScoringOptions,
    seed: int,
    workers: int | None,
) -> tuple[dict[str, dict[str, Any]], int]:
    """Each target's scores by name, and the workers used: targets with the same content (a cell's
    mixture that is also the best) are scored once, in `workers` spawned processes at most."""
    unique: dict[tuple[str, int | None], Target] = {}  # (content digest, label drawn) → the first target with it
    names_of: dict[tuple[str, int | None], list[str]] = {}
    for name, target in targets.items():
        key = (_digest(target.folder), target.draw)
        unique.setdefault(key, target)
        names_of.setdefault(key, []).append(name)
    jobs = [(str(t.folder), t.draw) for t in unique.values()]
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        scores = [context.score(t.load()) for t in unique.values()]
    else:
        shares = [jobs[i::workers] for i in range(workers)]
        data_json, options_json = data.model_dump(mode="json"), options.model_dump(mode="json")
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_score_targets, share, data_json, options_json, seed) for share in shares]
            by_job = {
                job: score for share, future in zip(shares, futures) for job, score in zip(share, future.result())
            }
        scores = [by_job[job] for job in jobs]
    return {name: score for key, score in zip(unique, scores) for name in names_of[key]}, workers


def _report_head(
    run_dir: Path,
    data: DataConfig,
    options: ScoringOptions,
    context: ScoringContext,
    per_class: dict[int, ScoringContext],
) -> dict[str, Any]:
    """What scores.json says about how it was scored: data, options, metrics, extractor, references."""
    report: dict[str, Any] = {
        "format": FORMAT,
        "run": run_dir.name,
        "data": {"name": data.name, "split": data.split, "size": data.size},
        "options": options.model_dump(mode="json"),
        "metrics": context.metrics,
        "samples": context.samples,
        "extractor": context.extractor.identity if context.extractor else None,
        "reference": None
        if context.real is None
        else {"n": context.real.n, "class_source": context.real.class_source, "path": str(context.real.path)},
    }
    if per_class:
        report["class_metrics"] = context.class_metrics
        if context.real is not None:
            report["class_references"] = {
                str(label): {"n": c.real.n, "class_source": c.real.class_source, "path": str(c.real.path)}
                for label, c in per_class.items()
                if c.real is not None
            }
    return report


def _periodic(path: Path) -> dict[str, Any] | None:
    """The orchestrator's "periodic" entries of an existing scores.json (None when there are none)."""
    try:
        periodic = json.loads(path.read_text()).get("periodic")
    except (OSError, ValueError, AttributeError):
        return None
    return periodic if isinstance(periodic, dict) and periodic else None
