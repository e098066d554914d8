"""What a finished cell and a finished grid leave (torch, where the cells are): each cell's
neighbourhood mixture, scored, and the whole grid's ensemble, as the CellResults that
palomino.runs.result writes (torch-free) into result/.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from palomino.data import class_counts, class_priors
from palomino.runs.grid_ensemble import Features, grid_ensemble
from palomino.runs.images import picture_of, picture_samples, png_bytes
from palomino.runs.mixture import Mixture
from palomino.runs.result import CellResult

if TYPE_CHECKING:
    from palomino.coevolution import Cell
    from palomino.config import ExperimentConfig
    from palomino.data import Dataset
    from palomino.grid import Coord
    from palomino.wire import Snapshot

FINAL_SCORE_SAMPLES = 2000


def uses_critics(config: ExperimentConfig) -> bool:
    """Whether the grid's ensemble samples through the cells' discriminators (so each cell's
    result carries its own)."""
    return config.grid_ensemble and config.training.ensemble.critic_quantile > 0


def neighbourhood_mixture(
    cell: Cell, snapshots: Mapping[Coord, Snapshot], dataset: Dataset, experiment: str, score: bool = True
) -> Mixture:
    """A cell's neighbourhood mixture as it sees it now; `score`: its training score (MMD², or FID with
    training.mixture.score fid) on a larger sample than in training."""
    parts = cell.neighbourhood_mixture(snapshots)
    weights = np.array([w for _, w, _ in parts])
    info: dict[str, Any] = {
        "cell": str(cell.coord),
        "data": cell.config.data.name,
        "experiment": experiment,
        "iteration": cell.iteration,
    }
    if score:
        info.update(
            score=cell.mixture_score([ind for _, _, ind in parts], FINAL_SCORE_SAMPLES)(weights),
            score_name={"mmd": "mmd2", "fid": "fid-lipizzaner"}[cell.config.training.mixture.score],
        )
    if cell.label is not None:  # its class's samples in the training data: the class prior's numerator
        info.update({"class": cell.label, "class_count": class_counts(dataset)[cell.label]})
    critics = [cell.discriminators.best.network] if uses_critics(cell.config) else []
    return Mixture(
        critics=critics,
        critic_cells=[str(cell.coord)] if critics else [],
        generators=[ind.network for _, _, ind in parts],
        weights=weights,
        components=[key for key, _, _ in parts],
        network=cell.config.network,
        sample_shape=dataset.sample_shape,
        kind=dataset.kind,
        info=info,
        priors=class_priors(dataset) if cell.conditional else None,
        label_count=cell.label_count,
    )


def ensemble_result(
    cells: list[Cell], dataset: Dataset, experiment: str, features: Features | None = None
) -> CellResult:
    """The whole grid's ensemble (palomino.runs.grid_ensemble) as result/ holds it: every cell's generator
    (those it does not use at weight 0); mixture.json's "ensemble" says how it was chosen and scored.
    `features`: what images are scored on (see grid_ensemble); None: pixels."""
    config = cells[0].config
    cells = sorted(cells, key=lambda c: str(c.coord))  # the order grid_components gives a distributed run
    critics = [c.discriminators.best.network for c in cells] if uses_critics(config) else None
    grid = grid_ensemble(
        [c.generators.best.network for c in cells],
        [str(c.coord) for c in cells],
        dataset,
        config,
        cells[0].device,
        critics,
        features=features,
    )
    mixture = Mixture(
        generators=grid.generators,
        weights=grid.ensemble.weights,
        components=grid.cells,
        network=config.network,
        sample_shape=dataset.sample_shape,
        kind=dataset.kind,
        info={
            "cell": "grid",
            "data": config.data.name,
            "experiment": experiment,
            "iteration": min(c.iteration for c in cells),
            "score": grid.ensemble.held_out_score,
            "score_name": grid.score_name,
            "ensemble": grid.summary(),
        },
        critics=critics or [],
        critic_cells=grid.cells if critics else [],
    )
    grid.apply_filter(mixture)
    payload, description = mixture.encode()
    n = picture_samples(dataset.kind)
    png = png_bytes(picture_of(mixture.sample(n, seed=config.seed), dataset.kind, dataset.modes))
    weights = [float(w) for w in mixture.weights]
    return CellResult("grid", grid.ensemble.held_out_score, mixture.components, weights, payload, description, png)


def cell_result(cell: Cell, snapshots: Mapping[Coord, Snapshot], dataset: Dataset, experiment: str) -> CellResult:
    """A cell's final neighbourhood mixture, scored, with a picture of its samples."""
    mixture = neighbourhood_mixture(cell, snapshots, dataset, experiment)
    score = mixture.info["score"]
    payload, description = mixture.encode()
    n = picture_samples(dataset.kind)
    labels = cell.picture_labels(n)
    samples = mixture.sample(n, seed=cell.config.seed, labels=None if labels is None else labels.cpu())
    png = png_bytes(picture_of(samples, dataset.kind, dataset.modes))
    return CellResult(
        str(cell.coord), score, mixture.components, [float(w) for w in mixture.weights], payload, description, png
    )
