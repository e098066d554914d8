"""palomino.grid: the torus, its neighbourhoods and cell coordinates (pure Python, no torch)."""

from __future__ import annotations

import itertools

import pytest

from palomino.grid import Coord, Topology, parse_coord


def brute_force_neighbours(rows: int, cols: int, kind: str, coord: tuple[int, int]) -> set[Coord]:
    """Neighbours by definition: cells at torus offset in {−1,0,1}² (Moore) or the 4 axis offsets."""
    if kind == "moore":
        offsets = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]
    else:
        offsets = [(-1, 0), (1, 0), (0, -1), (0, 1)]
    found = {Coord((coord[0] + dr) % rows, (coord[1] + dc) % cols) for dr, dc in offsets}
    found.discard(Coord(*coord))
    return found


# --- torus wrap ---------------------------------------------------------------------------


def test_corner_wraps_to_the_far_edges_von_neumann() -> None:
    topology = Topology(4, 5)
    assert topology.neighbours(Coord(0, 0)) == [Coord(3, 0), Coord(1, 0), Coord(0, 4), Coord(0, 1)]  # N, S, W, E
    assert topology.neighbours(Coord(3, 4)) == [Coord(2, 4), Coord(0, 4), Coord(3, 3), Coord(3, 0)]


def test_corner_wraps_to_the_far_edges_moore() -> None:
    topology = Topology(4, 5, "moore")
    assert set(topology.neighbours(Coord(0, 0))) == {
        Coord(3, 4), Coord(3, 0), Coord(3, 1),
        Coord(0, 4), Coord(0, 1),
        Coord(1, 4), Coord(1, 0), Coord(1, 1),
    }  # fmt: skip


def test_interior_cell_has_no_wrap() -> None:
    assert set(Topology(5, 5).neighbours(Coord(2, 2))) == {Coord(1, 2), Coord(3, 2), Coord(2, 1), Coord(2, 3)}


@pytest.mark.parametrize(("rows", "cols"), [(3, 3), (3, 4), (4, 3), (5, 7), (10, 10)])
def test_von_neumann_has_four_and_moore_eight_neighbours(rows: int, cols: int) -> None:
    for kind, expected in (("von_neumann", 4), ("moore", 8)):
        topology = Topology(rows, cols, kind)
        for coord in topology.cells():
            neighbours = topology.neighbours(coord)
            assert len(neighbours) == expected == len(set(neighbours)), (kind, coord, neighbours)
            assert coord not in neighbours
            assert set(neighbours) == brute_force_neighbours(rows, cols, kind, coord)


@pytest.mark.parametrize(("rows", "cols"), list(itertools.product([1, 2, 3, 4], [1, 2, 3, 5])))
@pytest.mark.parametrize("kind", ["von_neumann", "moore"])
def test_neighbours_match_the_definition_on_every_small_grid(rows: int, cols: int, kind: str) -> None:
    topology = Topology(rows, cols, kind)
    for coord in topology.cells():
        neighbours = topology.neighbours(coord)
        assert len(neighbours) == len(set(neighbours)), "neighbours must be distinct"
        assert set(neighbours) == brute_force_neighbours(rows, cols, kind, coord)
        assert all(n in topology for n in neighbours)


@pytest.mark.parametrize("kind", ["von_neumann", "moore"])
def test_neighbourhood_is_symmetric(kind: str) -> None:
    topology = Topology(4, 6, kind)
    for a in topology.cells():
        for b in topology.neighbours(a):
            assert a in topology.neighbours(b)


# --- neighbourhood --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["von_neumann", "moore"])
def test_neighbourhood_is_self_first_then_neighbours(kind: str) -> None:
    topology = Topology(3, 4, kind)
    for coord in topology.cells():
        hood = topology.neighbourhood(coord)
        assert hood[0] == coord
        assert hood[1:] == topology.neighbours(coord)
        assert len(hood) == {"von_neumann": 5, "moore": 9}[kind]


def test_neighbourhood_accepts_a_plain_tuple() -> None:
    hood = Topology(3, 3).neighbourhood((1, 1))
    assert hood[0] == Coord(1, 1) and isinstance(hood[0], Coord)


# --- small grids ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["von_neumann", "moore"])
def test_single_cell_has_no_neighbours(kind: str) -> None:
    topology = Topology(1, 1, kind)
    assert topology.neighbours(Coord(0, 0)) == []
    assert topology.neighbourhood(Coord(0, 0)) == [Coord(0, 0)]


def test_strip_von_neumann_has_only_west_and_east() -> None:
    topology = Topology(1, 5)
    assert topology.neighbours(Coord(0, 0)) == [Coord(0, 4), Coord(0, 1)]
    assert topology.neighbours(Coord(0, 2)) == [Coord(0, 1), Coord(0, 3)]
    column = Topology(5, 1)  # the transposed strip: only north and south
    assert column.neighbours(Coord(0, 0)) == [Coord(4, 0), Coord(1, 0)]


@pytest.mark.parametrize("kind", ["von_neumann", "moore"])
def test_one_by_two_has_exactly_one_neighbour(kind: str) -> None:
    topology = Topology(1, 2, kind)
    assert topology.neighbours(Coord(0, 0)) == [Coord(0, 1)]
    assert topology.neighbours(Coord(0, 1)) == [Coord(0, 0)]


def test_two_by_two_deduplicates() -> None:
    von_neumann = Topology(2, 2)
    # N and S are the same cell, and so are W and E.
    assert von_neumann.neighbours(Coord(0, 0)) == [Coord(1, 0), Coord(0, 1)]
    assert von_neumann.neighbours(Coord(1, 1)) == [Coord(0, 1), Coord(1, 0)]
    moore = Topology(2, 2, "moore")
    for coord in moore.cells():
        assert sorted(moore.neighbours(coord)) == sorted(c for c in moore.cells() if c != coord)


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("coord", [(2, 0), (0, 3), (-1, 0), (0, -1), (5, 5)])
def test_coordinate_outside_the_grid_raises(coord: tuple[int, int]) -> None:
    topology = Topology(2, 3)
    assert coord not in topology
    with pytest.raises(ValueError, match="outside the 2×3 grid"):
        topology.neighbours(Coord(*coord))
    with pytest.raises(ValueError):
        topology.neighbourhood(Coord(*coord))


@pytest.mark.parametrize(("rows", "cols"), [(0, 3), (3, 0), (-1, 2)])
def test_empty_grid_raises(rows: int, cols: int) -> None:
    with pytest.raises(ValueError, match="at least one row"):
        Topology(rows, cols)


def test_unknown_neighbourhood_raises() -> None:
    with pytest.raises(ValueError, match="hex"):
        Topology(3, 3, "hex")  # type: ignore[arg-type]


def test_the_none_neighbourhood_leaves_every_cell_alone() -> None:
    grid = Topology(3, 3, "none")
    assert all(grid.neighbours(c) == [] and grid.neighbourhood(c) == [c] for c in grid.cells())


def test_cells_in_row_major_order() -> None:
    topology = Topology(2, 3)
    assert list(topology.cells()) == [Coord(0, 0), Coord(0, 1), Coord(0, 2), Coord(1, 0), Coord(1, 1), Coord(1, 2)]
    assert topology.size == 6


# --- coordinates ------------------------------------------------------------------------------


@pytest.mark.parametrize("coord", [Coord(0, 0), Coord(2, 3), Coord(10, 0), Coord(123, 45)])
def test_parse_coord_round_trips(coord: Coord) -> None:
    assert str(coord) == f"{coord.row}-{coord.col}"
    assert parse_coord(str(coord)) == coord
    assert isinstance(parse_coord(str(coord)), Coord)


@pytest.mark.parametrize("text", ["", "1", "1-", "-1", "a-b", "1-b", "1_2", "1,2", "-1-2", "1-2-3", " 1-2", "1.0-2"])
def test_parse_coord_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="not a cell coordinate"):
        parse_coord(text)
