"""Learning-rate mutation as Lipizzaner does it: a Gaussian step biased slightly downwards."""

from __future__ import annotations

import numpy as np


def mutate_learning_rates(
    rates: list[float], default: float, probability: float, alpha: float, rng: np.random.Generator
) -> list[float]:
    """Each rate moves by alpha·N(−default/10, default) with `probability`, never below 0."""
    deltas = rng.normal(loc=-default / 10, scale=default, size=len(rates))
    deltas[rng.random(len(rates)) >= probability] = 0.0
    return [max(0.0, rate + delta * alpha) for rate, delta in zip(rates, deltas)]
