"""Class-partitioned training against DC-GAN and DC-CGAN on Fashion-MNIST, and its weak scaling.

Quality, after Lupo Pasini et al. ("Scalable balanced training of conditional GANs": IS on
CIFAR-10 4.39 DC-GAN < 5.69 DC-CGAN < 6.43 partitioned). The same budget — the same number of
generator + discriminator steps summed over all cells, so the same compute and the same epochs
over the data — for
    dcgan        1 cell, DCGAN
    dccgan       1 cell, conditional DCGAN (network.conditional: true)
    partitioned  10 classes × 1×1 (data.partition: labels), a DCGAN per class, 1/10 of the steps each
    (--equal-steps adds partitioned-equal: all the steps for every class, the time of one model on 10 cores)
each trained through the real CLI (`palomino train`), then scored on the Fashion-MNIST test split
with palomino.scoring and the small-CNN classifier (`--classifier FILE` of `palomino classifier
train`, else a quick one is trained first): classifier-feature FID (lower is better), classifier
IS (higher), class-distribution TVD (lower), and per class: FID against that class's test images
and the share of class-c draws the classifier calls c (conditional models only).

Weak scaling: K = 1, 2, 5, 10 classes, one process per class, each training its class's cell
(a 1×1 sub-grid: no class exchanges anything with another) with the engine's `Cell`; all
build their cell, then start together (a barrier); the median seconds per iteration of each
process, averaged, and its ratio to K = 1 measured in the same run. Ideal: 1.0 while every
process has its own core (or GPU: `--device cuda`).

    python benchmarks/partitioned.py --classifier /tmp/classifiers/fashion_mnist.safetensors
    python benchmarks/partitioned.py --steps 600 --samples 1000 --only quality     # quicker
    python benchmarks/partitioned.py --only scaling --classes 1 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
import yaml

from palomino.config import DataConfig
from palomino.runs import Mixture
from palomino.scoring import ScoringOptions
from palomino.scoring.classifier import load_classifier, save_classifier, train_classifier
from palomino.scoring.score import ScoringContext

FASHION = Path("/usr/share/datasets/fashion-mnist")
CLASSES = 10
MODELS = ("dcgan", "dccgan", "partitioned")


def palomino_command() -> list[str]:
    """The installed console script next to this interpreter, else `python -m palomino.cli`."""
    script = Path(sys.executable).with_name("palomino")
    return [str(script)] if script.exists() else [sys.executable, "-m", "palomino.cli"]


def experiment(
    model: str, args: argparse.Namespace, *, classes: list[int] | None = None, iterations: int | None = None
) -> dict[str, Any]:
    """The YAML of one model at the shared budget: `args.steps` steps summed over its cells
    (`partitioned-equal`: `args.steps` per cell, what one core per class buys in the same time)."""
    partitioned = model.startswith("partitioned")
    cells = len(classes) if partitioned and classes else (CLASSES if partitioned else 1)
    per_cell = args.steps if model == "partitioned-equal" else max(1, args.steps // cells)
    iterations = iterations or args.iterations
    raw: dict[str, Any] = {
        "name": model,
        "seed": args.seed,
        "device": args.device,
        "training": {
            "iterations": iterations,
            "batch_size": args.batch,
            "batches_per_iteration": max(1, per_cell // iterations),
            "losses": ["nonsaturating"],
            "learning_rate": args.learning_rate,
            "fitness": {"sample_size": 64},
            "mixture": {"score_samples": 128},
            "checkpoint_every": 0,
            "sample_every": 0,
        },
        "data": {"name": "fashion_mnist", "dir": str(args.data_dir), "split": "train"},
        "network": {"name": "dcgan", "width": args.width, "latent_dim": 64, "conditional": model == "dccgan"},
    }
    if partitioned:
        raw["data"].update({"partition": "labels", "classes": classes or list(range(CLASSES))})
        raw["grid"] = {"per_class": "1x1"}
    else:
        raw["grid"] = {"rows": 1, "cols": 1}
    return raw


def train(raw: dict[str, Any], out: Path) -> tuple[Path, float]:
    """`palomino train` on `raw`; (run directory, wall seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    config = out / f"{raw['name']}-{time.monotonic_ns()}.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.perf_counter()
    done = subprocess.run(
        [*palomino_command(), "train", str(config), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{raw['name']}: train failed ({done.returncode})\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1]), seconds


class OneClass:
    """A mixture asked for one class only: what ScoringContext.score needs (kind, shape, sample)."""

    def __init__(self, mixture: Any, label: int) -> None:
        self.mixture, self.label = mixture, label
        self.kind, self.sample_shape = mixture.kind, mixture.sample_shape

    def sample(self, n: int, seed: int = 0) -> torch.Tensor:
        return self.mixture.sample(n, seed=seed, labels=[self.label] * n)


def score(run: Path, args: argparse.Namespace, classifier: Path, cache: Path) -> dict[str, Any]:
    data = DataConfig(name="fashion_mnist", dir=args.data_dir, split="test")
    options = ScoringOptions(
        metrics=["fid", "is", "tvd"], samples=args.samples, classifier=classifier, cache_dir=cache, seed=1
    )
    mixture = Mixture.load(run / "result")
    overall = ScoringContext.prepare(data, options).score(mixture)
    out = {name: overall["metrics"][name]["value"] for name in ("fid", "is", "tvd")}
    if not getattr(mixture, "conditional", False):
        return out
    net = load_classifier(classifier).net.eval()
    per_class_options = options.model_copy(update={"metrics": ["fid"], "samples": args.class_samples})
    fids, hits = [], []
    for label in range(CLASSES):
        one = OneClass(mixture, label)
        context = ScoringContext.prepare(data.model_copy(update={"classes": [label]}), per_class_options)
        fids.append(context.score(one)["metrics"]["fid"]["value"])
        with torch.no_grad():
            drawn = one.sample(args.class_samples, seed=label)
            hits.append(float((net(drawn).argmax(1) == label).float().mean()))
    out.update(
        {"class_fid": statistics.mean(fids), "class_hit": statistics.mean(hits), "class_fids": fids, "class_hits": hits}
    )
    return out


def quality(args: argparse.Namespace, out: Path, classifier: Path) -> list[dict[str, Any]]:
    rows = []
    print(
        f"\nquality: Fashion-MNIST, {args.steps} G+D steps in all per model (batch {args.batch}, DCGAN width {args.width}, "
        f"lr {args.learning_rate}), "
        f"{args.samples} samples scored against the test split",
        flush=True,
    )
    print(
        f"{'model':<18}{'cells':>6}{'steps/cell':>11}{'train s':>9}{'FID':>9}{'IS':>7}{'TVD':>7}{'class FID':>11}{'class hit':>11}",
        flush=True,
    )
    for model in MODELS + (("partitioned-equal",) if args.equal_steps else ()):
        raw = experiment(model, args)
        run, seconds = train(raw, out / "quality")
        result = score(run, args, classifier, out / "cache")
        cells = CLASSES if model.startswith("partitioned") else 1
        steps = raw["training"]["iterations"] * raw["training"]["batches_per_iteration"]
        row = {
            "model": model,
            "cells": cells,
            "steps_per_cell": steps,
            "train_seconds": seconds,
            "run": str(run),
            **result,
        }
        rows.append(row)
        class_fid = f"{row['class_fid']:.2f}" if "class_fid" in row else "–"
        class_hit = f"{row['class_hit']:.1%}" if "class_hit" in row else "–"
        print(
            f"{model:<18}{cells:>6}{steps:>11}{seconds:>9.0f}{row['fid']:>9.2f}{row['is']:>7.2f}{row['tvd']:>7.3f}{class_fid:>11}{class_hit:>11}",
            flush=True,
        )
    base = rows[0]
    print(
        "ratios to dcgan: "
        + ", ".join(
            f"{r['model']}: FID ×{r['fid'] / base['fid']:.2f}, IS ×{r['is'] / base['is']:.2f}" for r in rows[1:]
        ),
        flush=True,
    )
    return rows


def class_worker(label: int, classes: int, raw: dict[str, Any], barrier: Any, iterations: int) -> list[float]:
    """One class's cell in its own process: build it, wait for every class, then time its iterations
    (an iteration and its snapshot: what `palomino train` or a cell worker does per iteration)."""
    torch.set_num_threads(1)
    from palomino.coevolution import Cell
    from palomino.config import parse_config
    from palomino.data import load_dataset
    from palomino.grid import partition_grid

    config = parse_config(raw)
    partition = partition_grid(list(range(classes)), config.grid.per_class_shape)
    grid = partition.grid_for(label)
    device = config.device
    if device == "cuda" and torch.cuda.device_count() > 1:  # a GPU per class, round robin
        device = f"cuda:{label % torch.cuda.device_count()}"
    cell = Cell(
        next(grid.cells()), grid, config, load_dataset(config.data, config.seed), experiment="scaling", device=device
    )
    cell.iterate({})  # warm-up: allocations, the first data pass
    barrier.wait()  # all classes train at the same time from here on
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        cell.iterate({})
        cell.snapshot()
        times.append(time.perf_counter() - start)
    return times


def scaling(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_cell = args.scaling_steps
    print(
        f"\nweak scaling: one process per class (a 1×1 sub-grid each, {per_cell} steps per iteration, batch {args.batch}, "
        f"all started together); {cores} cores here, device {args.device}",
        flush=True,
    )
    print(f"{'classes':>8}{'processes':>10}{'s/iteration':>13}{'vs 1 class':>12}{'steps/s (all)':>15}", flush=True)
    context = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    for k in args.classes:
        raw = experiment("partitioned", args, classes=list(range(k)))
        raw["training"]["batches_per_iteration"] = per_cell
        raw["data"]["classes"] = list(range(k))
        with context.Manager() as manager:
            barrier = manager.Barrier(k)
            with ProcessPoolExecutor(k, mp_context=context) as pool:
                jobs = [
                    pool.submit(class_worker, label, k, raw, barrier, args.scaling_iterations) for label in range(k)
                ]
                times = [job.result() for job in jobs]
        per_iteration = statistics.mean(statistics.median(t) for t in times)
        rows.append({"classes": k, "seconds_per_iteration": per_iteration, "times": times})
        ratio = per_iteration / rows[0]["seconds_per_iteration"]
        print(f"{k:>8}{k:>10}{per_iteration:>13.3f}{ratio:>12.2f}{k * per_cell / per_iteration:>15.1f}", flush=True)
    return rows


def ensure_classifier(args: argparse.Namespace, out: Path) -> Path:
    if args.classifier is not None:
        meta = load_classifier(args.classifier).meta
        print(
            f"classifier: {args.classifier} ({meta['dataset']}, test accuracy {meta['accuracy']:.2%}, {meta['split']})"
        )
        return args.classifier
    print("no --classifier: training a quick one (10,000 images, 3 epochs)", flush=True)
    trained = train_classifier(DataConfig(name="fashion_mnist", dir=args.data_dir), train_size=10_000, epochs=3)
    path = save_classifier(trained, out / "fashion_mnist-quick.safetensors")
    print(f"classifier: test accuracy {trained.accuracy:.2%}", flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("quality", "scaling"), help="run one part only")
    parser.add_argument(
        "--equal-steps",
        action="store_true",
        help="also partitioned-equal: --steps per class (10× the compute; the same time on 10 cores)",
    )
    parser.add_argument("--steps", type=int, default=2000, help="G+D steps per model, summed over its cells")
    parser.add_argument("--iterations", type=int, default=10, help="iterations per cell (quality)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=16, help="DCGAN base channels")
    parser.add_argument("--learning-rate", type=float, default=0.0005)
    parser.add_argument("--samples", type=int, default=2000, help="samples scored per model")
    parser.add_argument("--class-samples", type=int, default=500, help="samples scored per class")
    parser.add_argument("--classifier", type=Path, help="a file of `palomino classifier train --data fashion_mnist`")
    parser.add_argument("--classes", type=int, nargs="+", default=[1, 2, 5, 10], help="class counts for weak scaling")
    parser.add_argument("--scaling-iterations", type=int, default=8)
    parser.add_argument("--scaling-steps", type=int, default=10, help="steps per iteration in the scaling runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data-dir", type=Path, default=FASHION)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="keep the run directories here (default: a temp dir)")
    args = parser.parse_args(argv)
    if any(k < 1 or k > CLASSES for k in args.classes):
        parser.error(f"--classes: between 1 and {CLASSES}")

    with tempfile.TemporaryDirectory(prefix="partitioned-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
        if args.only != "scaling":
            report["quality"] = quality(args, out, ensure_classifier(args, out))
        if args.only != "quality":
            report["scaling"] = scaling(args, out)
        (out / "partitioned.json").write_text(json.dumps(report, indent=2))
        print(f"\nreport: {out / 'partitioned.json'}" if args.out else "", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
