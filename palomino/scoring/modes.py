"""Mode coverage for the 2-D Gaussian toys (ring of 8, grid of 25).

A sample is high quality when it lies within 3σ of a mode centre; a mode is covered
when at least `min_count` samples (20 of 2,500 in the literature) are high quality
and nearest to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModeCoverage:
    covered: int
    modes: int
    high_quality: float  # fraction of samples within 3σ of some centre
    counts: list[int]

    def as_dict(self) -> dict:
        return {
            "modes_covered": self.covered,
            "modes": self.modes,
            "high_quality": self.high_quality,
            "counts": self.counts,
        }


def mode_coverage(samples: torch.Tensor, centres: torch.Tensor, std: float, min_count: int = 20) -> ModeCoverage:
    distance = torch.cdist(samples.double().reshape(-1, 2), centres.double())
    nearest, index = distance.min(dim=1)
    good = nearest <= 3 * std
    counts = torch.bincount(index[good], minlength=len(centres))
    return ModeCoverage(
        covered=int((counts >= min_count).sum()),
        modes=len(centres),
        high_quality=float(good.double().mean()),
        counts=counts.tolist(),
    )
