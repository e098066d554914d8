"""One iteration of a group of cells, in one order: each cell's neighbourhood and fitness draw,
fitness all against all, selection, training, re-evaluation, replacement, the mixture's draw,
score and (1+1)-ES, the report. A lone cell (`Cell.iterate`) and a tile (`Tile.iterate`) both go
through `iterate`; they differ only in their `Kernels`, which compute the group's costly parts —
a lone cell's one by one (`OneByOne`, the numbers of `tiles: off`), a tile's stacked (tile.py).
What a cell decides on its own (selection, replacement, the ES) is its own method, called here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from palomino.grid import Coord
from palomino.wire import Snapshot

if TYPE_CHECKING:  # cell.py calls this module: its types only for the annotations
    from palomino.coevolution.cell import Cell, IterationReport, MixtureDraw, Prepared, Selected
    from palomino.coevolution.ensemble_search import FrechetScore
    from palomino.coevolution.mixture_weights import MixtureScore
    from palomino.coevolution.training import Steps

# How the cells' own parts run: `map`, or a thread pool's (a CPU tile's workers).
Run = Callable[..., Iterable[Any]]
Tables = tuple[list[Tensor], Tensor, Tensor]  # (fakes, generator table, discriminator table)


class Kernels(Protocol):
    """The group's fitness, training, re-evaluation and mixture scores, each as one call."""

    clones: bool  # selection hands over clones of its winners (a tile's training copies them instead)

    def local(self, cells: Sequence[Cell]) -> Mapping[Coord, Cell] | None:
        """Cells whose individuals a neighbour may read in place (no copy from their snapshots)."""

    def fitness(self, cells: Sequence[Cell], prepared: list[Prepared], run: Run) -> list[Tables]: ...

    def train(self, cells: Sequence[Cell], selected: list[Selected], run: Run) -> list[Steps]: ...

    def re_evaluate(self, cells: Sequence[Cell], selected: list[Selected], run: Run) -> list[tuple[Tensor, Tensor]]: ...

    def mixtures(
        self, cells: Sequence[Cell], draws: list[MixtureDraw], run: Run
    ) -> list[MixtureScore | FrechetScore]: ...


class OneByOne:
    """Each cell's parts on its own, as a cell alone computes them."""

    clones = True

    def local(self, cells: Sequence[Cell]) -> None:
        return None

    def fitness(self, cells: Sequence[Cell], prepared: list[Prepared], run: Run) -> list[Tables]:
        return list(run(lambda a: a[0].fitness(a[1]), zip(cells, prepared)))

    def train(self, cells: Sequence[Cell], selected: list[Selected], run: Run) -> list[Steps]:
        return list(run(lambda a: a[0].train(a[1]), zip(cells, selected)))

    def re_evaluate(self, cells: Sequence[Cell], selected: list[Selected], run: Run) -> list[tuple[Tensor, Tensor]]:
        return list(run(lambda a: a[0].re_evaluate(a[1]), zip(cells, selected)))

    def mixtures(self, cells: Sequence[Cell], draws: list[MixtureDraw], run: Run) -> list[MixtureScore | FrechetScore]:
        return list(run(lambda a: a[0].mixture_of(a[1]), zip(cells, draws)))


ONE_BY_ONE = OneByOne()


def select(
    cells: Sequence[Cell], neighbours: Mapping[Coord, Mapping[Coord, Snapshot]], kernels: Kernels, run: Run = map
) -> list[Selected]:
    """The iteration up to training: each cell's neighbourhood, the fitness, then selection.
    `neighbours[cell]`: that cell's neighbours' snapshots (one per neighbour at most)."""
    local = kernels.local(cells)
    prepared = list(run(lambda cell: cell.prepare(neighbours[cell.coord], local), cells))
    tables = kernels.fitness(cells, prepared, run)
    return list(run(lambda a: a[0].choose(a[1], *a[2], clone=kernels.clones), zip(cells, prepared, tables)))


def iterate(
    cells: Sequence[Cell], neighbours: Mapping[Coord, Mapping[Coord, Snapshot]], kernels: Kernels, run: Run = map
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
