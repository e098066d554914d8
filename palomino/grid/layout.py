"""Laying workers out on a grid, at the start and after failures (pure, no torch)."""

from __future__ import annotations

from palomino.grid.topology import Coord


def rectangle(n: int, max_aspect: float = 2.0, prefer: tuple[int, int] | None = None) -> tuple[int, int]:
    """The largest rows×cols ≤ n with max(rows, cols) ≤ max_aspect·min(rows, cols).

    Below 4 workers no such rectangle beats a strip, so 1×2 or 1×3 (1×1 for one).
    Among equal areas: the squarest, oriented like `prefer` (e.g. the configured grid).
    """
    if n < 1:
        raise ValueError("a grid needs at least one worker")
    if n < 4:
        return (1, n)
    best = (1, 1)
    for rows in range(1, n + 1):
        for cols in range(rows, n // rows + 1):
            if cols <= max_aspect * rows and (rows * cols, -(cols - rows)) > (best[0] * best[1], -(best[1] - best[0])):
                best = (rows, cols)
    rows, cols = best
    if prefer is not None and (prefer[0] > prefer[1]) != (rows > cols):
        rows, cols = cols, rows
    return rows, cols


def relayout(current: dict[Coord, str], survivors: list[str], rows: int, cols: int) -> dict[Coord, str]:
    """Place `survivors` on a rows×cols grid moving as few as possible.

    A survivor whose coordinate is still inside the new grid keeps it; the others fill the
    free coordinates in row-major order; survivors left over become spares (not in the result).
    """
    alive = set(survivors)
    placed: dict[Coord, str] = {
        coord: worker for coord, worker in current.items() if worker in alive and coord[0] < rows and coord[1] < cols
    }
    staying = set(placed.values())
    waiting = iter([w for w in survivors if w not in staying])
    for row in range(rows):
        for col in range(cols):
            if Coord(row, col) not in placed and (worker := next(waiting, None)) is not None:
                placed[Coord(row, col)] = worker
    return dict(sorted(placed.items()))
