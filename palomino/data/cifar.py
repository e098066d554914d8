"""CIFAR-10, binary version only: the Python version is pickled, and pickle can run code."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from palomino.data.dataset import Dataset, check_split, image_dataset
from palomino.data.fetch import (
    FETCH_ERRORS,
    data_dir,
    download,
    how_to_get,
    leaves_nothing_on_failure,
    missing_files_error,
)
from palomino.errors import DatasetError

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
SUBDIR = "cifar-10-batches-bin"
RECORD = 1 + 3 * 32 * 32  # label byte + CHW pixels
FILES = {"train": [f"data_batch_{i}.bin" for i in range(1, 6)], "test": ["test_batch.bin"]}
CLASS_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One .bin file → (images uint8 (N, 3, 32, 32), labels uint8 (N,))."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e})") from e
    if raw.size == 0 or raw.size % RECORD:
        raise DatasetError(
            f"{path}: {raw.size} bytes is not a whole number of {RECORD}-byte CIFAR-10 records; "
            "it is truncated or not from cifar-10-binary.tar.gz"
        )
    records = raw.reshape(-1, RECORD)
    labels = records[:, 0]
    if labels.max() > 9:
        raise DatasetError(f"{path}: label {labels.max()} out of range 0-9; corrupt file")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _locate(bases: list[Path], names: list[str]) -> list[Path] | None:
    for d in (d for b in bases for d in (b, b / SUBDIR)):
        if all((d / n).is_file() for n in names):
            return [d / n for n in names]
    return None


def _pickled_hint(bases: list[Path]) -> str:
    for d in (d for b in bases for d in (b, b / "cifar-10-batches-py")):
        if (d / "data_batch_1").is_file():
            return (
                f"{d} holds the pickled Python version of CIFAR-10, which palomino never loads "
                f"(unpickling can run code): get the binary version from {URL} and unpack it "
                "instead."
            )
    return ""


def _fetch(cfg: Any, bases: list[Path], split: str) -> list[Path]:
    """Fetch and unpack into bases[0] if allowed; otherwise, or on failure, say what goes where."""
    reason = "downloading is off (data.download=false)"
    if getattr(cfg, "download", False):
        archive = bases[0] / "cifar-10-binary.tar.gz"
        try:
            with leaves_nothing_on_failure(bases[0]):  # no archive, no half-unpacked folder, no empty folder
                download(URL, archive, MD5)
                with tarfile.open(archive) as tar:
                    # Only the batch folder's regular files; the "data" filter refuses unsafe paths.
                    members = [m for m in tar if m.isfile() and m.name.startswith(SUBDIR + "/")]
                    tar.extractall(bases[0], members=members, filter="data")
                archive.unlink()
                found = _locate(bases[:1], FILES[split])
                if not found:
                    raise ValueError(f"{URL} did not hold {SUBDIR}/{FILES[split][0]}")
            return found
        except (*FETCH_ERRORS, tarfile.TarError) as e:
            reason = f"download failed ({e})"
    searched = [d for b in bases for d in (b, b / SUBDIR)]
    raise missing_files_error(
        f"cifar10 {split} split",
        searched,
        bases[0] / SUBDIR,
        FILES[split],
        reason,
        f" (they come in {URL})",
        _pickled_hint(bases) or how_to_get("cifar10"),
    )


def load_cifar10(cfg: Any, seed: int) -> Dataset:
    split = check_split(cfg.split)
    bases = [data_dir("cifar10", cfg.dir)]
    batches = [read_batch(p) for p in _locate(bases, FILES[split]) or _fetch(cfg, bases, split)]
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    return image_dataset("cifar10", images, labels, CLASS_NAMES, cfg.size, seed)
