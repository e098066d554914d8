"""The mixture (1+1)-ES: its MMD² score against a direct computation, and the ES's guarantees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from palomino.coevolution.mixture_weights import MixtureScore, evolve_weights, propose

BANDWIDTH_FACTORS = (0.1, 0.3, 1.0)  # the documented kernel: Gaussians at these multiples of the median distance


def pooled_distances(fakes: list[np.ndarray], real: np.ndarray) -> np.ndarray:
    pooled = np.concatenate([*fakes, real])
    return np.sqrt(((pooled[:, None, :] - pooled[None, :, :]) ** 2).sum(-1))


def direct_mmd2(fakes: list[np.ndarray], weights: np.ndarray, real: np.ndarray, widths: tuple[float, ...]) -> float:
    """Biased MMD² between the weighted mixture of the empirical components and the real samples,
    written out from its definition with explicit sums (no shared code with the module)."""

    def k(a: np.ndarray, b: np.ndarray) -> float:
        d2 = float(((a - b) ** 2).sum())
        return sum(np.exp(-d2 / (2 * h * h)) for h in widths) / len(widths)

    # The mixture as a weighted point set: sample j of component c carries weight w_c / m_c.
    points = [(x, w / len(f)) for f, w in zip(fakes, weights) for x in f]
    n = len(real)
    pp = sum(wa * wb * k(a, b) for a, wa in points for b, wb in points)
    pq = sum(wa * k(a, y) / n for a, wa in points for y in real)
    qq = sum(k(y, z) for y in real for z in real) / (n * n)
    return pp - 2 * pq + qq


def components(seed: int, c: int = 3, m: int = 10) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(m, 2, generator=g) * (1 + i) + 2 * i for i in range(c)]


def real_points(seed: int, n: int = 15) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.randn(n, 2, generator=g)


@pytest.mark.parametrize(
    "weights",
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1 / 3, 1 / 3, 1 / 3], [0.6, 0.3, 0.1], [0.05, 0.15, 0.8]],
)
def test_score_equals_direct_weighted_mmd2(weights: list[float]) -> None:
    # 3·10 + 15 = 45 pooled points: 45² distances, an odd count, so the median is unambiguous.
    fakes, real = components(0), real_points(0)
    score = MixtureScore.from_samples(fakes, real)
    w = np.array(weights)
    expected = direct_mmd2([f.double().numpy() for f in fakes], w, real.double().numpy(), score.bandwidths)
    # Float32 distances are allowed (the module computes them so, for speed): tolerance to match.
    assert score(w) == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert score(w) > 0


def test_bandwidths_are_the_documented_multiples_of_a_median_distance() -> None:
    # The median comes from a subsample of the pairwise distances (for speed): it must sit in the
    # middle of their distribution, and the kernels at the documented multiples of it.
    fakes, real = components(0, m=40), real_points(0, n=60)
    score = MixtureScore.from_samples(fakes, real)
    median = score.bandwidths[-1] / BANDWIDTH_FACTORS[-1]
    assert score.bandwidths == pytest.approx(tuple(f * median for f in BANDWIDTH_FACTORS))
    distances = pooled_distances([f.double().numpy() for f in fakes], real.double().numpy())
    assert np.quantile(distances, 0.4) < median < np.quantile(distances, 0.6)


def test_score_takes_image_shaped_samples() -> None:
    g = torch.Generator().manual_seed(1)
    fakes = [torch.rand(6, 1, 2, 2, generator=g), torch.rand(6, 1, 2, 2, generator=g)]
    real = torch.rand(9, 1, 2, 2, generator=g)
    w = np.array([0.25, 0.75])
    flat = [f.reshape(6, -1).double().numpy() for f in fakes]
    score = MixtureScore.from_samples(fakes, real)
    assert score(w) == pytest.approx(
        direct_mmd2(flat, w, real.reshape(9, -1).double().numpy(), score.bandwidths), rel=1e-4, abs=1e-5
    )


def test_real_data_against_itself_scores_zero() -> None:
    real = real_points(2, n=40)
    assert MixtureScore.from_samples([real], real)(np.array([1.0])) == pytest.approx(0.0, abs=1e-6)
    # Two halves of the real data, weighted equally, are the real data again.
    halves = MixtureScore.from_samples([real[:20], real[20:]], real)
    assert halves(np.array([0.5, 0.5])) == pytest.approx(0.0, abs=1e-6)
    assert halves(np.array([0.9, 0.1])) > 1e-4


def test_closer_mixture_scores_lower() -> None:
    g = torch.Generator().manual_seed(3)
    real = torch.randn(60, 2, generator=g)
    good = torch.randn(30, 2, generator=g)
    bad = torch.randn(30, 2, generator=g) + 6
    score = MixtureScore.from_samples([good, bad], real)
    values = [score(np.array([1 - t, t])) for t in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert values == sorted(values) and values[0] < values[-1]


def test_score_is_never_negative() -> None:
    rng = np.random.default_rng(4)
    for seed in range(20):
        score = MixtureScore.from_samples(components(seed), real_points(seed))
        for _ in range(10):
            assert score(rng.dirichlet(np.ones(3))) >= 0.0


# --- propose ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.001, 0.05, 0.5, 5.0])
def test_propose_keeps_a_probability_vector(sigma: float) -> None:
    rng = np.random.default_rng(5)
    for _ in range(500):
        size = int(rng.integers(1, 10))
        weights = rng.dirichlet(np.ones(size))
        child = propose(weights, sigma, rng)
        assert child.shape == weights.shape
        assert np.all(child >= 0)
        assert child.sum() == pytest.approx(1.0, abs=1e-12)


def test_propose_moves_by_about_sigma() -> None:
    rng = np.random.default_rng(6)
    weights = np.full(4, 0.25)
    steps = np.array([propose(weights, 0.01, rng) - weights for _ in range(2000)])
    assert 0.002 < np.abs(steps).mean() < 0.02
    assert np.any(steps != 0)


def test_propose_all_zero_falls_back_to_a_copy_of_the_parent() -> None:
    weights = np.array([0.5, 0.5])
    fell_back = 0
    for seed in range(200):
        child = propose(weights, 1000.0, np.random.default_rng(seed))
        assert child is not weights
        assert np.all(child >= 0) and child.sum() == pytest.approx(1.0)
        fell_back += bool(np.array_equal(child, weights))
    assert fell_back > 0  # both coordinates negative happens ~1/4 of the time


# --- evolve_weights -------------------------------------------------------------------------------


def test_evolve_never_accepts_a_worse_score() -> None:
    """Property over many seeds: the returned score is ≤ the initial one and is the returned weights' score."""
    for seed in range(200):
        rng = np.random.default_rng(seed)
        c = int(rng.integers(1, 6))
        score = MixtureScore.from_samples(components(seed, c=c, m=8), real_points(seed, n=13))
        initial = rng.dirichlet(np.ones(c))
        start = score(initial)
        sigma = float(rng.choice([0.001, 0.05, 0.3, 2.0]))
        steps = int(rng.integers(0, 25))
        weights, best = evolve_weights(initial.copy(), score, sigma, steps, rng)
        assert best <= start
        assert best == pytest.approx(score(weights), abs=1e-15)
        assert np.all(weights >= 0) and weights.sum() == pytest.approx(1.0)
        if steps == 0:
            assert np.array_equal(weights, initial) and best == start


def test_evolve_improves_a_bad_mixture() -> None:
    g = torch.Generator().manual_seed(7)
    real = torch.randn(50, 2, generator=g)
    good, bad = torch.randn(25, 2, generator=g), torch.randn(25, 2, generator=g) + 5
    score = MixtureScore.from_samples([good, bad], real)
    start = np.array([0.2, 0.8])
    weights, best = evolve_weights(start, score, 0.1, 100, np.random.default_rng(8))
    assert best < score(start)
    assert weights[0] > 0.2  # moved towards the good component


def test_evolve_is_reproducible_from_its_rng() -> None:
    score = MixtureScore.from_samples(components(9), real_points(9))
    start = np.full(3, 1 / 3)
    one = evolve_weights(start.copy(), score, 0.1, 30, np.random.default_rng(10))
    two = evolve_weights(start.copy(), score, 0.1, 30, np.random.default_rng(10))
    assert np.array_equal(one[0], two[0]) and one[1] == two[1]


# --- the grid's ensemble of images: on the features its caller passes in ------------------------


class Brightness(torch.nn.Module):
    """A generator of 1×4×4 images all of one grey level (z is ignored but for its batch size)."""

    def __init__(self, level: float) -> None:
        super().__init__()
        self.level = torch.nn.Parameter(torch.tensor(level))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.level + 0.05 * z[:, :16].reshape(-1, 1, 4, 4)


def test_the_grid_ensemble_of_images_is_scored_on_the_features_passed_in_else_on_pixels() -> None:
    from conftest import tiny

    from palomino.config import parse_config
    from palomino.data import Dataset
    from palomino.runs.grid_ensemble import grid_ensemble
    from palomino.scoring.extractors import ensemble_features

    config = parse_config(tiny(network={"latent_dim": 16}, training={"ensemble": {"es_steps": 20}}))
    samples = (0.5 + 0.05 * torch.randn(2000, 1, 4, 4, generator=torch.Generator().manual_seed(0))).float()
    images = Dataset("greys", samples, None, "image")
    generators, cells = [Brightness(0.5), Brightness(-0.5)], ["0-0", "0-1"]
    seen = []

    def features(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape)
        return x.flatten(1)[:, :3]

    grid = grid_ensemble(generators, cells, images, config, features=features)
    assert grid.score_name == "fid (classifier features)" and seen
    assert grid.ensemble.weights[0] > 0.9  # the one of the data's brightness
    assert grid_ensemble(generators, cells, images, config).score_name == "mmd2"
    # None configured (no scoring.classifier, no $PALOMINO_CLASSIFIER), or points: nothing to pass in.
    assert ensemble_features(config, "points") is None
