"""The README's results table, made from the referee's JSON files in docs/quality/ (never typed in).

    python benchmarks/headline.py            # prints the table (markdown) and its commands
    python benchmarks/headline.py --check    # exit 1 when README.md's table differs from it

Each row is one `benchmarks/quality.py` run (its `--out` folder's table.json, copied into
docs/quality/): every figure is that run's mean over its seeds, each method at the learning rate
its validation split chose where the run swept rates (`--rates`). tests/test_docs.py runs --check.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUALITY = ROOT / "docs" / "quality"
BEGIN, END = "<!-- results table: python benchmarks/headline.py -->", "<!-- end of results table -->"


@dataclass(frozen=True)
class Row:
    label: str  # the data and the grid
    json: str  # in docs/quality/
    command: str  # what wrote it (its --out folder's table.json)


ROWS = (
    Row(
        "8 Gaussians on a ring, 3×3",
        "ring-3x3-tuned.json",
        "python benchmarks/quality.py ring-3x3 --seeds 0 1 2 --rates 1e-4 2e-4 5e-4 1e-3",
    ),
    Row(
        "25 Gaussians on a grid, 4×4",
        "grid-4x4-tuned.json",
        "python benchmarks/quality.py grid-4x4 --seeds 0 --rates 2e-4 5e-4 1e-3 --set network.minibatch_std=true "
        "--set training.ensemble.critic=own",
    ),
    Row(
        "MNIST (7,000 training images), 3×3",
        "mnist-3x3-tuned-plain.json",
        "PALOMINO_DATA_DIR=… python benchmarks/quality.py mnist-3x3 --seeds 0 --baselines plain regions "
        "--rates 1e-4 2e-4 5e-4",
    ),
    Row(
        "Fashion-MNIST (59,000 training images), 3×3",
        "fashion-full-3x3-tuned.json",
        "python benchmarks/quality.py fashion-full-3x3 --seeds 0 --baselines plain regions --rates 2e-4 5e-4 1e-3",
    ),
)
HEADER = (
    "| data, grid | score | grid | one GAN | independent GANs: the best · all mixed | independent GANs on the "
    "grid's regions, mixed by its search | grid memorization | seeds | learning rates |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def _rate(rate: float) -> str:
    mantissa, exponent = f"{rate:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _mean(row: dict | None, key: str) -> float | None:
    return None if row is None or key not in row else row[key]["mean"]


def _figure(row: dict | None, toy: bool) -> str:
    """A method's figure: HQ share and modes (toys) or FID (images), as its run's mean over seeds."""
    if row is None:
        return "–"
    if toy:
        return f"{_mean(row, 'modes'):.1f} modes at {_mean(row, 'hq'):.3f}"
    return f"{_mean(row, 'fid'):.1f}"


def table_row(row: Row, number: int) -> str:
    path = QUALITY / row.json
    if not path.is_file():
        raise SystemExit(
            f"{path.relative_to(ROOT)} is missing: run `{row.command} --out X`, then copy X/table.json there"
        )
    data = json.loads(path.read_text())
    methods = {r["method"]: r for r in data["rows"]}
    toy = "hq" in methods["grid"]
    plain = methods.get("plain") or next((r for m, r in methods.items() if m.startswith("plain")), None)
    best, mixed = methods.get("indep-best"), methods.get("indep-mix")
    independent = "–" if best is None else f"{_figure(best, toy)} · {_figure(mixed, toy)}"
    # On the regions: mixed by the grid's ensemble search where the run has it, else by data share.
    regions = methods.get("indep-regions-search")
    by = ""
    if regions is None and "indep-regions" in methods:
        regions, by = methods["indep-regions"], " (by data share)"
    memorization = _mean(methods["grid"], "memorization")
    rates = data.get("rates")
    swept = "each its best of " + ", ".join(_rate(r) for r in rates) if rates else "the grid's (not tuned)"
    cells = [
        f"{row.label} [{number}]",
        "modes at HQ share ↑" if toy else "FID ↓",
        _figure(methods["grid"], toy),
        _figure(plain, toy),
        independent,
        _figure(regions, toy) + by,
        "–" if memorization is None else f"{memorization:.2f}",
        str(len(data["seeds"])),
        swept,
    ]
    return "| " + " | ".join(cells) + " |"


def table() -> str:
    lines = [BEGIN, HEADER]
    lines += [table_row(row, n) for n, row in enumerate(ROWS, 1)]
    lines.append("")
    lines += [f"[{n}] [{row.json}](docs/quality/{row.json}): `{row.command}`  " for n, row in enumerate(ROWS, 1)]
    lines[-1] = lines[-1].rstrip()
    lines.append(END)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with README.md's table instead of printing")
    args = parser.parse_args()
    made = table()
    if not args.check:
        print(made)
        return 0
    readme = (ROOT / "README.md").read_text()
    start, stop = readme.find(BEGIN), readme.find(END)
    if start < 0 or stop < 0:
        print(f"README.md has no results table between {BEGIN!r} and {END!r}", file=sys.stderr)
        return 1
    if readme[start : stop + len(END)] != made:
        print(
            "README.md's results table differs from docs/quality/: paste `python benchmarks/headline.py`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
