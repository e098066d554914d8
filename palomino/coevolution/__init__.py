"""Populations, fitness, selection, mutation, the mixture ES and one cell's iteration."""

from palomino.coevolution.cell import Cell, IterationReport
from palomino.coevolution.individual import Individual, Population

__all__ = ["Cell", "Individual", "IterationReport", "Population"]
