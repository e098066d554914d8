"""2-D Gaussian mixtures whose modes are known, so mode collapse can be measured."""

from __future__ import annotations

import math
from typing import Any

import torch

from palomino.data.dataset import Dataset
from palomino.errors import DatasetError

DEFAULT_POINTS = 10_000


def ring_modes(k: int = 8, radius: float = 2.0) -> torch.Tensor:
    angles = torch.arange(k, dtype=torch.float64) * (2 * math.pi / k)
    return (radius * torch.stack([angles.cos(), angles.sin()], dim=1)).float()


def grid_modes(values: tuple[float, ...] = (-4.0, -2.0, 0.0, 2.0, 4.0)) -> torch.Tensor:
    v = torch.tensor(values)
    return torch.cartesian_prod(v, v)  # row-major: (x0, y0), (x0, y1), ...


# name → (mode centres, per-mode sigma), the usual Lipizzaner/VEEGAN settings.
TOYS = {"gaussian_ring": (ring_modes, 0.02), "gaussian_grid": (grid_modes, 0.05)}


def load_toy(cfg: Any, seed: int) -> Dataset:
    make_modes, sigma = TOYS[cfg.name]
    if cfg.size < 0:
        raise DatasetError(f"data.size must be >= 0 (0 = {DEFAULT_POINTS} points), got {cfg.size}")
    n = cfg.size or DEFAULT_POINTS
    modes = make_modes()
    g = torch.Generator().manual_seed(seed)
    # Equal mixture: counts differ by at most one, in random order.
    labels = torch.randperm(n, generator=g) % len(modes)
    points = modes[labels] + sigma * torch.randn(n, 2, generator=g)
    return Dataset(name=cfg.name, samples=points, labels=labels, kind="points", modes=modes, mode_std=sigma)
