"""A cell as others see it (its snapshot) and as it resumes (its checkpoint state).

What these read and write of a cell is `CellParts` (palomino.coevolution.cell.Cell has them):
this module needs no Cell, and cell.py imports it without a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from palomino.coevolution.networks import tensors_on
from palomino.wire import IndividualMeta, Snapshot, SnapshotHeader
from palomino.wire.snapshot import DeferredTensors

if TYPE_CHECKING:
    from palomino.coevolution.cell_data import CellData
    from palomino.coevolution.individual import Population
    from palomino.grid import ClassGrid, Coord, Topology


class CellParts(Protocol):
    """What a cell's snapshot and checkpoint are made of."""

    experiment: str
    coord: Coord
    topology: Topology | ClassGrid
    device: torch.device
    iteration: int  # iterations completed
    generators: Population
    discriminators: Population
    mixture_weights: dict[str, float]
    score: float
    data: CellData
    rng: np.random.Generator
    torch_rng: torch.Generator


def snapshot(cell: CellParts, moments: bool = True) -> Snapshot:
    """The centre individuals as neighbours see them: iteration = last completed (−1 before any).
    Without `moments`, weights and buffers only: what neighbours use where no individual migrates
    (a third of the bytes of an MNIST perceptron cell: Adam keeps two moments a weight)."""
    g, d = cell.generators.best, cell.discriminators.best
    header = SnapshotHeader(
        experiment=cell.experiment,
        cell=tuple(cell.coord),
        epoch=cell.topology.epoch,
        iteration=cell.iteration - 1,
        generator=IndividualMeta(learning_rate=g.learning_rate, fitness=_finite(g.fitness), loss=g.loss),
        discriminator=IndividualMeta(learning_rate=d.learning_rate, fitness=_finite(d.fitness), loss=d.loss),
        mixture=dict(cell.mixture_weights),
        score=None if np.isnan(cell.score) else cell.score,
    )

    def tensors() -> dict[str, torch.Tensor]:
        return {**g.tensors("generator", moments), **d.tensors("discriminator", moments)}

    # A forward in training mode moves a BatchNorm's statistics in place: such a snapshot is
    # copied now; a perceptron's members are never written once they are members.
    moving = any(True for ind in (g, d) for _ in ind.network.buffers())
    return Snapshot(header, tensors() if moving else DeferredTensors(tensors))


def state(cell: CellParts) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Everything needed to resume the cell: tensors for safetensors, metadata for JSON."""
    tensors, data_meta = cell.data.state()
    tensors["rng.torch"] = cell.torch_rng.get_state()
    meta: dict[str, Any] = {
        "cell": list(cell.coord),
        "iteration": cell.iteration,
        "epoch": cell.topology.epoch,
        **data_meta,
        "rng": cell.rng.bit_generator.state,
        "mixture": cell.mixture_weights,
        "score": None if np.isnan(cell.score) else cell.score,
        "individuals": {},
    }
    for role, population in (("generator", cell.generators), ("discriminator", cell.discriminators)):
        for index, ind in enumerate(population):
            prefix = f"{role}.{index}"
            tensors.update(ind.tensors(prefix))
            meta["individuals"][prefix] = {
                "learning_rate": ind.learning_rate,
                "fitness": _finite(ind.fitness),
                "loss": ind.loss,
                "origin": ind.origin,
            }
    return tensors, meta


def restore(cell: CellParts, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Inverse of `state`; raises ValueError if the checkpoint does not fit the cell."""
    for role, population in (("generator", cell.generators), ("discriminator", cell.discriminators)):
        for index, ind in enumerate(population):
            prefix = f"{role}.{index}"
            info = meta["individuals"][prefix]
            ind.learning_rate = info["learning_rate"]
            ind.load_tensors(tensors_on(cell.device, tensors, prefix + "."), prefix)
            ind.fitness, ind.loss, ind.origin = info["fitness"], info["loss"], info["origin"]
    cell.iteration = int(meta["iteration"])
    cell.data.restore(tensors, meta)
    cell.torch_rng.set_state(tensors["rng.torch"])
    cell.rng.bit_generator.state = meta["rng"]
    cell.mixture_weights = {str(k): float(v) for k, v in meta["mixture"].items()}
    cell.score = float("nan") if meta["score"] is None else float(meta["score"])


def adopt(cell: CellParts, published: Snapshot) -> None:
    """Take over the individuals a (dead) cell last published at this coordinate, and its progress.

    Newer than its checkpoint but partial: every individual of a population becomes a copy of
    the published centre one; data order and random streams stay this cell's own. A snapshot
    of weights only (no migration: neighbours never needed the moments) restarts Adam's moments.
    """
    header = published.header
    for role, population in (("generator", cell.generators), ("discriminator", cell.discriminators)):
        meta: IndividualMeta = getattr(header, role)
        for ind in population:
            ind.learning_rate, ind.fitness, ind.loss = meta.learning_rate, meta.fitness, meta.loss
            ind.load_tensors(tensors_on(cell.device, published.tensors, role + "."), role)  # sets the lr too
    cell.iteration = header.iteration + 1
    cell.mixture_weights = {str(k): float(v) for k, v in header.mixture.items()}
    cell.score = float("nan") if header.score is None else float(header.score)


def _finite(value: float) -> float:
    # JSON has no infinity; an unevaluated individual's fitness is written as a large number.
    return value if np.isfinite(value) else 1e30
