"""The neighbourhood's generator mixture: weights evolved by a (1+1)-ES on a cheap in-cell score.

The score is a kernel MMD² between the weighted mixture and real data, on samples
drawn once per iteration. Because the samples are fixed, MMD² is a quadratic form
in the weights: the kernel matrices are computed once and reduced to their means per
pair of components (C×C), so every proposal costs a C×C product (common random
numbers make the comparison fair).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from palomino.nn.host import to_host, upload

BANDWIDTH_FACTORS = (0.1, 0.3, 1.0)  # multiples of the median distance: fine and coarse structure


# exp(−80) ≈ 2e-35: kernel values below it are nothing next to the means they enter, and an
# argument far below it sends exp down its slow underflow path (13× slower on this project's CPU,
# where the fine bandwidths' exponents reach −800).
SMALLEST_EXPONENT = -80.0


def _squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist").pow_(2).clamp_min_(0)


def _kernel(d2: torch.Tensor, bandwidths: torch.Tensor) -> torch.Tensor:
    """The mean of the Gaussian kernels at these bandwidths, in two buffers the size of `d2`:
    distances (…, n, m), bandwidths (…, factors) in float64 on the device (no read-back before the
    kernels), one set of them per leading index (one mixture, or a tile's batch of them)."""
    total, part = torch.zeros_like(d2), torch.empty_like(d2)
    for coefficient in (-1.0 / (2 * bandwidths * bandwidths)).unbind(-1):
        torch.mul(d2, coefficient.to(d2.dtype)[..., None, None], out=part).clamp_min_(SMALLEST_EXPONENT).exp_()
        total.add_(part)
    return total.div_(bandwidths.shape[-1])


def _block_means(kernel: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Means over (rows × cols) blocks of the last two axes, summed in float64 (on the device)."""
    *lead, n, m = kernel.shape
    blocks = kernel.reshape(*lead, rows, n // rows, cols, m // cols).sum(dim=(-3, -1), dtype=torch.float64)
    return blocks / ((n // rows) * (m // cols))


def _values(x: torch.Tensor, y: torch.Tensor, count: int, factors: tuple[float, ...]) -> torch.Tensor:
    """k_fake (C·C), k_cross (C), k_real and the bandwidths, side by side on the device, of the
    mixture whose C components' samples are the rows of `x` (…, C·m, F) against real `y` (…, n, F);
    leading axes are independent mixtures. Distances in float32 (the cost is here), three blocks
    (real-vs-fake is the transpose of fake-vs-real); the quadratic form's terms in float64."""
    xx, xy, yy = (_squared_distances(a, b) for a, b in ((x, x), (x, y), (y, y)))
    # Median heuristic on a strided subsample: the median of a million entries costs more than
    # the kernels, and a few thousand pin it down.
    pooled = torch.cat([xx.flatten(-2), xy.flatten(-2), yy.flatten(-2)], dim=-1)
    median = pooled[..., :: max(1, pooled.shape[-1] // 4096)].median(dim=-1).values.clamp_min(1e-12).sqrt()
    bandwidths = median.double()[..., None] * upload(factors, median.device, torch.float64)
    k_fake = _block_means(_kernel(xx, bandwidths), count, count)
    k_cross = _block_means(_kernel(xy, bandwidths), count, 1).squeeze(-1)
    k_real = _block_means(_kernel(yy, bandwidths), 1, 1).flatten(-2)
    return torch.cat([k_fake.flatten(-2), k_cross, k_real, bandwidths], dim=-1)


# Distance and kernel matrices one batched scoring may hold (a tile's mixtures go in chunks).
BATCH_BUDGET = {"cpu": 1 << 30, "cuda": 16 << 30}


@dataclass(frozen=True)
class MixtureScore:
    """MMD²(mixture(w), real) for any weight vector w over the components (lower is better)."""

    k_fake: torch.Tensor  # (C, C): mean kernel value between the samples of components i and j
    k_cross_mean: torch.Tensor  # (C,) mean kernel value of component c's samples against the real ones
    k_real_mean: float
    components: int
    per_component: int
    bandwidths: tuple[float, ...]

    @classmethod
    def from_samples(
        cls, fakes: list[torch.Tensor], real: torch.Tensor, factors: tuple[float, ...] = BANDWIDTH_FACTORS
    ) -> MixtureScore:
        """`fakes[c]`: m samples of component c (same m for all); `real`: n real samples;
        `factors`: the kernels' bandwidths as multiples of the median distance."""
        per_component, count = fakes[0].shape[0], len(fakes)
        x = torch.cat([f.reshape(per_component, -1) for f in fakes]).float()
        y = real.reshape(real.shape[0], -1).float()
        # The ES evaluates the quadratic form on the CPU with numpy weights: everything it needs
        # comes back in one read (one host sync on a GPU), bandwidths included.
        return cls._of(to_host(_values(x, y, count, factors)).numpy(), count, per_component)

    @classmethod
    def from_batch(
        cls, fakes: torch.Tensor, real: torch.Tensor, factors: tuple[float, ...] = BANDWIDTH_FACTORS
    ) -> list[MixtureScore]:
        """`from_samples` of J mixtures at once: `fakes` (J, C, m, …), `real` (J, n, …); batched
        distances and kernels (in chunks whose matrices fit BATCH_BUDGET), one read for all."""
        jobs, count, per_component = fakes.shape[:3]
        x = fakes.reshape(jobs, count * per_component, -1).float()
        y = real.reshape(jobs, real.shape[1], -1).float()
        rows = x.shape[1] + y.shape[1]
        budget = BATCH_BUDGET.get(fakes.device.type, BATCH_BUDGET["cuda"])
        size = max(1, budget // (rows * rows * 4 * 5))  # three distance matrices and two kernel buffers
        chunks = [_values(x[at : at + size], y[at : at + size], count, factors) for at in range(0, jobs, size)]
        return [cls._of(row, count, per_component) for row in to_host(torch.cat(chunks)).numpy()]

    @classmethod
    def _of(cls, row: np.ndarray, count: int, per_component: int) -> MixtureScore:
        """The score from `_values`' row, read back (cut on the host: numpy views, no torch op)."""
        square = count * count
        return cls(
            k_fake=torch.from_numpy(row[:square].reshape(count, count)),
            k_cross_mean=torch.from_numpy(row[square : square + count]),
            k_real_mean=float(row[square + count]),
            components=count,
            per_component=per_component,
            bandwidths=tuple(row[square + count + 1 :].tolist()),
        )

    def __call__(self, weights: np.ndarray) -> float:
        w = torch.from_numpy(np.asarray(weights, dtype=np.float64))
        value = w @ self.k_fake @ w - 2 * w @ self.k_cross_mean + self.k_real_mean
        return max(float(value), 0.0)


def propose(weights: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian step, clipped at 0 and renormalised (all-zero falls back to the parent)."""
    child = np.clip(weights + rng.normal(0.0, sigma, size=weights.shape), 0.0, None)
    total = child.sum()
    return child / total if total > 0 else weights.copy()


def evolve_weights(
    weights: np.ndarray, score: MixtureScore, sigma: float, steps: int, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """(1+1)-ES: keep a child only if it scores strictly better. Returns (weights, score)."""
    best = score(weights)
    for _ in range(steps):
        child = propose(weights, sigma, rng)
        child_score = score(child)
        if child_score < best:
            weights, best = child, child_score
    return weights, best
