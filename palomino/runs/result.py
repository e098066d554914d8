"""A run's result: every cell's neighbourhood mixture scored and ranked, the best saved to result/,
each one to result/cells/<r>-<c>/.

`cell_result` runs where the cell is (torch); `write_result` wherever the run directory is
(the embedded trainer, or the torch-free orchestrator from cells' `done` messages).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from palomino.runs.checkpoints import atomic_write
from palomino.runs.directory import RunDirectory

if TYPE_CHECKING:
    from palomino.coevolution import Cell
    from palomino.data import Dataset
    from palomino.grid import Coord
    from palomino.wire import Snapshot

FINAL_SCORE_SAMPLES = 2000


@dataclass
class CellResult:
    cell: str
    score: float  # MMD² on FINAL_SCORE_SAMPLES samples, lower is better
    components: list[str]
    weights: list[float]
    payload: bytes = field(repr=False)  # the mixture's components, safetensors
    description: dict[str, Any] = field(default_factory=dict)  # mixture.json
    samples_png: bytes = field(default=b"", repr=False)


def save_encoded(folder: Path, payload: bytes, description: dict[str, Any]) -> None:
    """Write mixture.safetensors + mixture.json from their encoded forms (torch-free)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "mixture.safetensors", payload)
    atomic_write(folder / "mixture.json", json.dumps(description, indent=2).encode())


def cell_result(cell: Cell, snapshots: Mapping[Coord, Snapshot], dataset: Dataset, experiment: str) -> CellResult:
    """Score a cell's neighbourhood mixture as it sees it now, on a larger sample than in training."""
    import numpy as np

    from palomino.runs.images import picture_of, png_bytes
    from palomino.runs.mixture import Mixture

    parts = cell.neighbourhood_mixture(snapshots)
    weights = np.array([w for _, w, _ in parts])
    score = cell.mixture_score([ind for _, _, ind in parts], FINAL_SCORE_SAMPLES)(weights)
    mixture = Mixture(
        generators=[ind.network for _, _, ind in parts],
        weights=weights,
        components=[key for key, _, _ in parts],
        network=cell.config.network,
        sample_shape=dataset.sample_shape,
        kind=dataset.kind,
        info={"cell": str(cell.coord), "score": score, "score_name": "mmd2", "data": cell.config.data.name, "experiment": experiment},
    )
    payload, description = mixture.encode()
    samples = mixture.sample(64 if dataset.kind == "image" else 2500, seed=cell.config.seed)
    png = png_bytes(picture_of(samples, dataset.kind, dataset.modes))
    return CellResult(str(cell.coord), score, mixture.components, weights.tolist(), payload, description, png)


def write_result(run: RunDirectory, results: list[CellResult]) -> CellResult:
    """Rank the cells' mixtures; the best becomes result/mixture.* and result/samples.png."""
    ranked = sorted(results, key=lambda r: r.score)
    best = ranked[0]
    save_encoded(run.result_dir, best.payload, best.description)
    for result in ranked:  # every neighbourhood mixture, for the scorer and the dashboard
        save_encoded(run.result_dir / "cells" / result.cell, result.payload, result.description)
    ranking = [{"cell": r.cell, "score": r.score, "components": r.components, "weights": r.weights} for r in ranked]
    atomic_write(
        run.result_dir / "ranking.json",
        json.dumps({"score": "mmd2 (lower is better)", "ranking": ranking}, indent=2).encode(),
    )
    if best.samples_png:
        atomic_write(run.result_dir / "samples.png", best.samples_png)
    return best
