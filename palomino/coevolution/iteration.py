"""One iteration of a group of cells, in one order: each cell's neighbourhood and fitness draw,
fitness all against all, selection, training, re-evaluation, replacement, the mixture's draw,
score and (1+1)-ES, the report. A lone cell (`Cell.iterate`) and a tile (`Tile.iterate`) both go
through `iterate`; they differ only in their `Kernels`, which compute the group's costly parts —
a lone cell's one by one (`OneByOne`, the numbers of `tiles: off`), a tile's stacked (tile.py).
What a cell decides on its own (selection, replacement, the ES) is its own method, called here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from palomino.coevolution.ensemble_search import FrechetScore
from palomino.coevolution.individual import Individual
from palomino.coevolution.mixture_weights import MixtureScore
from palomino.coevolution.training import Steps
from palomino.grid import Coord
from palomino.wire import Snapshot

# How the cells' own parts run: `map`, or a thread pool's (a CPU tile's workers).
Run = Callable[..., Iterable[Any]]
Tables = tuple[list[Tensor], Tensor, Tensor]  # (fakes, generator table, discriminator table)


# ---- what an iteration carries from one part to the next ----------------------------


@dataclass
class IterationReport:
    """What one iteration of one cell did: one line of metrics.jsonl (without timings)."""

    iteration: int
    cell: Coord
    epoch: int
    generator: dict[str, float]
    discriminator: dict[str, float]
    losses_used: dict[str, int]
    score: float
    mixture: dict[str, float]
    neighbours: dict[str, int]
    label: int | None = None  # the class of a partitioned run's cell
    steps: dict[str, int] | None = None  # optimiser steps taken: {"generator": n, "discriminator": m}

    def to_json(self) -> dict[str, Any]:
        record = {
            "iteration": self.iteration,
            "cell": list(self.cell),
            "epoch": self.epoch,
            "generator": self.generator,
            "discriminator": self.discriminator,
            "losses_used": self.losses_used,
            "score": self.score,
            "mixture": self.mixture,
            "neighbours": self.neighbours,
        }
        if self.label is not None:
            record["class"] = self.label
        if self.steps is not None:
            record["steps"] = self.steps
        return record


@dataclass
class Prepared:
    """An iteration before its fitness: the neighbourhood as individuals (the cell's own first)
    and the fitness draw."""

    others: list[Coord]  # the neighbours heard from
    foreign_g: list[Individual]
    all_g: list[Individual]
    all_d: list[Individual]
    draw: FitnessDraw
    heard: dict[str, int]  # neighbour → the iteration of its snapshot


@dataclass
class Selected:
    """An iteration between selection and training: the sub-populations to train, and what
    re-evaluation reuses (the fitness draw, the first fakes)."""

    generators: list[Individual]
    discriminators: list[Individual]
    others: list[Coord]  # the neighbours heard from
    foreign_g: list[Individual]
    all_d: list[Individual]
    draw: FitnessDraw
    fakes: list[torch.Tensor]
    heard: dict[str, int]  # neighbour → the iteration of its snapshot
    # Opponents that train nothing (selection off: the neighbours' copies, after the cell's own).
    frozen_g: list[Individual] = field(default_factory=list)
    frozen_d: list[Individual] = field(default_factory=list)


@dataclass
class MixtureDraw:
    """A neighbourhood mixture's components, weights so far, and the samples its score uses."""

    keys: list[str]
    weights: np.ndarray
    generators: list[Individual]
    z: torch.Tensor
    labels: torch.Tensor | None
    real: torch.Tensor


@dataclass
class FitnessDraw:
    """One shared draw for an iteration's fitness: noise, real samples and (conditional) labels."""

    z: torch.Tensor
    real: torch.Tensor
    labels: torch.Tensor | None


class Member(Protocol):
    """A cell as an iteration sees it (cell.py's `Cell`): its own parts, in the order `iterate` calls them."""

    coord: Coord

    def prepare(self, neighbours: Mapping[Coord, Snapshot], local: Mapping[Coord, Any] | None = None) -> Prepared: ...

    def fitness(self, prepared: Prepared) -> Tables: ...

    def choose(
        self, prepared: Prepared, fakes: list[Tensor], g_table: Tensor, d_table: Tensor, *, clone: bool = True
    ) -> Selected: ...

    def train(self, selected: Selected) -> Steps: ...

    def re_evaluate(self, selected: Selected) -> tuple[Tensor, Tensor]: ...

    def replace(self, selected: Selected, g_table: Tensor, d_table: Tensor) -> None: ...

    def mixture_draw(self, selected: Selected) -> MixtureDraw: ...

    def mixture_of(self, draw: MixtureDraw) -> MixtureScore | FrechetScore: ...

    def apply_mixture(self, draw: MixtureDraw, score: MixtureScore | FrechetScore) -> None: ...

    def conclude(self, selected: Selected, steps: Steps) -> IterationReport: ...


class Kernels(Protocol):
    """The group's fitness, training, re-evaluation and mixture scores, each as one call."""

    clones: bool  # selection hands over clones of its winners (a tile's training copies them instead)

    def local(self, cells: Sequence[Member]) -> Mapping[Coord, Member] | None:
        """Cells whose individuals a neighbour may read in place (no copy from their snapshots)."""

    def fitness(self, cells: Sequence[Member], prepared: list[Prepared], run: Run) -> list[Tables]: ...

    def train(self, cells: Sequence[Member], selected: list[Selected], run: Run) -> list[Steps]: ...

    def re_evaluate(
        self, cells: Sequence[Member], selected: list[Selected], run: Run
    ) -> list[tuple[Tensor, Tensor]]: ...

    def mixtures(
        self, cells: Sequence[Member], draws: list[MixtureDraw], run: Run
    ) -> list[MixtureScore | FrechetScore]: ...


class OneByOne:
    """Each cell's parts on its own, as a cell alone computes them."""

    clones = True

    def local(self, cells: Sequence[Member]) -> None:
        return None

    def fitness(self, cells: Sequence[Member], prepared: list[Prepared], run: Run) -> list[Tables]:
        return list(run(lambda a: a[0].fitness(a[1]), zip(cells, prepared)))

    def train(self, cells: Sequence[Member], selected: list[Selected], run: Run) -> list[Steps]:
        return list(run(lambda a: a[0].train(a[1]), zip(cells, selected)))

    def re_evaluate(self, cells: Sequence[Member], selected: list[Selected], run: Run) -> list[tuple[Tensor, Tensor]]:
        return list(run(lambda a: a[0].re_evaluate(a[1]), zip(cells, selected)))

    def mixtures(
        self, cells: Sequence[Member], draws: list[MixtureDraw], run: Run
    ) -> list[MixtureScore | FrechetScore]:
        return list(run(lambda a: a[0].mixture_of(a[1]), zip(cells, draws)))


ONE_BY_ONE = OneByOne()


def select(
    cells: Sequence[Member], neighbours: Mapping[Coord, Mapping[Coord, Snapshot]], kernels: Kernels, run: Run = map
) -> list[Selected]:
    """The iteration up to training: each cell's neighbourhood, the fitness, then selection.
    `neighbours[cell]`: that cell's neighbours' snapshots (one per neighbour at most)."""
    local = kernels.local(cells)
    prepared = list(run(lambda cell: cell.prepare(neighbours[cell.coord], local), cells))
    tables = kernels.fitness(cells, prepared, run)
    return list(run(lambda a: a[0].choose(a[1], *a[2], clone=kernels.clones), zip(cells, prepared, tables)))


def iterate(
    cells: Sequence[Member], neighbours: Mapping[Coord, Mapping[Coord, Snapshot]], kernels: Kernels, run: Run = map
) -> list[IterationReport]:
    """One iteration of every cell; the reports in the cells' order."""
    selected = select(cells, neighbours, kernels, run)
    steps = kernels.train(cells, selected, run)
    tables = kernels.re_evaluate(cells, selected, run)
    list(run(lambda a: a[0].replace(a[1], *a[2]), zip(cells, selected, tables)))
    draws = list(run(lambda a: a[0].mixture_draw(a[1]), zip(cells, selected)))
    scores = kernels.mixtures(cells, draws, run)
    list(run(lambda a: a[0].apply_mixture(*a[1:]), zip(cells, draws, scores)))
    return list(run(lambda a: a[0].conclude(*a[1:]), zip(cells, selected, steps)))
