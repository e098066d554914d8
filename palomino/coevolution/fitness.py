"""All-vs-all neighbourhood fitness: every generator against every discriminator."""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import nn

from palomino.nn import GanLoss

Mode = Literal["average", "best", "worst"]


def aggregate(values: torch.Tensor, mode: Mode, dim: int) -> torch.Tensor:
    """Fitness values are losses, so `best` is the minimum and `worst` the maximum."""
    if mode == "average":
        return values.mean(dim=dim)
    if mode == "best":
        return values.min(dim=dim).values
    if mode == "worst":
        return values.max(dim=dim).values
    raise ValueError(f"unknown fitness mode {mode!r}: use average, best or worst")


@torch.no_grad()
def loss_table(
    fakes: Sequence[torch.Tensor],
    discriminators: Sequence[nn.Module],
    real: torch.Tensor,
    loss: GanLoss,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(G×D generator losses, G×D discriminator losses) for generated sets `fakes` vs `discriminators`."""
    g_table = torch.empty(len(fakes), len(discriminators))
    d_table = torch.empty(len(fakes), len(discriminators))
    for j, discriminator in enumerate(discriminators):
        d_real = discriminator(real)
        for i, fake in enumerate(fakes):
            d_fake = discriminator(fake)
            g_table[i, j] = loss.generator(d_fake)
            d_table[i, j] = loss.discriminator_from_logits(d_real, d_fake)
    return g_table, d_table
