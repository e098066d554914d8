"""Real images a run never trained on: what the memorization ratio is calibrated by in `palomino score`.

A run trains on its `data` (split, size, classes); the images of the same split it left out (data.size
kept a subset) come first — the same distribution, as the referee holds out 2,000 of its split — then
the other split. Whatever is chosen, an image that is also a training image is dropped (compared by
content, so no subsetting rule is re-derived here). None, and why, when no image is left: e.g. a run
on all of the offline MNIST copy, which holds the test split only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from palomino.config import DataConfig
from palomino.data import Dataset, load_dataset
from palomino.errors import DatasetError

HELD_OUT_IMAGES = 2000  # as many as the referee holds out; the ratio's median settles well before


@dataclass(frozen=True)
class HeldOut:
    images: torch.Tensor  # generator space [−1, 1], none of them a training image
    labels: torch.Tensor | None
    source: str  # where they came from, for scores.json

    def for_class(self, label: int) -> HeldOut | None:
        if self.labels is None:
            return None
        keep = self.labels == label
        if not bool(keep.any()):
            return None
        return HeldOut(self.images[keep], self.labels[keep], f"{self.source}, class {label}")


def _rows(images: torch.Tensor) -> list[bytes]:
    return [row.numpy().tobytes() for row in images.flatten(1).contiguous()]


def held_out_images(
    data: DataConfig, train: Dataset, *, seed: int = 0, limit: int = HELD_OUT_IMAGES
) -> tuple[HeldOut | None, str]:
    """Up to `limit` images (seeded) of `data`'s dataset that are not in `train` (the run's training
    data, as load_dataset(data) gives it), and where they came from; (None, why) when there are none."""
    if train.kind != "image":
        return None, f"{train.name} is not images"
    seen = set(_rows(train.samples))
    other = "test" if data.split == "train" else "train"
    tried = []
    for split in (data.split, other):
        try:  # never download just to find held-out images
            pool = load_dataset(data.model_copy(update={"split": split, "size": 0, "download": False}), seed)
        except DatasetError:
            tried.append(f"no {split} split here")
            continue
        keep = torch.tensor([row not in seen for row in _rows(pool.samples)], dtype=torch.bool)
        if not bool(keep.any()):
            tried.append(f"every image of the {split} split is a training image")
            continue
        index = keep.nonzero().squeeze(1)
        index = index[torch.randperm(len(index), generator=torch.Generator().manual_seed(seed))[:limit]]
        labels = pool.labels[index] if pool.labels is not None else None
        where = "the rest of" if split == data.split else "the other split,"
        return HeldOut(pool.samples[index], labels, f"{where} {train.name}'s {split} split ({len(index)} images)"), ""
    return None, f"no held-out images of {train.name}: {'; '.join(tried)}"
