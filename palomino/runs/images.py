"""PNG pictures of samples: an image grid, or a scatter plot for 2-D points (Pillow only)."""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from PIL import Image, ImageDraw


def image_grid(images: torch.Tensor, columns: int | None = None, pad: int = 2) -> Image.Image:
    """`images`: (N, C, H, W) in [0, 1] → one picture, `columns` wide."""
    images = images.detach().float().clamp(0, 1).cpu()
    n, channels, height, width = images.shape
    columns = columns or max(1, math.ceil(math.sqrt(n)))
    rows = math.ceil(n / columns)
    canvas = np.zeros((rows * (height + pad) + pad, columns * (width + pad) + pad, channels), dtype=np.uint8)
    pixels = (images.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    for index in range(n):
        r, c = divmod(index, columns)
        y, x = pad + r * (height + pad), pad + c * (width + pad)
        canvas[y : y + height, x : x + width] = pixels[index]
    return Image.fromarray(canvas[..., 0] if channels == 1 else canvas, mode="L" if channels == 1 else "RGB")


def scatter(points: torch.Tensor, reference: torch.Tensor | None = None, size: int = 400) -> Image.Image:
    """2-D points as dots; `reference` (e.g. mode centres) drawn as red rings; axes fit both."""
    pts = points.detach().float().cpu().numpy()
    ref = reference.detach().float().cpu().numpy() if reference is not None else np.zeros((0, 2))
    extent = max(float(np.abs(np.concatenate([pts, ref])).max(initial=1.0)) * 1.1, 1e-3)

    def to_px(xy: np.ndarray) -> np.ndarray:
        return (xy + extent) / (2 * extent) * (size - 1)

    picture = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(picture)
    for x, y in to_px(pts):
        draw.point((x, size - 1 - y), fill=(20, 60, 160))
    for x, y in to_px(ref):
        draw.ellipse((x - 5, size - 6 - y, x + 5, size + 4 - y), outline=(200, 30, 30))
    return picture


def picture_of(samples: torch.Tensor, kind: str, reference: torch.Tensor | None = None) -> Image.Image:
    """Samples in data space → a picture (image grid or scatter plot)."""
    return image_grid(samples) if kind == "image" else scatter(samples, reference)


def progress_png(samples: torch.Tensor, kind: str, reference: torch.Tensor | None = None) -> bytes:
    """A generator's raw output (generator space) → the PNG of it that a run directory keeps."""
    from palomino.runs.mixture import to_data_space

    return png_bytes(picture_of(to_data_space(samples, kind), kind, reference))


def real_png(dataset, n: int = 64, seed: int = 0) -> bytes:
    """A PNG of `n` real training samples (2,500 points for the toys), drawn like the generated ones."""
    if dataset.kind != "image":
        n = 2500
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(len(dataset), generator=generator)[: min(n, len(dataset))]
    return png_bytes(picture_of(dataset.to_data_space(dataset.samples[index]), dataset.kind, dataset.modes))


def png_bytes(picture: Image.Image) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()
