"""The host's share of a big tile's iteration: what a GPU waits for while Python works.

An R×R grid of tiny perceptrons (hidden 4, 2-D points, batches of 8, 2 batches an iteration:
the arithmetic is next to nothing) trained as one tile in the form a GPU runs it (its cells'
fitness and re-evaluation batched, no per-cell call for exactness), on this CPU. What is left is
the host's work an iteration, which a GPU cannot hide when its own work is short: selection and
completion cell by cell, the stacks built, each trained member handed back as an individual, and
the garbage collector's walks. Issue 48's "rest of an iteration" at 144 cells, measured without
a GPU; the H100's 12×12 grid spent ~1.1 s an iteration outside its training steps (docs/speed.md).

Each row is one child process (fresh interpreter): `--baseline` REV's code from a git worktree,
then this checkout's, without and with `gc.freeze()` after start-up (as `palomino train` and the
cell worker and scorer now do, palomino/heap.py). Seconds an iteration (wall, median of `--iterations` after a
warm-up one) by phase, the collector's own seconds, and the ratio against the baseline.

    python benchmarks/host_overhead.py                 # 12×12 against 0476c84
    python benchmarks/host_overhead.py --grid 6 --baseline HEAD~3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("select", "train", "complete")


def measure(side: int, iterations: int, freeze: bool) -> dict[str, float]:
    """One child's measurement with the code on its PYTHONPATH (this function runs there)."""
    import gc

    import torch

    sys.path.insert(0, str(Path.cwd() / "benchmarks"))  # the checkout's own tiles.py: its phases
    import tiles

    from palomino.coevolution import Cell
    from palomino.coevolution.tile import Tile
    from palomino.config import DataConfig, ExperimentConfig
    from palomino.data import load_dataset
    from palomino.grid import Coord, Topology

    torch.set_num_threads(1)
    config = ExperimentConfig.model_validate(
        {
            "name": "host",
            "grid": {"rows": side, "cols": side, "neighbourhood": "von_neumann"},
            "training": {
                "batch_size": 8,
                "batches_per_iteration": 2,
                "losses": ["nonsaturating"],
                "fitness": {"sample_size": 16},
                "mixture": {"score_samples": 16},
            },
            "data": {"name": "gaussian_ring"},
            "network": {"name": "mlp", "hidden": 4, "latent_dim": 2},
        }
    )
    dataset = load_dataset(DataConfig(name="gaussian_ring"), 0)
    if freeze:  # as the commands do, after the imports and the dataset, before the cells
        gc.collect()
        gc.freeze()
    topology = Topology(side, side, "von_neumann")
    cells = [Cell(Coord(*c), topology, config, dataset, experiment="host") for c in topology.cells()]
    tile = Tile(cells, batched=True, exact=False)

    def seen() -> dict:
        snapshots = {cell.coord: cell.snapshot() for cell in cells}
        return {cell.coord: {n: snapshots[n] for n in topology.neighbours(cell.coord)} for cell in cells}

    spent = {phase: 0.0 for phase in (*PHASES, "exchange", "other")}
    inside = [False]

    def timed(phase: str, fn):  # a phase inside another (a cell's fallback in the tile's call) is the outer's
        def wrapper(*a, **kw):
            if inside[0]:
                return fn(*a, **kw)
            inside[0], start = True, time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[phase] += time.perf_counter() - start
                inside[0] = False

        return wrapper

    collecting, started = [0.0], [0.0]

    def on_gc(stage: str, _info: dict) -> None:
        if stage == "start":
            started[0] = time.perf_counter()
        else:
            collecting[0] += time.perf_counter() - started[0]

    tile.iterate(seen())  # warm-up
    totals, phases, gcs = [], [], []
    gc.callbacks.append(on_gc)
    with tiles.phases_wrapped(timed):
        for _ in range(iterations):
            spent.update({phase: 0.0 for phase in spent})
            collecting[0] = 0.0
            start = time.perf_counter()
            tile.iterate(seen())
            totals.append(time.perf_counter() - start)
            phases.append(dict(spent))
            gcs.append(collecting[0])
    middle = totals.index(statistics.median_low(totals))
    return {"total": totals[middle], "gc": gcs[middle], **phases[middle]}


def child(checkout: Path, side: int, iterations: int, freeze: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    args = [sys.executable, __file__, "--measure", "--grid", str(side), "--iterations", str(iterations)]
    done = subprocess.run(
        [*args, *(["--freeze"] if freeze else [])], cwd=checkout, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the measurement at {checkout} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=int, default=12, help="the grid's side (12: 144 cells)")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations (the median is shown)")
    parser.add_argument("--baseline", default="0476c84", help="the revision to compare with ('': none)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # a child
    parser.add_argument("--freeze", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.grid, args.iterations, args.freeze)))
        return 0
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            baseline = Path(tmp) / "baseline"
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(baseline), args.baseline], cwd=ROOT, check=True
            )
            try:
                rows.append((f"{args.baseline} (baseline)", child(baseline, args.grid, args.iterations, False)))
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
        rows.append(("this checkout", child(ROOT, args.grid, args.iterations, False)))
        rows.append(("this checkout, gc.freeze()", child(ROOT, args.grid, args.iterations, True)))
    cells = args.grid * args.grid
    print(
        f"host work of a {args.grid}×{args.grid} tile ({cells} cells) an iteration, wall s (median of {args.iterations})"
    )
    print(f"{'code':<30} {'select':>7} {'train':>7} {'complete':>9} {'gc':>6} {'total':>7} {'ms/cell':>8} {'ratio':>6}")
    first = rows[0][1]["total"]
    for name, row in rows:
        print(
            f"{name:<30} {row['select']:>7.3f} {row['train']:>7.3f} {row['complete']:>9.3f} {row['gc']:>6.3f} "
            f"{row['total']:>7.3f} {1000 * row['total'] / cells:>8.2f} {first / row['total']:>5.2f}×"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
