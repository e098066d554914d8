"""Torus topology and neighbourhoods (pure Python, no torch)."""

from palomino.grid.layout import rectangle, relayout
from palomino.grid.partition import ClassGrid, Partition, class_grid_at, class_rectangle, partition_grid
from palomino.grid.topology import Coord, Topology, cell_name, parse_coord

__all__ = [
    "ClassGrid",
    "Coord",
    "Partition",
    "Topology",
    "cell_name",
    "class_grid_at",
    "class_rectangle",
    "parse_coord",
    "partition_grid",
    "rectangle",
    "relayout",
]
