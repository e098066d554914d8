"""A folder of PNG/JPEG images, one optional subfolder per class."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

from palomino.data.dataset import Dataset, check_size, images_to_tensor, shuffled
from palomino.errors import DatasetError

EXTENSIONS = {".png", ".jpg", ".jpeg"}
DEFAULT_SIZE = 64
DEFAULT_CHANNELS = 1


def _load_image(path: Path, mode: str, size: int) -> np.ndarray | None:
    """(size, size, C) uint8, centre-cropped to a square and resized; None if unreadable."""
    try:
        with Image.open(path) as im:
            # fit() crops the centre to the target's aspect ratio, then resizes; Lanczos keeps
            # downscaled detail without aliasing.
            im = ImageOps.fit(im.convert(mode), (size, size), method=Image.Resampling.LANCZOS)
            return np.asarray(im).reshape(size, size, -1)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        warnings.warn(f"skipping unreadable image {path}: {e}", stacklevel=2)
        return None


def load_folder(cfg: Any, seed: int) -> Dataset:
    if cfg.dir is None:
        raise DatasetError("data.name=image_folder needs data.dir: a folder of PNG/JPEG images")
    root = Path(cfg.dir)
    if not root.is_dir():
        raise DatasetError(f"image folder {root} does not exist or is not a directory")
    size = getattr(cfg, "image_size", None) or DEFAULT_SIZE
    channels = getattr(cfg, "channels", None) or DEFAULT_CHANNELS
    if channels not in (1, 3):
        raise DatasetError(f"data.channels must be 1 (grayscale) or 3 (RGB), got {channels}")

    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in EXTENSIONS and p.is_file())
    if not files:
        raise DatasetError(f"no PNG/JPEG images (.png, .jpg, .jpeg) found under {root}")
    # Class = immediate subfolder; images directly in root form a class named ".".
    keys = [p.relative_to(root).parts[0] if p.parent != root else "." for p in files]
    class_names = tuple(sorted(set(keys)))
    class_of = {k: i for i, k in enumerate(class_names)}
    if class_names == (".",):
        class_names = (root.name,)

    # Subset by file before decoding so a small `size` over a big folder stays fast; unreadable
    # files are skipped and the next ones in shuffled order fill their place.
    check_size(cfg.size, len(files), f"image folder {root}")
    wanted = cfg.size or len(files)
    order = shuffled(len(files), seed) if cfg.size else range(len(files))
    mode = "L" if channels == 1 else "RGB"
    images = np.empty((wanted, size, size, channels), dtype=np.uint8)
    labels: list[int] = []
    for i in order:
        if len(labels) == wanted:
            break
        pixels = _load_image(files[i], mode, size)
        if pixels is not None:
            images[len(labels)] = pixels
            labels.append(class_of[keys[i]])
    if not labels:
        raise DatasetError(f"none of the {len(files)} images under {root} could be read")
    # HWC → CHW, as the models expect.
    chw = np.ascontiguousarray(images[: len(labels)].transpose(0, 3, 1, 2))
    return Dataset(
        name="image_folder",
        samples=images_to_tensor(chw),
        labels=torch.tensor(labels, dtype=torch.int64),
        kind="image",
        class_names=class_names,
    )
