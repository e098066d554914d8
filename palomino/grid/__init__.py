"""Torus topology and neighbourhoods (pure Python, no torch)."""

from palomino.grid.topology import Coord, Topology, parse_coord

__all__ = ["Coord", "Topology", "parse_coord"]
