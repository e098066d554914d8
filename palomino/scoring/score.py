"""Scoring mixtures offline: one mixture (`score_mixture`, what the scorer service runs per job) or a
finished run's best mixture and every cell's neighbourhood mixture in parallel processes (`score_run`,
what `palomino score` runs), away from the cells' training loop as in Lipizzaner's thesis.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from palomino.config import DataConfig
from palomino.data import Dataset, load_dataset
from palomino.errors import ConfigError, PalominoError
from palomino.runs.checkpoints import atomic_write
from palomino.runs.mixture import ClassMixture, Mixture
from palomino.scoring.extractors import FeatureExtractor, build_extractor, scoring_cache_dir
from palomino.scoring.metrics import IMAGE_METRICS, build_metrics, compute_metrics, update_metrics
from palomino.scoring.modes import mode_coverage
from palomino.scoring.options import ScoringOptions
from palomino.scoring.reference import RealStatistics, reference_statistics

log = logging.getLogger(__name__)
FORMAT = 1


def _train_command(data: DataConfig) -> str:
    where = f" --data-dir {data.dir}" if data.dir else ""
    return f"palomino classifier train --data {data.name}{where} --out FILE.safetensors"


@dataclass
class ScoringContext:
    """What scoring any number of mixtures of one dataset shares: the data, the extractor, the real statistics."""

    data: DataConfig
    options: ScoringOptions
    dataset: Dataset
    metrics: list[str]
    samples: int
    extractor: FeatureExtractor | None = None
    real: RealStatistics | None = None

    @classmethod
    def prepare(cls, data: DataConfig, options: ScoringOptions, *, data_seed: int = 0) -> ScoringContext:
        """Load the data, the extractor (only when an image metric needs it) and the real statistics (cached)."""
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
                if options.extractor == "classifier":  # say exactly which command makes the missing file
                    raise ConfigError(f"{error}. For this run's data: {_train_command(data)}") from None
                raise
            trained_on = context.extractor.dataset
            if trained_on is not None and trained_on != dataset.name:
                raise ConfigError(
                    f"--classifier: {options.classifier or 'the classifier'} was trained on {trained_on}, "
                    f"but the data is {dataset.name}; train one for it: {_train_command(data)}"
                )
            context.real = reference_statistics(
                dataset,
                data.split,
                context.extractor,
                samples=options.real_samples,
                batch_size=options.batch_size,
                cache_dir=scoring_cache_dir(options.cache_dir),
                device=options.device,
            )
        return context

    def _not_applicable(self, name: str) -> str | None:
        if name in IMAGE_METRICS and self.dataset.kind != "image":
            return f"{name} scores images; {self.dataset.name} is 2-D points (use modes)"
        if name == "modes" and self.dataset.modes is None:
            return f"modes needs known mode centres (gaussian_ring, gaussian_grid); {self.dataset.name} has none"
        return None

    def _chunks(self) -> list[tuple[int, int]]:
        """(seed, size) of each sampling batch: seeded from options.seed, so scores are reproducible."""
        sizes = [
            min(self.options.batch_size, self.samples - start)
            for start in range(0, self.samples, self.options.batch_size)
        ]
        seeds = torch.randint(2**62, (len(sizes),), generator=torch.Generator().manual_seed(self.options.seed)).tolist()
        return list(zip(seeds, sizes))

    def score(self, mixture: Mixture | ClassMixture) -> dict[str, Any]:
        """Every requested metric of `mixture`: {"metrics": {name: {"value", ...}}, "n", "extractor", "seconds", ...}.

        A metric that does not apply to this data is reported with value None and `not_applicable` (why)."""
        start = time.perf_counter()
        if mixture.kind != self.dataset.kind or tuple(mixture.sample_shape) != self.dataset.sample_shape:
            raise PalominoError(
                f"the mixture makes {mixture.kind} samples of shape {tuple(mixture.sample_shape)}, but {self.dataset.name} "
                f"holds {self.dataset.kind} samples of shape {self.dataset.sample_shape}: score it against its own run's data"
            )
        results: dict[str, dict[str, Any]] = {}
        applicable = []
        for name in self.metrics:
            why = self._not_applicable(name)
            if why:
                results[name] = {"value": None, "not_applicable": why}
            else:
                applicable.append(name)
        image_metrics = [m for m in applicable if m in IMAGE_METRICS]
        if image_metrics:
            assert self.extractor is not None and self.real is not None
            metrics = build_metrics(
                image_metrics, self.extractor, self.real, samples=self.samples, is_splits=self.options.is_splits
            )
            for seed, size in self._chunks():  # generators sample on the CPU; the extractor runs on options.device
                update_metrics(metrics, mixture.sample(size, seed=seed).to(self.options.device))
            results.update(compute_metrics(metrics, self.options.seed))
        if "modes" in applicable:
            points = torch.cat([mixture.sample(size, seed=seed) for seed, size in self._chunks()])
            coverage = mode_coverage(points, self.dataset.modes, self.dataset.mode_std)
            results["modes"] = {"value": coverage.covered, **coverage.as_dict()}
        out: dict[str, Any] = {
            "metrics": {name: results[name] for name in self.metrics},
            "n": self.samples,
            "extractor": self.extractor.identity if self.extractor is not None else None,
        }
        if self.real is not None:
            out["reference"] = {"n": self.real.n, "class_source": self.real.class_source, "key": self.real.key}
        out["seconds"] = round(time.perf_counter() - start, 3)
        return out


def score_mixture(
    mixture: Mixture | ClassMixture, data: DataConfig, options: ScoringOptions, *, data_seed: int = 0
) -> dict[str, Any]:
    """Score one mixture against `data` (what a score job carries). See ScoringContext.score for the result."""
    return ScoringContext.prepare(data, options, data_seed=data_seed).score(mixture)


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
    result = Path(run_dir) / "result"
    if not (Path(run_dir) / "config.yaml").is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml in it)")
    if not (result / "mixture.json").is_file():
        raise PalominoError(
            f"{run_dir}: no result/mixture.json; did the run finish? (continue it with palomino train --resume {run_dir})"
        )
    cells = sorted(p for p in (result / "cells").glob("*") if (p / "mixture.json").is_file())
    return {"best": result, **{p.name: p for p in cells}}


def _score_folders(
    folders: list[str], data: dict[str, Any], options: dict[str, Any], data_seed: int
) -> list[dict[str, Any]]:
    """A worker's share, in a spawned process: one context (data, extractor, cached real statistics), then each mixture."""
    torch.set_num_threads(1)  # the workers are the parallelism; more threads each would fight over the cores
    context = ScoringContext.prepare(
        DataConfig.model_validate(data), ScoringOptions.model_validate(options), data_seed=data_seed
    )
    return [context.score(Mixture.load(Path(folder))) for folder in folders]


def score_run(
    run_dir: Path, options: ScoringOptions, workers: int | None = None, *, data: DataConfig | None = None
) -> dict[str, Any]:
    """Score the run's best mixture and every cell's neighbourhood mixture in `workers` spawned processes
    (1 torch thread each; default: one per core, at most one per mixture); writes scores.json atomically."""
    from palomino.config import load_config

    start = time.perf_counter()
    run_dir = Path(run_dir)
    folders = run_mixtures(run_dir)
    config = load_config(run_dir / "config.yaml")
    data = data or config.data
    # Validate, build the extractor and fill the real-statistics cache once, here, before any worker starts.
    context = ScoringContext.prepare(data, options, data_seed=config.seed)
    unique: dict[str, str] = {}  # content digest → the first folder name with it (the best is also a cell)
    names_of: dict[str, list[str]] = {}
    for name, folder in folders.items():
        digest = _digest(folder)
        unique.setdefault(digest, str(folder))
        names_of.setdefault(digest, []).append(name)
    jobs = list(unique.values())
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        scores = [context.score(Mixture.load(Path(f))) for f in jobs]
    else:
        shares = [jobs[i::workers] for i in range(workers)]
        data_json, options_json = data.model_dump(mode="json"), options.model_dump(mode="json")
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_score_folders, share, data_json, options_json, config.seed) for share in shares]
            by_folder = {
                folder: score for share, future in zip(shares, futures) for folder, score in zip(share, future.result())
            }
        scores = [by_folder[f] for f in jobs]
    by_name = {name: score for digest, score in zip(unique, scores) for name in names_of[digest]}
    best_cell = json.loads((folders["best"] / "mixture.json").read_text()).get("cell")
    report = {
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
        "best": {"cell": best_cell, **by_name["best"]},
        "cells": {name: score for name, score in by_name.items() if name != "best"},
        "workers": workers,
        "seconds": round(time.perf_counter() - start, 2),
    }
    report = _finite(report)
    atomic_write(run_dir / "scores.json", json.dumps(report, indent=2, allow_nan=False).encode())
    return report


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity (a diverged FID): such values become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
