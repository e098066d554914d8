"""The memorization ratio (palomino.scoring.memorization) on real MNIST digits: held-out digits read
about 1, copies of the training digits far below the 0.9 flag, noise above 1; chunked distances
equal unchunked ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from palomino.config import DataConfig
from palomino.data import load_dataset
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
