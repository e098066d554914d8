"""Torus topology and neighbourhoods (pure Python, no torch)."""

from palomino.grid.layout import rectangle, relayout
from palomino.grid.topology import Coord, Topology, parse_coord

__all__ = ["Coord", "Topology", "parse_coord", "rectangle", "relayout"]
