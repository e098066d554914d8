"""Blocks: which cells of a grid go to which multi-cell worker (`palomino cell --cells K`).

Every neighbour pair split between two workers goes through the broker; a pair inside one
worker stays in its memory. So a worker's cells should be a compact patch of the torus. The
cells are walked in bands of `h` rows, column by column, snaking down and up, and each worker
takes the next run of that walk: a run of h·w cells is an h×w rectangle. Of every band height,
the one whose runs cut the fewest neighbour pairs wins (pure; no torch, no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence

from palomino.grid.topology import Coord, Topology


def snake(rows: int, cols: int, band: int) -> list[Coord]:
    """The grid's cells in bands of `band` rows; inside a band column by column, down then up."""
    order: list[Coord] = []
    for top in range(0, rows, band):
        band_rows = list(range(top, min(top + band, rows)))
        for col in range(cols):
            for row in band_rows if col % 2 == 0 else reversed(band_rows):
                order.append(Coord(row, col))
    return order


def runs(order: Sequence[Coord], sizes: Sequence[int]) -> list[list[Coord]]:
    """`order` cut into consecutive runs of `sizes` (as far as it goes)."""
    out, start = [], 0
    for size in sizes:
        out.append(list(order[start : start + size]))
        start += size
    return out


def neighbour_pairs(topology: Topology) -> list[tuple[Coord, Coord]]:
    """Every pair of neighbouring cells once (neighbourhoods on the torus are symmetric)."""
    return [(coord, other) for coord in topology.cells() for other in topology.neighbours(coord) if other > coord]


def cut_pairs(
    topology: Topology, blocks: Sequence[Sequence[Coord]], pairs: Sequence[tuple[Coord, Coord]] | None = None
) -> int:
    """Neighbour pairs (each counted once) whose two cells are in different blocks; `pairs`:
    neighbour_pairs(topology), when the caller has it already."""
    owner = {coord: index for index, block in enumerate(blocks) for coord in block}
    cut = 0
    for a, b in neighbour_pairs(topology) if pairs is None else pairs:
        if a in owner and b in owner and owner[a] != owner[b]:
            cut += 1
    return cut


def place_blocks(topology: Topology, sizes: Sequence[int]) -> list[list[Coord]]:
    """One block of cells per worker, `sizes[i]` cells for worker i (the last ones may get fewer
    when the sizes add up to more than the grid), cutting the fewest neighbour pairs found."""
    if any(size < 1 for size in sizes):
        raise ValueError(f"every worker hosts at least one cell, got sizes {list(sizes)}")
    best: list[list[Coord]] | None = None
    best_key = (0, 0)
    pairs = neighbour_pairs(topology)  # once: every band height is judged on the same pairs
    # A band taller than twice the largest block only lays blocks out as column runs that band =
    # that block's size lays out already (and that wins ties, coming first): not tried, so a 64×64
    # grid of single-cell workers weighs 2 bands, not 64.
    for band in range(1, min(topology.rows, 2 * max(sizes, default=1)) + 1):
        blocks = runs(snake(topology.rows, topology.cols, band), sizes)
        # Ties (strips and squares cut as many pairs on a von Neumann torus) go to the squarer patches.
        key = (cut_pairs(topology, blocks, pairs), sum(_span(block) for block in blocks))
        if best is None or key < best_key:
            best, best_key = blocks, key
    assert best is not None
    return [block for block in best if block]


def _span(block: Sequence[Coord]) -> int:
    """Rows plus columns a patch spans (its bounding box's half perimeter)."""
    return len({c.row for c in block}) + len({c.col for c in block}) if block else 0
