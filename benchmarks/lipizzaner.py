"""Lipizzaner's own MNIST experiment, run as its papers ran it and scored their way and the project's.

Arms (`--arms`), each on every cell on all the training data, at the papers' schedule of 200
iterations of one pass each (batch 100, the discriminator on every second batch):
- full              examples/lipizzaner-mnist-3x3.yaml: tournament selection over the neighbourhood,
                    Lipizzaner's replacement (only a strictly fitter trained individual), the mixture's
                    weights by a (1+1)-ES on FID; the result is the best cell's neighbourhood mixture
- no-selection      the same with training.selection.enabled=false (the NeurIPS 2018 MNIST configs;
                    PPSN 2020's "no selection"): each cell's own individuals train, each batch against an
                    opponent from the whole neighbourhood, nothing is replaced
- no-communication  the same with grid.neighbourhood=none: no neighbour ever heard, so each cell's
                    "neighbourhood mixture" is its own generator alone
- one-gan-cell      one plain GAN with ONE cell's steps (the papers' comparison)
- one-gan-grid      one plain GAN with the grid's total steps (this project's rule: equal compute)
- palomino          Palomino's own setting (examples/mnist-regions-3x3.yaml: data regions, decay, the
                    whole-grid ensemble) with as many batches a cell
Grid sizes: `--sizes 3 6 12` (N×N; the one-GAN arms take the size's budgets).

Every row is scored two ways:
- lipizzaner: Lipizzaner's protocol (palomino.scoring.lipizzaner_protocol.protocol_fid) with its own CNN weights:
  1,000 samples against the first 1,000 training images (960 used); for a grid, every cell's
  neighbourhood mixture, the best cell reported, as Lipizzaner's master reports it (the palomino
  arm: its result, the grid's ensemble);
- held-out: the result Palomino hands out (the best cell's mixture, the grid's ensemble, the GAN),
  2,000 samples against the 2,000 held-out images the GANs never saw: FID on the project's classifier
  (benchmarks/quality.py's, trained on the same 8,000) and on Lipizzaner's CNN, class TVD, memorization.

Data: MNIST's 60,000 training images cannot be had on the project's machines; the referee's split of
the 10,000 test images is used (8,000 to train: 80 batches a pass, 16,000 batches a cell; 2,000 held out).

    python benchmarks/lipizzaner.py --arms full --sizes 3 --seeds 0 1 2 --out docs/quality/lipizzaner
    python benchmarks/lipizzaner.py --quick --out /tmp/lip        # minutes: 2 iterations of 10 batches
    python benchmarks/lipizzaner.py --table-only --out docs/quality/lipizzaner   # the table of the rows there

Each (arm, size, seed) writes <out>/rows/<arm>-<N>x<N>-seed<S>.json as it finishes (a rerun skips those
already there: the table grows across sessions); <out>/table.json joins every row file there.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality

from palomino.baselines import Budget
from palomino.coevolution.ensemble_search import feature_fid
from palomino.config import ExperimentConfig
from palomino.config.loading import load_config
from palomino.data import Dataset
from palomino.nn import build_generator
from palomino.runs.mixture import Mixture
from palomino.scoring.lipizzaner_protocol import PROTOCOL_SAMPLES, lipizzaners_mnist_cnn, protocol_fid
from palomino.scoring.tvd import class_tvd

ROOT = quality.ROOT
ARMS = ("full", "no-selection", "no-communication", "one-gan-cell", "one-gan-grid", "palomino")
ITERATIONS = 200  # the papers' iterations, one pass over the data each
PASS_BATCHES = 80  # a pass over the referee's 8,000 training images in batches of 100
QUICK = ("training.iterations=2", "training.batches_per_iteration=10")
# The papers' MNIST figures (FID on Lipizzaner's CNN, Lipizzaner's protocol), beside ours.
PAPER: dict[tuple[str, int], str] = {
    ("full", 3): "40.9 ± 8.5 (PPSN 2020 ablation); 41.2 ± 2.4 (grid sizes, 30 runs)",
    ("no-selection", 3): "43.6 (PPSN 2020)",
    ("no-communication", 3): "881.8 (PPSN 2020)",
    ("one-gan-cell", 3): "51.2 (PPSN 2020: one GAN)",
    ("full", 6): "24.6 ± 2.4",
    ("full", 12): "19.9 ± 2.5",
    ("full", 18): "17.2 ± 1.6",
}


def arm_config(arm: str, size: int, seed: int, device: str, quick: bool, sets: list[str]) -> ExperimentConfig:
    """The arm's experiment at N×N (the one-GAN arms: the full grid's, whose networks and budget they take)."""
    common = [
        f"grid.rows={size}",
        f"grid.cols={size}",
        f"seed={seed}",
        f"device={device}",
        *quality.MNIST,
        "training.checkpoint_every=0",
        "training.sample_every=0",
    ]
    if arm == "palomino":  # its own example (50 batches an iteration) at the full arm's batches a cell
        per_iteration, per_cell = (10, 2 * 10) if quick else (50, ITERATIONS * PASS_BATCHES)
        changes = [
            f"training.batches_per_iteration={per_iteration}",
            f"training.iterations={per_cell // per_iteration}",
        ]
        return load_config(ROOT / "examples" / "mnist-regions-3x3.yaml", [*common, *changes, *sets])
    changes = [*common, *(QUICK if quick else ())]
    if arm == "no-selection":
        changes.append("training.selection.enabled=false")
    if arm == "no-communication":
        changes.append("grid.neighbourhood=none")
    return load_config(ROOT / "examples" / "lipizzaner-mnist-3x3.yaml", [*changes, *sets])


class Scorers:
    """Both protocols for one seed's split: Lipizzaner's (first 1,000 training images) and the held-out."""

    def __init__(self, config: ExperimentConfig, seed: int, out: Path) -> None:
        self.train, held_out, _ = quality.split_data(config, seed)
        assert held_out is not None, "images only"
        self.held_out = held_out
        self.referee = quality.Referee(config, self.train, held_out, out)
        self.cnn = lipizzaners_mnist_cnn()
        self.first = self._images(self.train.samples[:PROTOCOL_SAMPLES])
        with torch.no_grad():
            self.held_out_logits = self.cnn(self._images(held_out.samples))

    @staticmethod
    def _images(samples: torch.Tensor) -> torch.Tensor:
        return ((samples + 1) / 2).clamp(0, 1).reshape(-1, 1, 28, 28)

    def lipizzaner(self, samples: torch.Tensor) -> float:
        return protocol_fid(self.cnn, self._images(samples[:PROTOCOL_SAMPLES]), self.first)

    @torch.no_grad()
    def held(self, samples: torch.Tensor) -> dict[str, float]:
        scores = self.referee.score(samples)
        fake = self.cnn(self._images(samples))
        scores["fid_lipizzaner_cnn"] = feature_fid(fake, self.held_out_logits)
        # The referee's classifier reads noisy digits as one class (8s): Lipizzaner's CNN's classes beside it.
        scores["tvd_lipizzaner_cnn"] = class_tvd(fake, self.held_out_logits)
        return scores


def score_grid(run_dir: Path, scorers: Scorers, seed: int, ensemble: bool) -> dict[str, Any]:
    """Lipizzaner's protocol on every cell's neighbourhood mixture (the best cell reported), and the
    held-out protocol on what the run hands out (result/: the best cell's mixture, or the ensemble)."""
    per_cell = {}
    for folder in sorted((run_dir / "result" / "cells").iterdir()):
        mixture = Mixture.load(folder)
        per_cell[folder.name] = scorers.lipizzaner(mixture.sample(PROTOCOL_SAMPLES, seed=seed + 100, data_space=False))
    result = Mixture.load(run_dir / "result")
    best = min(per_cell, key=per_cell.__getitem__)
    lipizzaner = per_cell[best]
    if ensemble:  # Palomino's result is the ensemble: Lipizzaner's protocol on it too
        lipizzaner = scorers.lipizzaner(result.sample(PROTOCOL_SAMPLES, seed=seed + 100, data_space=False))
        best = "grid"
    held = scorers.held(result.sample(quality.IMAGE_SAMPLES, seed=seed + 200, data_space=False))
    return {
        "lipizzaner": {"fid": lipizzaner, "cell": best, "per_cell": per_cell},
        "held_out": {**held, "result": str(result.info.get("cell", "?"))},
    }


def run_arm(arm: str, size: int, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    config = arm_config(arm, size, seed, args.device, args.quick, args.set)
    start = time.perf_counter()
    scorers = Scorers(config, seed, out)
    print(
        f"{arm} {size}x{size} seed {seed}: scorers ready ({time.perf_counter() - start:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    if arm.startswith("one-gan"):
        full = arm_config("full", size, seed, args.device, args.quick, args.set)
        per_cell = batches_per_cell(full, scorers.train)
        skip = full.training.discriminator_skip_each_nth_step
        cells = size * size if arm == "one-gan-grid" else 1
        budget = Budget(per_cell * cells, -(-per_cell // (skip + 1)) * cells)
        torch.set_num_threads(quality.THREADS)
        (generator,), _, seconds = quality.train_baselines(full, [scorers.train], budget, [seed + 1000], args.device)
        folder = run_folder(out, arm, size, seed)
        folder.mkdir(parents=True, exist_ok=True)  # kept, so that a later scorer can score it again
        save_file({k: v.contiguous() for k, v in generator.state_dict().items()}, folder / GAN_FILE)
        scores = score_gan(generator, scorers, seed, full.network.latent_dim)
        steps = {"generator": budget.generator, "discriminator": budget.discriminator}
    else:
        if arm == "palomino":  # its ensemble is chosen on the classifier's features, as the referee's
            config = config.model_copy(
                update={"scoring": config.scoring.model_copy(update={"classifier": scorers.referee.classifier})}
            )
        run, seconds = quality.run_grid(config, scorers.train, run_folder(out, arm, size, seed))
        g, d, cells = quality.grid_steps(run)
        scores = score_grid(run.path, scorers, seed, ensemble=config.grid_ensemble)
        steps = {"generator": g, "discriminator": d}
    return {
        "arm": arm,
        "size": f"{size}x{size}",
        "seed": seed,
        "seconds": round(seconds, 1),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "steps": steps,
        "device": device_name(args.device),
        "command": command(arm, size, seed, args),
        **scores,
    }


GAN_FILE = "generator.safetensors"  # a one-GAN arm's generator, beside where a grid's run would be


def run_folder(out: Path, arm: str, size: int, seed: int) -> Path:
    return out / "runs" / f"{arm}-{size}x{size}-seed{seed}"


def score_gan(generator: torch.nn.Module, scorers: Scorers, seed: int, latent: int) -> dict[str, Any]:
    """Both protocols on one GAN's generator (its samples seeded as a grid's are)."""
    one = np.ones(1)
    return {
        "lipizzaner": {
            "fid": scorers.lipizzaner(quality.draw([generator], one, PROTOCOL_SAMPLES, latent, seed + 100)),
            "cell": "gan",
        },
        "held_out": scorers.held(quality.draw([generator], one, quality.IMAGE_SAMPLES, latent, seed + 200)),
    }


def rescore(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The row's scores computed again from what its run left (after a scorer gained a figure);
    the same samples, so the figures it had come out as they were."""
    arm, size, seed = row["arm"], int(row["size"].split("x")[0]), row["seed"]
    quick = "--quick" in row["command"]
    config = arm_config("full" if arm.startswith("one-gan") else arm, size, seed, "cpu", quick, args.set)
    scorers = Scorers(config, seed, args.out)
    folder = run_folder(args.out, arm, size, seed)
    if arm.startswith("one-gan"):
        if not (folder / GAN_FILE).is_file():
            print(f"{arm} {row['size']} seed {seed}: no {GAN_FILE} to score again, kept", file=sys.stderr)
            return row
        generator = build_generator(config.network, scorers.train.sample_shape, scorers.train.kind)
        generator.load_state_dict(load_file(folder / GAN_FILE))
        return {**row, **score_gan(generator, scorers, seed, config.network.latent_dim)}
    (run,) = [p for p in folder.iterdir() if (p / "result").is_dir()]
    return {**row, **score_grid(run, scorers, seed, ensemble=config.grid_ensemble)}


def batches_per_cell(config: ExperimentConfig, train: Dataset) -> int:
    per_iteration = config.training.batches_per_iteration or max(1, len(train) // config.training.batch_size)
    return per_iteration * config.training.iterations


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def command(arm: str, size: int, seed: int, args: argparse.Namespace) -> str:
    parts = ["python benchmarks/lipizzaner.py", "--arms", arm, "--sizes", str(size), "--seeds", str(seed)]
    if args.quick:
        parts.append("--quick")
    if args.device != "cpu":
        parts += ["--device", args.device]
    parts += [f"--set {s}" for s in args.set]
    return " ".join(parts)


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (arm, size): mean ± sd over its seeds of each protocol's figures."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["arm"], row["size"]), []).append(row)

    def stats(values: list[float]) -> dict[str, float]:
        array = np.array(values, dtype=float)
        return {"mean": float(array.mean()), "sd": float(array.std(ddof=1)) if len(array) > 1 else 0.0}

    lines = []
    for (arm, size), group in sorted(
        groups.items(), key=lambda kv: (int(kv[0][1].split("x")[0]), ARMS.index(kv[0][0]))
    ):
        lines.append(
            {
                "arm": arm,
                "size": size,
                "seeds": sorted(r["seed"] for r in group),
                "lipizzaner_fid": stats([r["lipizzaner"]["fid"] for r in group]),
                "held_out_fid": stats([r["held_out"]["fid"] for r in group]),
                "held_out_fid_lipizzaner_cnn": stats([r["held_out"]["fid_lipizzaner_cnn"] for r in group]),
                "tvd": stats([r["held_out"]["tvd"] for r in group]),
                "tvd_lipizzaner_cnn": stats([r["held_out"].get("tvd_lipizzaner_cnn", np.nan) for r in group]),
                "memorization": stats([r["held_out"]["memorization"] for r in group]),
                "minutes": stats([r["seconds"] / 60 for r in group]),
                "paper": PAPER.get((arm, int(size.split("x")[0])), "–"),
            }
        )
    return lines


def format_table(lines: list[dict[str, Any]]) -> str:
    def ms(s: dict[str, float], digits: int = 1) -> str:  # one seed: its value; more: mean ± sd
        return f"{s['mean']:.{digits}f}" + (f" ± {s['sd']:.{digits}f}" if s["sd"] else "")

    head = (
        "| arm | grid | seeds | Lipizzaner's FID (its protocol) | paper | held-out FID | held-out FID, Lipizzaner's CNN "
        "| TVD: classifier · Lipizzaner's CNN | memorization | minutes |"
    )
    out = [head, "| --- " * 10 + "|"]
    for line in lines:
        out.append(
            f"| {line['arm']} | {line['size']} | {len(line['seeds'])} | {ms(line['lipizzaner_fid'])} | {line['paper']} | "
            f"{ms(line['held_out_fid'])} | {ms(line['held_out_fid_lipizzaner_cnn'])} | {ms(line['tvd'], 3)} · "
            f"{ms(line['tvd_lipizzaner_cnn'], 3)} | {ms(line['memorization'], 2)} | {ms(line['minutes'], 0)} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--sizes", nargs="+", type=int, default=[3])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="2 iterations of 10 batches: the script's own check")
    parser.add_argument("--set", action="append", default=[], help="an override for every arm's config")
    parser.add_argument("--out", type=Path, default=Path("bench/lipizzaner"))
    parser.add_argument("--table-only", action="store_true", help="train nothing: join the rows in --out/rows")
    parser.add_argument("--rescore", action="store_true", help="train nothing: score the rows' runs in --out again")
    parser.add_argument(
        "--referee-only",
        action="store_true",
        help="train no GAN: only the referee's classifier, into --out (to hand a GPU host, which reuses it)",
    )
    args = parser.parse_args(argv)
    # The scorers' CPU work (the referee's classifier: ~2 min on 2 cores) at the reference machine's
    # threads everywhere: on a 16-core GPU host two runs side by side at torch's default of 16 threads
    # each spun for over 9 minutes without finishing it.
    torch.set_num_threads(quality.THREADS)
    if any(size < 1 or size > 32 for size in args.sizes):
        parser.error("--sizes: each between 1 and 32")
    if args.referee_only:
        start = time.perf_counter()
        Scorers(arm_config("full", args.sizes[0], 0, "cpu", args.quick, args.set), 0, args.out)
        print(f"the referee's classifier in {args.out} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
        return 0
    rows_dir = args.out / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    if args.rescore:
        for path in sorted(rows_dir.glob("*.json")):
            path.write_text(json.dumps(rescore(json.loads(path.read_text()), args), indent=1) + "\n")
    for size in [] if args.table_only or args.rescore else args.sizes:
        for arm in args.arms:
            for seed in args.seeds:
                path = rows_dir / f"{arm}-{size}x{size}-seed{seed}.json"
                if path.exists():
                    print(f"{path.name}: done before, kept", file=sys.stderr)
                    continue
                row = run_arm(arm, size, seed, args, args.out)
                path.write_text(json.dumps(row, indent=1) + "\n")
                print(
                    f"{arm} {size}x{size} seed {seed}: Lipizzaner's FID {row['lipizzaner']['fid']:.1f} "
                    f"(cell {row['lipizzaner']['cell']}), held-out FID {row['held_out']['fid']:.1f}, "
                    f"{row['seconds'] / 60:.1f} min",
                    file=sys.stderr,
                    flush=True,
                )
    rows = [json.loads(p.read_text()) for p in sorted(rows_dir.glob("*.json"))]
    lines = summarise(rows)
    table = {
        "data": "MNIST, the referee's split: 8,000 of the 10,000 test images to train, 2,000 held out",
        "lines": lines,
        "rows": rows,
    }
    (args.out / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    print(format_table(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
