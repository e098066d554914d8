"""Mode coverage on the 2-D toys: ring-1x1 vs ring-3x3 vs grid-4x4, several seeds.

Each (config, seed) is trained through the real CLI in a subprocess
(`palomino train examples/<name>.yaml --set seed=<s>`), then 2,500 points are drawn from the
run's best mixture (`palomino sample`) and scored: a sample is high quality within 3σ of a
mode centre, a mode is covered with ≥ 20 high-quality samples nearest to it.

    python benchmarks/toy_modes.py                       # all three, seeds 0 1 2
    python benchmarks/toy_modes.py ring-3x3 --seeds 0    # one config, one seed
    python benchmarks/toy_modes.py ring-1x1 --set training.iterations=5   # quick check
    python benchmarks/toy_modes.py --out runs/toys       # keep the run directories

Runs one training at a time (the embedded trainer already uses every core).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from palomino.config import DataConfig
from palomino.config.loading import load_config
from palomino.data import load_dataset
from palomino.scoring import mode_coverage

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("ring-1x1", "ring-3x3", "grid-4x4")
SAMPLES = 2500


def palomino_command() -> list[str]:
    """The installed console script next to this interpreter, else `python -m palomino.cli`."""
    script = Path(sys.executable).with_name("palomino")
    return [str(script)] if script.exists() else [sys.executable, "-m", "palomino.cli"]


def run_one(name: str, seed: int, out: Path, overrides: list[str]) -> dict:
    config = ROOT / "examples" / f"{name}.yaml"
    sets = [f"seed={seed}", *overrides]
    command = [*palomino_command(), "train", str(config), "--out", str(out)]
    for item in sets:
        command += ["--set", item]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{name} seed {seed}: train failed ({done.returncode})\n{done.stderr[-2000:]}")
    run = Path(done.stdout.strip().splitlines()[-1])
    samples_file = run / "toy_modes_samples.npy"
    sampled = subprocess.run(
        [*palomino_command(), "sample", str(run), "--n", str(SAMPLES), "--out", str(samples_file)],
        capture_output=True,
        text=True,
    )
    if sampled.returncode != 0:
        raise RuntimeError(f"{name} seed {seed}: sample failed\n{sampled.stderr[-2000:]}")
    data_name = load_config(run / "config.yaml").data.name
    dataset = load_dataset(DataConfig(name=data_name), 0)
    samples = torch.from_numpy(np.load(samples_file))
    coverage = mode_coverage(samples, dataset.modes, dataset.mode_std)
    return {
        "config": name,
        "seed": seed,
        "covered": coverage.covered,
        "modes": coverage.modes,
        "high_quality": coverage.high_quality,
        "seconds": seconds,
        "run": str(run),
    }


def print_row(row: dict) -> None:
    modes = f"{row['covered']}/{row['modes']}"
    print(f"{row['config']:<10} {row['seed']!s:>6} {modes:>7} {row['high_quality']:>8.3f} {row['seconds']:>8.0f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", default=list(CONFIGS), help=f"example names (default: {' '.join(CONFIGS)})")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to every `palomino train` (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="keep run directories here (default: a temp dir)")
    args = parser.parse_args(argv)
    for name in args.configs:
        if not (ROOT / "examples" / f"{name}.yaml").exists():
            parser.error(f"no examples/{name}.yaml")

    with tempfile.TemporaryDirectory(prefix="toy-modes-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        print(f"{'config':<10} {'seed':>6} {'modes':>7} {'hq':>8} {'wall s':>8}", flush=True)
        rows = []
        for name in args.configs:
            for seed in args.seeds:
                row = run_one(name, seed, out, args.overrides)
                rows.append(row)
                print_row(row)
        print()
        for name in args.configs:
            mine = [r for r in rows if r["config"] == name]
            print_row({
                "config": name,
                "seed": "mean",
                "covered": round(float(np.mean([r["covered"] for r in mine])), 1),
                "modes": mine[0]["modes"],
                "high_quality": float(np.mean([r["high_quality"] for r in mine])),
                "seconds": float(np.mean([r["seconds"] for r in mine])),
            })
    return 0


if __name__ == "__main__":
    sys.exit(main())
