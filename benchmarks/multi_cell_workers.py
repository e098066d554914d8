"""Multi-cell workers: does a distributed grid train faster when one worker hosts K cells?

The same experiment and seed through `palomino up` twice or more: N one-cell workers (each its own
process, every neighbour pair over RabbitMQ), then workers of K cells (`--per-worker K`, i.e.
`palomino cell --cells K`: a patch per process, trained as one tile where it pays, pairs inside a
patch in memory). Printed: wall seconds of the whole `up` (start-up included, scoring off), the
training span from the first to the last metrics record, cell-iterations per second, the mean
seconds a cell iteration waited for neighbours, and each against one-cell workers in the same run.

    .venv/bin/python benchmarks/multi_cell_workers.py                               # ring 3×3: 1 vs 9 cells a worker
    .venv/bin/python benchmarks/multi_cell_workers.py --per-worker 1 3 9 --set training.iterations=50

It uses the broker and Redis of PALOMINO_BROKER_URL / PALOMINO_REDIS_URL (else the local
defaults), in a namespace of its own (what `palomino up` does); it stops and flushes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_up(config: Path, cells: int, per_worker: int, out: Path, sets: list[str]) -> dict[str, float]:
    """One `palomino up`; its wall time and what its metrics say."""
    args = [sys.executable, "-m", "palomino", "up", str(config), "--cells", str(cells), "--scorers", "0"]
    args += ["--per-worker", str(per_worker), "--out", str(out)]
    for item in ["scoring.final=false", *sets]:
        args += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"palomino up --per-worker {per_worker} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stamps = (run_dir / "metrics.jsonl").stat().st_mtime, (run_dir / "topology.jsonl").stat().st_mtime
    waits = [r["seconds"]["wait"] for r in records if "seconds" in r]
    return {
        "wall": wall,
        "span": stamps[0] - stamps[1],  # the layout written → the last record written
        "cell_iterations": len(records),
        "wait": sum(waits) / max(1, len(waits)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "ring-3x3.yaml")
    parser.add_argument("--cells", type=int, default=9, help="the grid's cells (rows × cols of the config)")
    parser.add_argument("--per-worker", type=int, nargs="+", default=[1, 9], help="cells a worker hosts; 1 first")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.per_worker[0] != 1:
        parser.error("--per-worker must start with 1: the one-cell workers are the baseline")
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        rows = [(k, run_up(args.config, args.cells, k, out / f"per-worker-{k}", args.sets)) for k in args.per_worker]
    base = rows[0][1]
    print(f"{args.config.name}, {args.cells} cells, {' '.join(args.sets) or 'as configured'}")
    print("cells/worker  workers  wall s  span s  cell-it/s  wait s/it  speed-up (span)  speed-up (wall)")
    for k, r in rows:
        workers = -(-args.cells // k)
        rate = r["cell_iterations"] / r["span"]
        print(
            f"{k:>12}  {workers:>7}  {r['wall']:6.1f}  {r['span']:6.1f}  {rate:9.2f}  {r['wait']:9.3f}"
            f"  {base['span'] / r['span']:14.2f}×  {base['wall'] / r['wall']:14.2f}×"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
