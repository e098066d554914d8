"""A tile: the cells one process hosts on one device, iterated in lockstep.

Each cell still selects, re-evaluates, replaces and evolves its mixture on its own (its
`select` and `complete`); the tile trains all of them between those two halves as one stack
(tile_training.py). Outside, nothing changes: each cell keeps its snapshot, checkpoint and
report, so tiled and untiled processes share a grid and resume each other's checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from palomino.coevolution.cell import Cell, IterationReport
from palomino.coevolution.tile_training import Lane, train_tile
from palomino.grid import Coord
from palomino.nn.stacked import stackable
from palomino.wire import Snapshot


class Tile:
    def __init__(self, cells: Sequence[Cell]) -> None:
        if not cells:
            raise ValueError("a tile needs at least one cell")
        first = cells[0]
        for cell in cells:
            if cell.device != first.device or cell.config is not first.config:
                raise ValueError(f"cell {cell.coord}: a tile's cells share one device and one experiment")
            if not all(stackable(ind.network) for ind in [*cell.generators, *cell.discriminators]):
                raise ValueError(f"cell {cell.coord}: its networks have no stacked form; train it with tiles: off")
        self.cells = list(cells)

    @property
    def iteration(self) -> int:
        """The iteration every cell is at (lockstep)."""
        return min(cell.iteration for cell in self.cells)

    def iterate(self, neighbours: Mapping[Coord, Mapping[Coord, Snapshot]]) -> list[IterationReport]:
        """One iteration of every cell; `neighbours[cell]` are that cell's neighbours' snapshots."""
        selected = [cell.select(neighbours[cell.coord]) for cell in self.cells]
        lanes = [
            Lane(cell.training, chosen.generators, chosen.discriminators, cell.iteration)
            for cell, chosen in zip(self.cells, selected)
        ]
        steps = train_tile(lanes)
        return [cell.complete(chosen, done) for cell, chosen, done in zip(self.cells, selected, steps)]
