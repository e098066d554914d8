"""A run's result: every cell's neighbourhood mixture scored and ranked, the best saved to result/,
each one to result/cells/<r>-<c>/.

A partitioned run (cells whose mixtures carry a "class") ranks each class's cells apart: the
best of class c goes to result/classes/<c>/, and result/mixture.json describes the class
mixture p(x) = Σ_c p(c) p(x | c) over them, p(c) the class's share of the training data.

Torch-free: `write_result` runs wherever the run directory is (the embedded trainer, or the
torch-free orchestrator from cells' `done` messages); the results it writes are made where the
cells are (palomino.runs.finish, torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palomino.io import atomic_write
from palomino.runs.directory import RunDirectory
from palomino.runs.filter_rule import FilterRule

CLASS_MIXTURE = "class_mixture"  # result/mixture.json's "type" for a partitioned run


@dataclass
class CellResult:
    cell: str
    score: float  # MMD² (or FID: mixture.score) on palomino.runs.finish.FINAL_SCORE_SAMPLES samples, lower is better
    components: list[str]
    weights: list[float]
    payload: bytes = field(repr=False)  # the mixture's components, safetensors
    description: dict[str, Any] = field(default_factory=dict)  # mixture.json
    samples_png: bytes = field(default=b"", repr=False)
    # Where the cell trained when it finished: its own generator's name among `components` (a
    # shrink may since have moved the result to another coordinate, `cell`).
    trained_at: str = ""


def save_encoded(folder: Path, payload: bytes, description: dict[str, Any]) -> None:
    """Write mixture.safetensors + mixture.json from their encoded forms (torch-free)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "mixture.safetensors", payload)
    atomic_write(folder / "mixture.json", json.dumps(description, indent=2).encode())


def read_encoded(folder: Path) -> tuple[bytes, dict[str, Any]]:
    """mixture.safetensors' bytes and mixture.json, as `save_encoded` wrote them (torch-free)."""
    return (folder / "mixture.safetensors").read_bytes(), json.loads((folder / "mixture.json").read_text())


def write_result(run: RunDirectory, results: list[CellResult], ensemble: CellResult | None = None) -> CellResult:
    """Rank the cells' neighbourhood mixtures into result/cells/ and ranking.json; result/mixture.*
    and samples.png hold `ensemble` (the whole grid's, see palomino.runs.grid_ensemble) when given,
    else the best neighbourhood mixture. Returns what result/ holds.

    A partitioned run's results (their mixtures carry a "class") go to `write_class_result`;
    the best-scoring class's best is returned then."""
    if any("class" in r.description for r in results):
        return min(write_class_result(run, results).values(), key=lambda r: r.score)
    ranked = sorted(results, key=lambda r: r.score)
    chosen = ensemble or ranked[0]
    save_encoded(run.result_dir, chosen.payload, chosen.description)
    for result in ranked:  # every neighbourhood mixture, for the scorer and the dashboard
        save_encoded(run.result_dir / "cells" / result.cell, result.payload, result.description)
    ranking: dict[str, Any] = {
        "score": f"{ranked[0].description.get('score_name', 'mmd2')} (lower is better)",
        "ranking": [
            {"cell": r.cell, "score": r.score, "components": r.components, "weights": r.weights} for r in ranked
        ],
    }
    if ensemble is not None:
        ranking["ensemble"] = ensemble.description.get("ensemble", {})
    atomic_write(run.ranking_path, json.dumps(ranking, indent=2).encode())
    if chosen.samples_png:
        atomic_write(run.result_samples_path, chosen.samples_png)
    return chosen


def grid_components(results: list[CellResult], experiment: str) -> tuple[bytes, dict[str, Any]]:
    """Every cell's own generator, cut out of its neighbourhood mixture, as one equal-weight mixture
    (safetensors bytes, mixture.json): what a distributed run's scorer optimises into the grid's
    ensemble. Torch-free (safetensors' numpy side), for the orchestrator."""
    from safetensors.numpy import load, save

    ordered = sorted(results, key=lambda r: r.cell)
    # Each cell's own discriminator too, where every cell sent one (training.ensemble.critic_quantile).
    with_critics = all(len(r.description.get("critics", [])) == 1 for r in ordered)
    tensors = {}
    for i, result in enumerate(ordered):
        name = result.trained_at or result.cell
        if name not in result.components:
            raise ValueError(f"cell {result.cell}'s mixture has no component {name} (it has {result.components})")
        prefix = f"component.{result.components.index(name)}."
        stored = load(result.payload)
        own = {k[len(prefix) :]: v for k, v in stored.items() if k.startswith(prefix)}
        if not own:
            raise ValueError(f"cell {result.cell}'s mixture holds no generator of its own")
        tensors.update({f"component.{i}.{k}": v for k, v in own.items()})
        if with_critics:
            critic = {k[len("critic.0.") :]: v for k, v in stored.items() if k.startswith("critic.0.")}
            if not critic:
                raise ValueError(f"cell {result.cell}'s mixture names a discriminator it does not hold")
            tensors.update({f"critic.{i}.{k}": v for k, v in critic.items()})
    first = ordered[0].description
    description = {
        "weights": [1.0 / len(ordered)] * len(ordered),
        "components": [r.cell for r in ordered],
        **{key: first[key] for key in ("network", "sample_shape", "kind", "data") if key in first},
        "cell": "grid",
        "experiment": experiment,
        "iteration": min(int(r.description.get("iteration", 0)) for r in ordered),
    }
    if with_critics:
        description["critics"] = [r.cell for r in ordered]
    return save(tensors), description


def write_ensemble(
    run: RunDirectory, payload: bytes, description: dict[str, Any], summary: dict[str, Any], png: bytes
) -> None:
    """result/ becomes the grid's ensemble: `description` with the optimised weights of `summary`."""
    description = {
        **description,
        "weights": summary["weights"],
        "score": summary["held_out_score"],
        "score_name": summary["score_name"],
        "ensemble": summary,
    }
    rule = summary.get("filter")
    if rule is not None:  # the scorer's calibration of the critics that result/grid carries
        components, critics = description.get("components") or [], description.get("critics") or []
        description["filter"] = FilterRule.checked(rule, components, critics).encode()
    save_encoded(run.result_dir, payload, description)
    ranking_path = run.ranking_path
    ranking = json.loads(ranking_path.read_text()) if ranking_path.exists() else {}
    atomic_write(ranking_path, json.dumps({**ranking, "ensemble": summary}, indent=2).encode())
    if png:
        atomic_write(run.result_samples_path, png)


def write_class_result(
    run: RunDirectory, results: list[CellResult], labels: list[int] | None = None
) -> dict[int, CellResult]:
    """A partitioned run's result/ (torch-free): each class's best mixture in classes/<c>/, every
    cell's in cells/<r>-<c>/, the class mixture in mixture.json, ranking.json class by class,
    and samples.png with each class's samples side by side. `labels`: the classes that must be
    there (ValueError naming the first without a result). Returns label → its best result."""
    by_class: dict[int, list[CellResult]] = {}
    for result in results:
        if "class" not in result.description:
            raise ValueError(f"cell {result.cell}'s mixture has no class: not a partitioned run's result")
        by_class.setdefault(int(result.description["class"]), []).append(result)
    missing = sorted(set(labels or []) - set(by_class))
    if missing:
        raise ValueError(f"class {missing[0]} has no result: every cell of its sub-grid was lost")
    best = {label: min(group, key=lambda r: r.score) for label, group in sorted(by_class.items())}
    total = sum(int(r.description["class_count"]) for r in best.values())
    for result in results:
        save_encoded(run.result_dir / "cells" / result.cell, result.payload, result.description)
    classes: dict[str, Any] = {}
    for label, result in best.items():
        folder = run.result_dir / "classes" / str(label)
        save_encoded(folder, result.payload, result.description)
        if result.samples_png:
            atomic_write(folder / "samples.png", result.samples_png)
        count = int(result.description["class_count"])
        classes[str(label)] = {
            "path": f"classes/{label}",
            "prior": count / total,
            "count": count,
            "cell": result.cell,
            "score": result.score,
        }
    first = best[min(best)].description
    description = {
        "type": CLASS_MIXTURE,
        "classes": classes,
        "kind": first.get("kind"),
        "sample_shape": first.get("sample_shape"),
        "network": first.get("network"),
        "data": first.get("data"),
        "experiment": first.get("experiment"),
        "score_name": first.get("score_name", "mmd2"),
    }
    atomic_write(run.result_dir / "mixture.json", json.dumps(description, indent=2).encode())
    ranking = {
        "score": "mmd2 (lower is better; compare cells of one class only)",
        "ranking": [
            {"cell": r.cell, "class": label, "score": r.score, "components": r.components, "weights": r.weights}
            for label, group in sorted(by_class.items())
            for r in sorted(group, key=lambda r: r.score)
        ],
    }
    atomic_write(run.ranking_path, json.dumps(ranking, indent=2).encode())
    pictures = [r.samples_png for r in best.values() if r.samples_png]
    if pictures:
        from palomino.runs.images import tile_pngs

        atomic_write(run.result_samples_path, tile_pngs(pictures))
    return best
