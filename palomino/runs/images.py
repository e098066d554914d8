"""PNG pictures of samples: an image grid, or a scatter plot for 2-D points (Pillow and numpy).

Torch is imported only where a tensor is made: the torch-free orchestrator tiles the pictures
of a partitioned run's classes (`tile_pngs`)."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

if TYPE_CHECKING:
    import torch

PICTURE_SAMPLES = {"image": 64, "points": 2500}  # what a picture of samples shows: an 8×8 grid, or a scatter


def picture_samples(kind: str) -> int:
    """How many samples a picture of `kind` ("image" or "points") shows."""
    return PICTURE_SAMPLES[kind]


def tiled(
    pictures: list[np.ndarray], columns: int | None = None, pad: int = 2, margin: int = 2, background: int = 0
) -> np.ndarray:
    """Pictures (H, W, C) uint8, of up to different sizes, in a grid `columns` wide (near-square by
    default), `pad` apart and `margin` from the edges → one (H', W', C) array."""
    height, width = max(p.shape[0] for p in pictures), max(p.shape[1] for p in pictures)
    columns = columns or max(1, math.ceil(math.sqrt(len(pictures))))
    rows = math.ceil(len(pictures) / columns)
    shape = (2 * margin + rows * (height + pad) - pad, 2 * margin + columns * (width + pad) - pad, pictures[0].shape[2])
    canvas = np.full(shape, background, dtype=np.uint8)
    for index, picture in enumerate(pictures):
        r, c = divmod(index, columns)
        y, x = margin + r * (height + pad), margin + c * (width + pad)
        canvas[y : y + picture.shape[0], x : x + picture.shape[1]] = picture
    return canvas


def image_grid(images: torch.Tensor, columns: int | None = None, pad: int = 2) -> Image.Image:
    """`images`: (N, C, H, W) in [0, 1] → one picture, `columns` wide."""
    pixels = (images.detach().float().clamp(0, 1).cpu().permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    canvas = tiled(list(pixels), columns, pad, margin=pad)
    return Image.fromarray(
        canvas[..., 0] if canvas.shape[2] == 1 else canvas, mode="L" if canvas.shape[2] == 1 else "RGB"
    )


def tile_pngs(pictures: list[bytes], gap: int = 8) -> bytes:
    """PNG pictures side by side in a near-square grid, in order, on white."""
    images = [np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in pictures]
    return png_bytes(Image.fromarray(tiled(images, pad=gap, margin=0, background=255), mode="RGB"))


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


def to_data_space(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Generator output → data space: images from [−1, 1] to [0, 1]; points unchanged."""
    return ((x + 1) / 2).clamp(0, 1) if kind == "image" else x


def progress_png(samples: torch.Tensor, kind: str, reference: torch.Tensor | None = None) -> bytes:
    """A generator's raw output (generator space) → the PNG of it that a run directory keeps."""
    return png_bytes(picture_of(to_data_space(samples, kind), kind, reference))


def real_png(dataset, seed: int = 0) -> bytes:
    """A PNG of real training samples, as many as a picture of generated ones shows (`picture_samples`)."""
    import torch

    n = picture_samples(dataset.kind)
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(len(dataset), generator=generator)[: min(n, len(dataset))]
    return png_bytes(picture_of(dataset.to_data_space(dataset.samples[index]), dataset.kind, dataset.modes))


def png_bytes(picture: Image.Image) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()
