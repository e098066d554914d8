"""Datasets: MNIST / Fashion-MNIST (IDX), CIFAR-10 (binary), an image folder, 2-D toys.

`load_dataset(cfg, seed)` is the one entry point; it is the only place that branches on the
dataset's name.
"""

from __future__ import annotations

from typing import Any, Callable

from palomino.data.cifar import load_cifar10
from palomino.data.dataset import Dataset
from palomino.data.folder import load_folder
from palomino.data.idx import load_idx, read_idx
from palomino.data.toys import load_toy
from palomino.errors import DatasetError

_LOADERS: dict[str, Callable[[Any, int], Dataset]] = {
    "mnist": load_idx,
    "fashion_mnist": load_idx,
    "cifar10": load_cifar10,
    "image_folder": load_folder,
    "gaussian_ring": load_toy,
    "gaussian_grid": load_toy,
}
DATASET_NAMES = tuple(_LOADERS)


def load_dataset(cfg: Any, seed: int = 0) -> Dataset:
    """Load the dataset a DataConfig (duck-typed) names; `seed` drives toys and subsetting."""
    loader = _LOADERS.get(cfg.name)
    if loader is None:
        raise DatasetError(f"unknown dataset {cfg.name!r}; valid names: {', '.join(DATASET_NAMES)}")
    return loader(cfg, seed)


__all__ = ["DATASET_NAMES", "Dataset", "DatasetError", "load_dataset", "read_idx"]
