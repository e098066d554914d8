"""The in-memory dataset every source produces, and the helpers the sources share."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from palomino.errors import DatasetError

KINDS = ("image", "points")


# eq=False: tensors have no meaningful `==` for a dataclass; identity is what we want.
@dataclass(frozen=True, eq=False)
class Dataset:
    """Samples in model space (images in [-1, 1], toy points raw) with optional labels."""

    name: str
    samples: torch.Tensor
    labels: torch.Tensor | None
    kind: str
    modes: torch.Tensor | None = None
    mode_std: float | None = None
    class_names: tuple[str, ...] = ()
    # What is computed from these samples once and asked for by many (each cell of a grid asks for
    # the same k-means regions): per instance, so a subset (`rows`) starts empty.
    derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.samples.dtype != torch.float32:
            raise ValueError(f"samples must be float32, got {self.samples.dtype}")
        if self.labels is not None and self.labels.shape != (len(self.samples),):
            raise ValueError(f"labels shape {tuple(self.labels.shape)} != ({len(self.samples)},)")

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.samples.shape[1:])

    def __len__(self) -> int:
        return len(self.samples)

    def rows(self, index: torch.Tensor) -> Dataset:
        """The samples at `index` (and their labels): a subset, a region, a class, a split."""
        labels = None if self.labels is None else self.labels[index]
        return replace(self, samples=self.samples[index], labels=labels)

    def to_data_space(self, x: torch.Tensor) -> torch.Tensor:
        """Model output → what the data looks like: pixels in [0, 1], points unchanged."""
        if self.kind == "image":
            return ((x + 1) / 2).clamp(0, 1)
        return x


def check_split(split: str) -> str:
    if split not in ("train", "test"):
        raise DatasetError(f"data.split must be 'train' or 'test', got {split!r}")
    return split


def check_size(size: int, n: int, what: str) -> None:
    if size < 0:
        raise DatasetError(f"data.size must be >= 0 (0 = all), got {size}")
    if size > n:
        raise DatasetError(f"data.size={size} but {what} has only {n} samples; use 0 for all")


def shuffled(n: int, seed: int) -> np.ndarray:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()


def subset_indices(n: int, size: int, seed: int, what: str) -> np.ndarray | None:
    """Indices of the first `size` of a seeded shuffle of range(n); None keeps everything."""
    check_size(size, n, what)
    return shuffled(n, seed)[:size] if size else None


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, C, H, W) → float32 in [-1, 1], vectorised (no per-image loop)."""
    return torch.from_numpy(images.astype(np.float32)).div_(127.5).sub_(1.0)


def image_dataset(
    name: str,
    images: np.ndarray,
    labels: np.ndarray,
    class_names: tuple[str, ...],
    size: int,
    seed: int,
) -> Dataset:
    """Subset uint8 images first (cheaper than subsetting floats), then scale to [-1, 1]."""
    keep = subset_indices(len(images), size, seed, name)
    if keep is not None:
        images, labels = images[keep], labels[keep]
    return Dataset(
        name=name,
        samples=images_to_tensor(images),
        labels=torch.from_numpy(labels.astype(np.int64)),
        kind="image",
        class_names=class_names,
    )
