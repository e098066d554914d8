"""Class-partitioned grids: one torus per data label, side by side in one space of cell ids.

Class k of an experiment's labels (in ascending order) owns rows k·R … k·R+R−1 of the cell
ids, where R×C is `grid.per_class`: cell (k·R + r, c) is cell (r, c) of class k's torus.
Every cell id is therefore unique across classes, so snapshot routing keys, metrics
records, checkpoint and sample folders need no class tag. Neighbourhoods wrap within a
class's torus and never reach another class.

A `ClassGrid` answers what a `Topology` answers (cells, neighbours, epoch) in those ids,
so a cell cannot tell whether it is on a plain grid or on a class's sub-grid. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from palomino.grid.topology import Coord, Topology

Neighbourhood = Literal["von_neumann", "moore", "none"]


@dataclass(frozen=True)
class ClassGrid:
    """Class `label`'s torus, its cell (r, c) at id (row_offset + r, c)."""

    label: int
    topology: Topology  # the torus in local coordinates (its shape may shrink after failures)
    row_offset: int

    @property
    def rows(self) -> int:
        return self.topology.rows

    @property
    def cols(self) -> int:
        return self.topology.cols

    @property
    def kind(self) -> Neighbourhood:
        return self.topology.kind

    @property
    def epoch(self) -> int:
        return self.topology.epoch

    @property
    def size(self) -> int:
        return self.topology.size

    def to_local(self, coord: Coord) -> Coord:
        if coord not in self:
            raise ValueError(
                f"cell {Coord(*coord)} is outside class {self.label}'s {self.rows}×{self.cols} sub-grid "
                f"(rows {self.row_offset}–{self.row_offset + self.rows - 1})"
            )
        return Coord(coord[0] - self.row_offset, coord[1])

    def to_global(self, local: Coord) -> Coord:
        return Coord(local[0] + self.row_offset, local[1])

    def cells(self) -> Iterator[Coord]:
        return (self.to_global(c) for c in self.topology.cells())

    def __contains__(self, coord: object) -> bool:
        return isinstance(coord, tuple) and len(coord) == 2 and (coord[0] - self.row_offset, coord[1]) in self.topology

    def neighbours(self, coord: Coord) -> list[Coord]:
        """Distinct neighbours on the class's torus (ids), never another class's cells."""
        return [self.to_global(c) for c in self.topology.neighbours(self.to_local(coord))]

    def neighbourhood(self, coord: Coord) -> list[Coord]:
        return [Coord(*coord), *self.neighbours(coord)]

    def describe(self) -> dict[str, int]:
        """JSON for topology.jsonl: rows, cols and row_offset of the sub-grid."""
        return {"rows": self.rows, "cols": self.cols, "row_offset": self.row_offset}

    def resized(self, rows: int, cols: int, epoch: int) -> ClassGrid:
        """The same class on a new layout (a shrink after failures); `rows` must stay within its band."""
        return ClassGrid(self.label, Topology(rows, cols, self.kind, epoch), self.row_offset)


@dataclass(frozen=True)
class Partition:
    """Every class's sub-grid of a partitioned experiment."""

    grids: tuple[ClassGrid, ...]
    per_class: tuple[int, int]

    @property
    def labels(self) -> tuple[int, ...]:
        return tuple(g.label for g in self.grids)

    @property
    def rows(self) -> int:
        """Rows of the id space (classes × R); `cols` likewise (C)."""
        return len(self.grids) * self.per_class[0]

    @property
    def cols(self) -> int:
        return self.per_class[1]

    @property
    def size(self) -> int:
        return sum(g.size for g in self.grids)

    def cells(self) -> Iterator[Coord]:
        for grid in self.grids:
            yield from grid.cells()

    def grid_of(self, coord: Coord) -> ClassGrid:
        """The sub-grid that holds `coord`."""
        band = coord[0] // self.per_class[0]
        if 0 <= band < len(self.grids) and coord in self.grids[band]:
            return self.grids[band]
        raise ValueError(f"cell {Coord(*coord)} is in no class's sub-grid of this {self.rows}×{self.cols} partition")

    def class_of(self, coord: Coord) -> int:
        return self.grid_of(coord).label

    def grid_for(self, label: int) -> ClassGrid:
        for grid in self.grids:
            if grid.label == label:
                return grid
        raise ValueError(f"no class {label} in this partition (classes: {list(self.labels)})")

    def describe(self) -> dict[str, dict[str, int]]:
        """JSON for topology.jsonl: label → rows, cols, row_offset of its sub-grid."""
        return {str(g.label): g.describe() for g in self.grids}

    def to_json(self) -> dict:
        """Everything that makes this partition (what a restarted orchestrator rebuilds it from)."""
        grids = [{**g.describe(), "label": g.label, "kind": g.kind, "epoch": g.epoch} for g in self.grids]
        return {"per_class": list(self.per_class), "grids": grids}

    @classmethod
    def from_json(cls, data: dict) -> Partition:
        grids = tuple(
            ClassGrid(
                int(g["label"]),
                Topology(int(g["rows"]), int(g["cols"]), g["kind"], int(g["epoch"])),
                int(g["row_offset"]),
            )
            for g in data["grids"]
        )
        rows, cols = data["per_class"]
        return cls(grids, (int(rows), int(cols)))


def partition_grid(
    labels: Sequence[int], per_class: tuple[int, int], kind: Neighbourhood = "von_neumann", epoch: int = 0
) -> Partition:
    """One R×C torus per label, in ascending label order, at rows k·R of the id space."""
    rows, cols = per_class
    if not labels:
        raise ValueError("a partitioned grid needs at least one class")
    if len(set(labels)) != len(labels):
        raise ValueError(f"each class at most once (got {list(labels)})")
    ordered = sorted(labels)
    grids = tuple(ClassGrid(label, Topology(rows, cols, kind, epoch), k * rows) for k, label in enumerate(ordered))
    return Partition(grids, (rows, cols))


def class_grid_at(
    coord: Coord,
    labels: Sequence[int],
    per_class: tuple[int, int],
    shape: tuple[int, int] | None = None,
    kind: Neighbourhood = "von_neumann",
    epoch: int = 0,
) -> ClassGrid:
    """The sub-grid a distributed cell at `coord` belongs to, from its experiment's labels and
    per-class shape; `shape` is the sub-grid's current rows×cols when a shrink changed it."""
    band_rows = per_class[0]
    band = coord[0] // band_rows
    ordered = sorted(labels)
    if not 0 <= band < len(ordered):
        raise ValueError(
            f"cell {Coord(*coord)} lies outside the {len(ordered)} classes × {band_rows} rows of this partition"
        )
    rows, cols = shape or per_class
    if rows > band_rows:
        raise ValueError(f"a class's sub-grid has at most {band_rows} rows (its band), not {rows}")
    grid = ClassGrid(ordered[band], Topology(rows, cols, kind, epoch), band * band_rows)
    grid.to_local(coord)  # raises if the coordinate is outside the sub-grid's current shape
    return grid


def class_rectangle(n: int, max_rows: int) -> tuple[int, int]:
    """The largest rows×cols ≤ n with rows ≤ max_rows (a class's band), squarest among equals:
    the shape a class's sub-grid shrinks to when n of its workers survive."""
    if n < 1:
        raise ValueError("a sub-grid needs at least one cell")
    best = (1, n)
    for rows in range(1, min(max_rows, n) + 1):
        cols = n // rows
        if (rows * cols, -abs(cols - rows)) > (best[0] * best[1], -abs(best[1] - best[0])):
            best = (rows, cols)
    return best
