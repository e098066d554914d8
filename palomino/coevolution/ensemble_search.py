"""The whole grid's ensemble: one mixture over every cell's generator, optimised on a real score.

A neighbourhood mixture sees five generators; the grid holds N lineages that may each have
settled on other modes. After training, greedy forward selection (Caruana et al. 2004: add,
with replacement, the component that lowers the score most) finds a sparse start, and a
(1+1)-ES over the weights refines it (Toutouh et al. 2020 re-purpose the grid's generators the
same way). Scores are functions of the weights alone — samples are drawn once — so a proposal
costs a few matrix products. Selection uses one half of the real samples; the score reported is
measured on the other half and on other generated samples, so it is not the one optimised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from palomino.coevolution.mixture_weights import evolve_weights

# MMD bandwidths as multiples of the median distance. The whole-grid ensemble adds fine scales
# to the in-cell mixture's: a generator that smears samples between modes must lose to one that
# hits them, which a kernel as wide as the distance between modes cannot see.
FINE_BANDWIDTH_FACTORS = (0.01, 0.03, 0.1, 0.3, 1.0)


class WeightScore(Protocol):
    """A score (lower is better) of the mixture with these weights over fixed components."""

    components: int

    def __call__(self, weights: np.ndarray) -> float: ...


@dataclass(frozen=True)
class FrechetScore:
    """Fréchet distance between the weighted mixture's features and real features.

    The mixture's mean is Σ wᵢ μᵢ and its covariance Σ wᵢ Mᵢ − μμᵀ (Mᵢ the second moments),
    so FID for any weights needs no new samples.
    """

    means: torch.Tensor  # (C, d)
    second: torch.Tensor  # (C, d, d)
    real_mean: torch.Tensor  # (d,)
    real_cov: torch.Tensor  # (d, d)

    @property
    def components(self) -> int:
        return len(self.means)

    @classmethod
    def from_features(cls, fakes: list[torch.Tensor], real: torch.Tensor) -> FrechetScore:
        fakes = [f.double().reshape(len(f), -1) for f in fakes]
        real = real.double().reshape(len(real), -1)
        return cls(
            means=torch.stack([f.mean(0) for f in fakes]),
            second=torch.stack([f.T @ f / len(f) for f in fakes]),
            real_mean=real.mean(0),
            real_cov=torch.cov(real.T).reshape(real.shape[1], real.shape[1]),
        )

    def __call__(self, weights: np.ndarray) -> float:
        w = torch.from_numpy(np.asarray(weights, dtype=np.float64) / np.sum(weights))
        mean = w @ self.means
        cov = torch.einsum("c,cij->ij", w, self.second) - torch.outer(mean, mean)
        return frechet_distance(mean, cov, self.real_mean, self.real_cov)


def feature_fid(fake: torch.Tensor, real: torch.Tensor) -> float:
    """The Fréchet distance between two sets of feature rows (N × d each), in float64."""
    fake, real = fake.double(), real.double()
    return frechet_distance(fake.mean(0), torch.cov(fake.T), real.mean(0), torch.cov(real.T))


def frechet_distance(mu1: torch.Tensor, cov1: torch.Tensor, mu2: torch.Tensor, cov2: torch.Tensor) -> float:
    """‖μ₁−μ₂‖² + tr(C₁ + C₂ − 2 (C₁C₂)^½); tr (C₁C₂)^½ = Σ √λ over the (real, ≥ 0) eigenvalues of C₁C₂."""
    eigenvalues = torch.linalg.eigvals(cov1 @ cov2).real.clamp_min(0)
    value = (mu1 - mu2).square().sum() + torch.trace(cov1) + torch.trace(cov2) - 2 * eigenvalues.sqrt().sum()
    return max(float(value), 0.0)


def greedy_forward(score: Callable[[np.ndarray], float], components: int, rounds: int) -> np.ndarray:
    """Caruana's ensemble selection with removal: each round takes the one move — one more share
    of a component (with replacement) or one less of a component already in — that lowers the
    score most, and stops early when none does. Removal lets a component that was best alone
    (a generator smeared over every mode) leave again once specialists cover the modes.
    Returns weights summing to 1."""
    counts = np.zeros(components)
    best = float("inf")
    for _ in range(rounds):
        moves = [(c, +1) for c in range(components)]
        if counts.sum() > 1:
            moves += [(c, -1) for c in range(components) if counts[c] > 0]
        trials = []
        for c, step in moves:
            trial = counts.copy()
            trial[c] += step
            trials.append(score(trial / trial.sum()))
        choice = int(np.argmin(trials))
        if trials[choice] >= best:
            break
        c, step = moves[choice]
        counts[c] += step
        best = trials[choice]
    return counts / counts.sum()


@dataclass(frozen=True)
class Ensemble:
    weights: np.ndarray  # one per component, summing to 1
    selection_score: float  # on the samples it was optimised on
    held_out_score: float  # on other samples: the one to believe
    equal_weight_score: float  # the equal-weight mixture of every component, held out: the baseline


def optimise_ensemble(
    selection: WeightScore,
    held_out: WeightScore,
    rng: np.random.Generator,
    *,
    rounds: int | None = None,
    sigma: float = 0.02,
    es_steps: int = 200,
) -> Ensemble:
    """Greedy forward selection, then a (1+1)-ES on the weights, both on `selection`.

    Greedy rounds default to 2·C: a component may enter more than once (a larger share)."""
    count = selection.components
    weights = greedy_forward(selection, count, rounds or 2 * count)
    weights, value = evolve_weights(weights, selection, sigma, es_steps, rng)
    return Ensemble(
        weights=weights,
        selection_score=value,
        held_out_score=held_out(weights),
        equal_weight_score=held_out(np.full(count, 1.0 / count)),
    )
