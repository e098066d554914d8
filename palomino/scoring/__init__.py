"""Scores of generated samples, offline: FID / IS / KID (torchmetrics) and TVD on images through a
pluggable feature extractor (the `classifier` CNN or Inception-v3), mode coverage on the 2-D toys;
a mixture of one class (a partitioned run's) against that class's data. See docs/scoring.md."""

from palomino.scoring.modes import ModeCoverage, mode_coverage
from palomino.scoring.options import ScoringOptions, parse_metrics
from palomino.scoring.score import ClassDraws, ScoringContext, mixture_class, score_mixture, score_run

__all__ = [
    "ClassDraws",
    "ModeCoverage",
    "ScoringContext",
    "ScoringOptions",
    "mixture_class",
    "mode_coverage",
    "parse_metrics",
    "score_mixture",
    "score_run",
]
