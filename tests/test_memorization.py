"""The memorization ratio (palomino.scoring.memorization) on real MNIST digits: held-out digits read
about 1, copies of the training digits far below the 0.9 flag, noise above 1; chunked distances
equal unchunked ones; and `palomino score`'s `memorization` metric (ScoringContext) against the
run's held-out images: a mixture that copies its training digits is flagged, one of noise is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from palomino.config import DataConfig, NetworkConfig
from palomino.data import load_dataset
from palomino.runs import Mixture
from palomino.scoring import ScoringContext, ScoringOptions
from palomino.scoring.memorization import (
    MEMORIZING_BELOW,
    Memorization,
    memorization_ratio,
    nearest_distances,
)


@pytest.fixture(scope="module")
def digits(mnist_dir: Path) -> torch.Tensor:
    """MNIST's test split in generator space [−1, 1], in a seeded order."""
    samples = load_dataset(DataConfig(name="mnist", dir=mnist_dir, split="test")).samples
    return samples[torch.randperm(len(samples), generator=torch.Generator().manual_seed(0))]


def test_held_out_digits_read_about_one(digits: torch.Tensor) -> None:
    train, held_out, others = digits[:8000], digits[8000:9000], digits[9000:]
    result = memorization_ratio(others, train, held_out)
    assert result.ratio == pytest.approx(1.0, abs=0.05) and not result.memorizing
    assert (result.samples, result.held_out_images, result.training_images) == (1000, 1000, 8000)
    assert memorization_ratio(held_out, train, held_out).ratio == 1.0  # the calibration set itself: exactly 1


def test_copies_of_training_digits_are_flagged_and_noise_reads_above_one(digits: torch.Tensor) -> None:
    train, held_out = digits[:8000], digits[8000:10000]
    noise = torch.Generator().manual_seed(1)
    copies = (train[:2000] + 0.01 * torch.randn(2000, 1, 28, 28, generator=noise)).clamp(-1, 1)
    copied = memorization_ratio(copies, train, held_out)
    assert copied.ratio < 0.1 and copied.memorizing and copied.ratio < MEMORIZING_BELOW
    static = torch.rand(2000, 1, 28, 28, generator=noise) * 2 - 1
    random = memorization_ratio(static, train, held_out)
    assert random.ratio > 1.5 and not random.memorizing
    assert copied.as_dict()["memorizing"] is True and random.as_dict()["value"] == random.ratio


def test_chunked_distances_equal_unchunked_ones(digits: torch.Tensor) -> None:
    queries, references = digits[:300], digits[300:2300]
    exact = torch.cdist(queries.flatten(1).double(), references.flatten(1).double()).min(1).values
    whole = nearest_distances(queries, references, query_chunk=10_000, reference_chunk=100_000)
    chunked = nearest_distances(queries, references, query_chunk=7, reference_chunk=129)
    assert torch.allclose(whole.double(), exact, atol=1e-3) and torch.allclose(chunked, whole, atol=1e-4)
    a = memorization_ratio(queries, references, digits[2300:2600])
    b = memorization_ratio(queries, references, digits[2300:2600], query_chunk=64, reference_chunk=500)
    assert b.ratio == pytest.approx(a.ratio, rel=1e-5)
    with pytest.raises(ValueError, match="cannot be compared"):
        nearest_distances(queries, torch.zeros(3, 10))


def test_a_zero_held_out_distance_gives_an_infinite_ratio_not_a_division_error() -> None:
    assert Memorization(1.0, 0.0, 1, 1, 1).ratio == float("inf")


class Copier(nn.Module):
    """A 'generator' that returns training images (in generator space), one per latent vector."""

    def __init__(self, images: torch.Tensor, noise: bool = False) -> None:
        super().__init__()
        self.images, self.noise = images, noise
        self.anchor = nn.Parameter(torch.zeros(1))  # Mixture.sample asks a generator for its device

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.noise:
            return torch.tanh(z[:, :1, None, None].expand(-1, 1, 28, 28) * 3 + z.sum(1)[:, None, None, None])
        index = (z[:, 0].abs() * 1e6).long() % len(self.images)
        return self.images[index]


def mixture_of(generator: nn.Module) -> Mixture:
    network = NetworkConfig(name="mlp", hidden=16, latent_dim=8)
    return Mixture([generator], np.ones(1), ["0-0"], network, (1, 28, 28), "image", {})


def test_palomino_scores_flag_a_copier_against_the_runs_held_out_digits(mnist_dir: Path, tmp_path: Path) -> None:
    data = DataConfig(name="mnist", dir=mnist_dir, split="test", size=1000)
    options = ScoringOptions(metrics=["memorization"], samples=600, cache_dir=tmp_path)
    context = ScoringContext.prepare(data, options, data_seed=3)
    assert context.extractor is None  # pixels only: no classifier needed
    train = context.dataset.samples
    copier = context.score(mixture_of(Copier(train)))["metrics"]["memorization"]
    assert copier["memorizing"] is True and copier["value"] < 0.1
    assert (copier["samples"], copier["training_images"], copier["held_out_images"]) == (600, 1000, 2000)
    assert copier["held_out_source"] == "the rest of mnist's test split (2000 images)"
    noise = context.score(mixture_of(Copier(train, noise=True)))["metrics"]["memorization"]
    assert noise["memorizing"] is False and noise["value"] > 1

    # One class's context: its own training and held-out digits.
    sevens = context.for_class(7)
    assert bool((sevens.held_out.labels == 7).all()) and len(sevens.held_out.images) > 100
    assert sevens.score(mixture_of(Copier(sevens.dataset.samples)))["metrics"]["memorization"]["memorizing"]

    # A run on every image here has nothing held out: not applicable, and why.
    whole = ScoringContext.prepare(data.model_copy(update={"size": 0}), options)
    result = whole.score(mixture_of(Copier(train)))["metrics"]["memorization"]
    assert result["value"] is None
    assert "every image of the test split is a training image; no train split here" in result["not_applicable"]
