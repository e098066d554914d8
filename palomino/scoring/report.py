"""scores.json as a table for the terminal (rich)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

HEADERS = {"fid": "FID ↓", "is": "IS ↑", "kid": "KID ×10³ ↓", "tvd": "TVD ↓", "modes": "modes ↑ (high quality)"}


def format_metric(name: str, result: dict[str, Any]) -> str:
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
    return f"{value:.3f}" if name == "tvd" else f"{value:.2f}"


def scores_table(report: dict[str, Any]) -> Table:
    """One row per mixture (the best first, then each cell's neighbourhood mixture), one column per metric."""
    names = report["metrics"]
    extractor = report.get("extractor") or "none"
    table = Table(title=f"{report['run']}: {report['samples']:,} samples per mixture, extractor {extractor}")
    table.add_column("mixture")
    for name in names:
        table.add_column(HEADERS.get(name, name), justify="right")
    table.add_column("s", justify="right")
    cell = report["best"].get("cell")  # None for a partitioned run's class mixture
    rows = [(f"best ({cell})" if cell else "best", report["best"]), *sorted(report["cells"].items())]
    for label, scores in rows:
        table.add_row(label, *(format_metric(n, scores["metrics"][n]) for n in names), f"{scores['seconds']:.1f}")
    for name in names:
        why = report["best"]["metrics"][name].get("not_applicable")
        if why:
            table.caption = (table.caption + "; " if table.caption else "") + why
    return table
