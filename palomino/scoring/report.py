"""scores.json as a table for the terminal (rich)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from palomino.scoring.memorization import MEMORIZING_BELOW

HEADERS = {
    "fid": "FID ↓",
    "is": "IS ↑",
    "kid": "KID ×10³ ↓",
    "tvd": "TVD ↓",
    "modes": "modes ↑ (high quality)",
    "hit": "hit ↑",
    "memorization": "memorization ratio",
}
MEMORIZATION_LEGEND = (
    "memorization ratio: median distance of a sample to its nearest training image over that of a "
    f"held-out image (pixels; about 1 for new images); ! = below {MEMORIZING_BELOW}: memorizing"
)


def format_metric(name: str, result: dict[str, Any] | None) -> str:
    if result is None:  # a column of one-class scores on a row that is not one
        return ""
    if result.get("not_applicable"):
        return "n/a"
    value = result.get("value")
    if value is None:
        return "–"
    if name == "kid":
        return f"{value * 1e3:.2f} ± {result['std'] * 1e3:.2f}"
    if name == "is":
        return f"{value:.2f} ± {result['std']:.2f}"
    if name == "modes":
        return f"{value}/{result['modes']} ({result['high_quality']:.0%})"
    if name == "hit":
        return f"{value:.1%}"
    if name == "memorization":  # flagged, not ranked: 1 is right, below copies, above strays from the data
        return f"{value:.2f}" + (" !" if result.get("memorizing") else "")
    return f"{value:.3f}" if name == "tvd" else f"{value:.2f}"


def _rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, scores) of the best mixture, then each class's (a partitioned or conditional run), then each cell's."""
    cell = report["best"].get("cell")  # None for a partitioned run's class mixture
    classes = report.get("classes") or {}
    if cell:
        best = f"best ({cell})"
    else:
        best = "class mixture" if classes else "best"
    rows = [(best, report["best"])]
    for label, scores in sorted(classes.items(), key=lambda item: int(item[0])):
        where = f"{scores['cell']}, drawn for {label}" if "drawn_for" in scores else scores.get("cell")
        rows.append((f"class {label} ({where})" if where else f"class {label}", scores))
    for name, scores in sorted(report["cells"].items()):
        rows.append((f"{name} (class {scores['class']})" if "class" in scores else name, scores))
    return rows


def scores_table(report: dict[str, Any]) -> Table:
    """One row per mixture (the best first, then each class's best for a partitioned or conditional run,
    then each cell's neighbourhood mixture), one column per metric; one-class rows add `hit`."""
    names = list(report["metrics"])
    names += [n for n in report.get("class_metrics", []) if n not in names]
    extractor = report.get("extractor") or "none"
    table = Table(title=f"{report['run']}: {report['samples']:,} samples per mixture, extractor {extractor}")
    table.add_column("mixture")
    for name in names:
        table.add_column(HEADERS.get(name, name), justify="right")
    table.add_column("s", justify="right")
    reasons: list[str] = []
    for label, scores in _rows(report):
        metrics = scores["metrics"]
        table.add_row(label, *(format_metric(n, metrics.get(n)) for n in names), f"{scores['seconds']:.1f}")
        for name in names:
            why = (metrics.get(name) or {}).get("not_applicable")
            if why and why not in reasons:
                reasons.append(why)
    if "memorization" in names:
        reasons.insert(0, MEMORIZATION_LEGEND)
    if reasons:
        table.caption = "; ".join(reasons)
    return table
