"""What a submitted experiment's data will take in each cell's memory, estimated before any cell
loads it, so one config cannot take a worker down (torch-free: the orchestrator runs it).

Images live in a cell as float32 in [-1, 1], C×S×S each, and loading holds a second copy while it
converts; the estimate counts both."""

from __future__ import annotations

import os
from pathlib import Path

from palomino.config.models import DataConfig

# Samples in each split, and the native C and S, of the datasets Palomino reads by name.
SPLIT_SIZES = {"mnist": {"train": 60_000, "test": 10_000}, "fashion_mnist": {"train": 60_000, "test": 10_000},
               "cifar10": {"train": 50_000, "test": 10_000}}  # fmt: skip
NATIVE = {"mnist": (1, 28), "fashion_mnist": (1, 28), "cifar10": (3, 32)}
FOLDER_DEFAULTS = (1, 64)  # image_folder: channels, image_size when not given
TOY_POINTS = 10_000
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
MAX_COUNTED_FILES = 10_000_000


def count_images(folder: Path) -> int:
    """PNG/JPEG files under `folder` (what image_folder would load), counted without opening one."""
    total = 0
    for _, _, names in os.walk(folder):
        total += sum(1 for name in names if name.lower().endswith(IMAGE_SUFFIXES))
        if total >= MAX_COUNTED_FILES:
            break
    return total


def data_bytes(data: DataConfig) -> tuple[int, str]:
    """(bytes of one cell's copy of the data while it loads, how that comes about)."""
    if data.name in ("gaussian_ring", "gaussian_grid"):
        points = data.size or TOY_POINTS
        return points * 2 * 4, f"{points:,} points"
    if data.name == "image_folder":
        channels, side = data.channels or FOLDER_DEFAULTS[0], data.image_size or FOLDER_DEFAULTS[1]
        available = count_images(Path(data.dir)) if data.dir is not None and Path(data.dir).is_dir() else 0
        count = min(data.size, available) if data.size else available
    else:
        channels, side = NATIVE[data.name]
        count = data.size or SPLIT_SIZES[data.name][data.split]
    return count * channels * side * side * 4 * 2, f"{count:,} images of {channels}×{side}×{side}"


def check_data_memory(data: DataConfig, limit: int) -> None:
    """ValueError naming the estimate and what to lower when the data would not fit `limit` bytes."""
    need, what = data_bytes(data)
    if need > limit:
        raise ValueError(
            f"data: {what} take about {need / 1024**3:.1f} GiB in each cell while they load, over the limit of "
            f"{limit / 1024**3:.1f} GiB (PALOMINO_MAX_DATA_BYTES); lower data.size or data.image_size"
        )
