"""Whole `palomino train` runs of the examples, this checkout against an earlier revision, back to back.

The speed table of docs/speed.md: each example trained once by a git worktree of `--baseline` (default
18f502c, the head before tiles) and once by this checkout, one after the other on the same
machine with the same Python (the baseline's code on PYTHONPATH, its own example file), each
its whole command (start-up, iterations, the final ensemble and its score). Printed: wall and
CPU seconds (user + sys) of both, and the ratio baseline / now.

    .venv/bin/python benchmarks/whole_runs.py                        # ring 3×3 and grid 4×4
    .venv/bin/python benchmarks/whole_runs.py examples/ring-3x3.yaml --set training.iterations=20
    PALOMINO_DATA_DIR=… .venv/bin/python benchmarks/whole_runs.py examples/mnist-regions-3x3.yaml \\
        --set training.iterations=20 --set data.dir=$PALOMINO_DATA_DIR/mnist --set data.split=test
    .venv/bin/python benchmarks/whole_runs.py --compile               # compile off / on, this checkout

`--compile` compares this checkout with itself instead: each example with `compile: off`, then
`compile: on` with an empty compile cache (the first run on a machine pays every compilation),
then `on` again with the cache the previous run left (what every later run pays).

Run it alone: two cores shared with anything else make every figure slower by an unknown share.
The worktree is made in a temporary folder and removed after.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EXAMPLES = ("examples/ring-3x3.yaml", "examples/grid-4x4.yaml")


def train(
    checkout: Path, example: str, sets: list[str], out: Path, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """One whole `palomino train` of `example` with `checkout`'s code: (wall s, CPU s of the child)."""
    args = [sys.executable, "-m", "palomino.cli", "train", example, "--out", str(out)]
    for item in sets:
        args += ["--set", item]
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(args, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{example} at {checkout} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", nargs="*", default=list(DEFAULT_EXAMPLES), help="example files, from the root")
    parser.add_argument("--baseline", default="18f502c", help="the revision to compare with (a commit or tag)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--compile", action="store_true", help="compile off against on (cold and warm cache)")
    args = parser.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    if args.compile:
        return compare_compile(args.examples, args.sets, head.stdout.strip())
    with tempfile.TemporaryDirectory(prefix="palomino-whole-runs-") as tmp:
        baseline = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(baseline), args.baseline], cwd=ROOT, check=True)
        try:
            print(f"baseline {args.baseline} against this checkout ({head.stdout.strip()}); --set {args.sets}")
            print(f"{'example':<34} {'then wall':>9} {'now wall':>9} {'ratio':>6} {'then CPU':>9} {'now CPU':>8}")
            for example in args.examples:
                then = train(baseline, example, args.sets, Path(tmp) / "then")
                now = train(ROOT, example, args.sets, Path(tmp) / "now")
                print(
                    f"{example:<34} {then[0]:>8.1f}s {now[0]:>8.1f}s {then[0] / now[0]:>5.2f}× "
                    f"{then[1]:>8.1f}s {now[1]:>7.1f}s",
                    flush=True,
                )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
    return 0


def compare_compile(examples: list[str], sets: list[str], head: str) -> int:
    """Each example with compile off, on from an empty cache, and on again from that cache."""
    with tempfile.TemporaryDirectory(prefix="palomino-whole-runs-") as tmp:
        cache = {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}
        print(f"compile off against on, this checkout ({head}); --set {sets}")
        print(
            f"{'example':<34} {'off wall':>9} {'on, cold':>9} {'ratio':>6} {'on, warm':>9} {'ratio':>6} {'CPU s off/cold/warm':>20}"
        )
        for example in examples:
            shutil.rmtree(cache["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
            off = train(ROOT, example, [*sets, "compile=off"], Path(tmp) / "off")
            cold = train(ROOT, example, [*sets, "compile=on"], Path(tmp) / "cold", cache)
            warm = train(ROOT, example, [*sets, "compile=on"], Path(tmp) / "warm", cache)
            print(
                f"{example:<34} {off[0]:>8.1f}s {cold[0]:>8.1f}s {off[0] / cold[0]:>5.2f}× {warm[0]:>8.1f}s "
                f"{off[0] / warm[0]:>5.2f}× {off[1]:>6.1f}/{cold[1]:.1f}/{warm[1]:.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
