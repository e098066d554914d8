"""The referee's baselines: plain GANs without coevolution, trained side by side."""

from palomino.baselines.independent import Budget, train_independent

__all__ = ["Budget", "train_independent"]
