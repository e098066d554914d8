"""The referee's table (benchmarks/quality.py): each method's mean ± spread over seeds, in Markdown,
as a plot and as JSON."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from referee_cases import Result

from palomino.scoring.memorization import MEMORIZING_BELOW


def summarise(results: list[Result]) -> list[dict[str, Any]]:
    rows = []
    for case in dict.fromkeys(r.case for r in results):
        for method in dict.fromkeys(r.method for r in results if r.case == case):
            mine = [r for r in results if r.case == case and r.method == method]
            row: dict[str, Any] = {
                "case": case,
                "method": method,
                "seeds": len(mine),
                "steps": mine[0].steps,
                "seconds": float(np.mean([r.seconds for r in mine])),
            }
            if mine[0].rate is not None:  # a sweep: the rate each seed's validation split chose
                row["lr"] = [r.rate for r in mine]
            for key in mine[0].scores:
                values = [r.scores[key] for r in mine]
                row[key] = {
                    "mean": float(np.mean(values)),
                    "sd": float(np.std(values)),
                    "min": float(np.min(values)),
                    "values": values,
                }
            if "memorization" in row:  # FID cannot tell copies of the training images from new ones
                row["memorizing"] = row["memorization"]["mean"] < MEMORIZING_BELOW
            rows.append(row)
    return rows


MEMORIZATION_LEGEND = (
    "memorization: median distance of a sample to its nearest training image over that of a held-out image "
    f"(pixels in [-1, 1]; about 1 for new images); ! = below {MEMORIZING_BELOW}: memorizing"
)


def format_table(rows: list[dict[str, Any]]) -> str:
    keys = [
        k
        for k in ("modes", "hq", "cell_modes", "union", "used", "fid", "tvd", "memorization")
        if any(k in r for r in rows)
    ]
    width = max([12, *(len(r["case"]) + 2 for r in rows)])  # fashion-full-12x12 and the like
    lines = [
        f"{'case':<{width}}{'method':<21}{'seeds':>6}"
        + "".join(f"{k:>16}" for k in keys)
        + f"{'G+D steps':>12}{'wall s':>9}"
    ]

    def cell(r: dict[str, Any], k: str) -> str:
        if k not in r:
            return f"{'':>16}"
        flag = "!" if k == "memorization" and r.get("memorizing") else " "
        return f"{r[k]['mean']:>9.3f}{flag}±{r[k]['sd']:<5.3f}"

    for r in rows:
        cells = "".join(cell(r, k) for k in keys)
        rates = "  lr " + ",".join(f"{x:g}" for x in r["lr"]) if "lr" in r else ""
        lines.append(
            f"{r['case']:<{width}}{r['method']:<21}{r['seeds']:>6}{cells}{r['steps']:>12}{r['seconds']:>9.0f}{rates}"
        )
    if "memorization" in keys:
        lines.append(MEMORIZATION_LEGEND)
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(1, len(cases), figsize=(4 * len(cases), 3.2), squeeze=False)
    for ax, case in zip(axes[0], cases):
        mine = [r for r in rows if r["case"] == case]
        key = "hq" if "hq" in mine[0] else "fid"
        ax.bar(
            [r["method"] for r in mine],
            [r[key]["mean"] for r in mine],
            yerr=[r[key]["sd"] for r in mine],
            color="#5b8def",
        )
        if key == "hq":
            for i, r in enumerate(mine):
                ax.text(
                    i, r[key]["mean"] / 2, f"{r['modes']['mean']:.1f}\nmodes", ha="center", fontsize=7, color="white"
                )
        if key == "fid":  # a collapsed baseline is 10-20× the others: on a linear axis they vanish
            ax.set_yscale("log")
            ax.set_ylim(10, 2 * max(r[key]["mean"] for r in mine))
            for i, r in enumerate(mine):
                flag = " memorizing" if r.get("memorizing") else ""
                ax.text(i, r[key]["mean"] * 1.08, f"{r[key]['mean']:.0f}{flag}", ha="center", fontsize=7)
        ax.set_title(f"{case} ({key}; {mine[0]['seeds']} seeds)")
        ax.tick_params(axis="x", labelsize=8, labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def shown(scores: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in scores.items())


def report(r: Result, prefix: str = "") -> None:
    at = "" if r.rate is None else f" lr {r.rate:g}"
    print(
        f"{r.case} seed {r.seed} {r.method}{at}: {prefix}{shown(r.scores)} ({r.steps} steps, {r.seconds:.0f} s)",
        file=sys.stderr,
        flush=True,
    )


def write_table(out: Path, header: dict[str, Any], results: list[Result], swept: list[Result]) -> list[dict[str, Any]]:
    """table.json in `out`: how the referee was run, a row per method over the seeds so far, every
    swept rate's results; `header["finished"]`: True, or the [case, seed] pairs done so far."""
    rows = summarise(results)
    table = {**header, "rows": rows, "sweep": [asdict(r) for r in swept]}
    (out / "table.json").write_text(json.dumps(table, indent=2))
    return rows
