"""Scores of generated samples. Toy-problem mode coverage lives here; FID/IS/KID/TVD come with the scorer."""

from palomino.scoring.modes import ModeCoverage, mode_coverage

__all__ = ["ModeCoverage", "mode_coverage"]
