"""MNIST and Fashion-MNIST: IDX files, gzipped or raw."""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from palomino.data.dataset import Dataset, check_split, image_dataset
from palomino.data.fetch import (
    FETCH_ERRORS,
    data_dir,
    download_any,
    how_to_get,
    leaves_nothing_on_failure,
    missing_files_error,
)
from palomino.errors import DatasetError

# IDX type byte → big-endian numpy dtype (the format's own table).
_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_PREFIX = {"train": "train", "test": "t10k"}
# Debian's dataset-fashion-mnist package: the four canonical *.gz names.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class IdxSource:
    mirrors: tuple[str, ...]  # base URLs, each holding the four .gz files
    md5: dict[str, str]  # of the published .gz files (re-packed copies, e.g. Debian's, differ)
    extra_dirs: tuple[Path, ...]  # searched after data_dir(name) when data.dir is unset
    class_names: tuple[str, ...]


SOURCES = {
    "mnist": IdxSource(
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
        md5={
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
        extra_dirs=(),
        class_names=tuple(str(d) for d in range(10)),
    ),
    "fashion_mnist": IdxSource(
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        md5={
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
        extra_dirs=(DEBIAN_FASHION_MNIST,),
        class_names=(
            "T-shirt/top",
            "Trouser",
            "Pullover",
            "Dress",
            "Coat",
            "Sandal",
            "Shirt",
            "Sneaker",
            "Bag",
            "Ankle boot",
        ),
    ),
}


def read_idx(path: Path) -> np.ndarray:
    """Parse one IDX file (gzipped if it ends in .gz), checking magic number and size."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:  # EOFError: truncated gzip stream
        raise DatasetError(f"{path}: cannot read ({e}); delete it and fetch it again") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise DatasetError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()})")
    ndim, header = raw[3], 4 + 4 * raw[3]
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_DTYPES[raw[2]])
    expected = header + math.prod(dims) * dtype.itemsize
    if len(raw) != expected:
        raise DatasetError(
            f"{path}: truncated or corrupt IDX file ({len(raw)} bytes, header says {expected}); "
            "delete it and fetch it again"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def split_files(split: str) -> list[str]:
    p = _PREFIX[split]
    return [f"{p}-images-idx3-ubyte", f"{p}-labels-idx1-ubyte"]


def _find(directory: Path, stem: str) -> Path | None:
    # The canonical name or the dotted one some mirrors use (train-images.idx3-ubyte), gz or raw.
    for name in dict.fromkeys((stem, stem.replace("-idx", ".idx"))):
        for candidate in (directory / f"{name}.gz", directory / name):
            if candidate.is_file():
                return candidate
    return None


def locate(dirs: list[Path], split: str) -> list[Path] | None:
    """The split's [images, labels] from the first directory holding both."""
    for d in dirs:
        found = [p for stem in split_files(split) if (p := _find(d, stem))]
        if len(found) == 2:
            return found
    return None


def _fetch(cfg: Any, source: IdxSource, dirs: list[Path], split: str) -> list[Path]:
    """Download the split into dirs[0] if allowed; otherwise, or on failure, say what goes where."""
    target, files = dirs[0], [f + ".gz" for f in split_files(split)]
    reason = "downloading is off (data.download=false)"
    if getattr(cfg, "download", False):
        try:
            with leaves_nothing_on_failure(target):  # both files or neither
                for f in files:
                    download_any(tuple(m + f for m in source.mirrors), target / f, source.md5[f])
            return [target / f for f in files]
        except FETCH_ERRORS as e:
            reason = f"download failed ({e})"
    other = "test" if split == "train" else "train"
    here = next((d for d in dirs if locate([d], other)), None)
    hint = f"Only the {other} split ({_PREFIX[other]}-*) is here ({here}): set data.split={other}."
    raise missing_files_error(
        f"{cfg.name} {split} split",
        dirs,
        target,
        files,
        reason,
        " (gzipped or raw)",
        hint if here else how_to_get(cfg.name),
    )


def load_idx(cfg: Any, seed: int) -> Dataset:
    source = SOURCES[cfg.name]
    split = check_split(cfg.split)
    dirs = [data_dir(cfg.name, cfg.dir)] + ([*source.extra_dirs] if cfg.dir is None else [])
    image_path, label_path = locate(dirs, split) or _fetch(cfg, source, dirs, split)
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DatasetError(f"{image_path}: expected uint8 images (N, H, W), got {images.dtype}")
    if labels.shape != (len(images),):
        raise DatasetError(f"{label_path}: {labels.shape} labels for {len(images)} images")
    # (N, H, W) → (N, 1, H, W): one grey channel.
    return image_dataset(cfg.name, images[:, None], labels, source.class_names, cfg.size, seed)
