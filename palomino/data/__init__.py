"""Datasets: MNIST / Fashion-MNIST (IDX), CIFAR-10 (binary), an image folder, 2-D toys.

`load_dataset(cfg, seed)` is the one entry point; it is the only place that branches on the
dataset's name.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable
from typing import Any

from palomino.data.cifar import load_cifar10
from palomino.data.classes import class_counts, class_priors, class_subset, diet, label_count, select_classes
from palomino.data.dataset import Dataset
from palomino.data.fetch import DATA_DIR_ENV, data_dir
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
    """Load the dataset a DataConfig (duck-typed) names; `seed` drives toys and subsetting.

    With `classes` set, only those labels are kept and `size` counts samples of those.
    """
    loader = _LOADERS.get(cfg.name)
    if loader is None:
        raise DatasetError(f"unknown dataset {cfg.name!r}; valid names: {', '.join(DATASET_NAMES)}")
    classes = getattr(cfg, "classes", None)
    if not classes:
        return loader(cfg, seed)
    whole = loader(_all_samples(cfg), seed)
    return select_classes(whole, classes, cfg.size, seed)


def _all_samples(cfg: Any) -> Any:
    """`cfg` with size 0: the class filter subsets afterwards."""
    if hasattr(cfg, "model_copy"):
        return cfg.model_copy(update={"size": 0})
    copy = _copy.copy(cfg)
    copy.size = 0
    return copy


__all__ = [
    "DATASET_NAMES",
    "DATA_DIR_ENV",
    "Dataset",
    "DatasetError",
    "class_counts",
    "class_priors",
    "class_subset",
    "data_dir",
    "diet",
    "label_count",
    "load_dataset",
    "read_idx",
    "select_classes",
]
