"""The step size's schedule over a run: constant, then a linear decay over the last iterations."""

from __future__ import annotations

from palomino.config.models import DecayConfig


def decay_factor(decay: DecayConfig, progress: float) -> float:
    """The multiplier of every step size at `progress` (share of the run done, 0 … 1): 1 until
    `decay.start`, then linearly down to `decay.final` at the end."""
    if progress <= decay.start or decay.start >= 1:
        return 1.0
    done = min(1.0, (progress - decay.start) / (1 - decay.start))
    return 1.0 - (1.0 - decay.final) * done
