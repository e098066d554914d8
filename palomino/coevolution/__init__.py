"""Populations, fitness, selection, mutation, the mixture ES, the one iteration path of a cell and a tile."""

from palomino.coevolution.cell import Cell
from palomino.coevolution.individual import Individual, Population
from palomino.coevolution.iteration import IterationReport

__all__ = ["Cell", "Individual", "IterationReport", "Population"]
