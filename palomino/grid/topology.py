"""The grid is a torus: a cell's neighbours wrap around the edges."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

_OFFSETS = {
    # Order matters: it fixes the order of a neighbourhood, hence of fitness tables and mixtures.
    "von_neumann": ((-1, 0), (1, 0), (0, -1), (0, 1)),  # N, S, W, E
    "moore": ((-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)),
    "none": (),  # every cell alone: the ablation that takes communication away and keeps the rest
}


class Coord(NamedTuple):
    row: int
    col: int

    def __str__(self) -> str:
        return f"{self.row}-{self.col}"


def cell_name(cell: Iterable[object]) -> str:
    """'r-c': a cell's name in files, messages and records, from its coordinate in any sequence."""
    return "-".join(map(str, cell))


def parse_coord(text: str) -> Coord:
    """Inverse of str(Coord): '2-3' → Coord(2, 3)."""
    row, sep, col = text.partition("-")
    if not sep or not row.isdigit() or not col.isdigit():
        raise ValueError(f"not a cell coordinate: {text!r} (expected ROW-COL, e.g. 0-1)")
    return Coord(int(row), int(col))


@dataclass(frozen=True)
class Topology:
    rows: int
    cols: int
    kind: Literal["von_neumann", "moore", "none"] = "von_neumann"
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.rows < 1 or self.cols < 1:
            raise ValueError(f"a grid needs at least one row and column, got {self.rows}×{self.cols}")
        if self.kind not in _OFFSETS:
            raise ValueError(f"unknown neighbourhood {self.kind!r}: use von_neumann, moore or none")

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def cells(self) -> Iterator[Coord]:
        for row in range(self.rows):
            for col in range(self.cols):
                yield Coord(row, col)

    def __contains__(self, coord: object) -> bool:
        return isinstance(coord, tuple) and len(coord) == 2 and 0 <= coord[0] < self.rows and 0 <= coord[1] < self.cols

    def neighbours(self, coord: Coord) -> list[Coord]:
        """Distinct cells adjacent on the torus, excluding the cell itself.

        On small grids offsets wrap onto the same cell (a 1×N strip has no N/S
        neighbours; in a 2×2 grid N and S coincide), so duplicates are dropped.
        """
        if coord not in self:
            raise ValueError(f"cell {coord} is outside the {self.rows}×{self.cols} grid")
        seen: list[Coord] = []
        for dr, dc in _OFFSETS[self.kind]:
            other = Coord((coord[0] + dr) % self.rows, (coord[1] + dc) % self.cols)
            if other != coord and other not in seen:
                seen.append(other)
        return seen

    def neighbourhood(self, coord: Coord) -> list[Coord]:
        """The cell itself first, then its neighbours."""
        return [Coord(*coord), *self.neighbours(coord)]
