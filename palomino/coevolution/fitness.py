"""All-vs-all neighbourhood fitness: every generator against every discriminator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from palomino.nn import GanLoss, apply

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
    d_reals: Sequence[torch.Tensor] | None = None,
    labels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(G×D generator losses, G×D discriminator losses, each D's logits on `real`).

    `d_reals` passes in logits already computed for these discriminators on `real`.
    `labels`: conditional networks' labels, shared by `real` and every fake (generated with them).
    Tables are built on the device and moved once: no synchronisation per pair.
    """
    d_reals = list(d_reals) if d_reals is not None else [apply(d, real, labels) for d in discriminators]
    g_rows, d_rows = [], []
    for fake in fakes:
        d_fakes = [apply(d, fake, labels) for d in discriminators]
        g_rows.append(torch.stack([loss.generator(f) for f in d_fakes]))
        d_rows.append(torch.stack([loss.discriminator_from_logits(r, f) for r, f in zip(d_reals, d_fakes)]))
    return torch.stack(g_rows).cpu(), torch.stack(d_rows).cpu(), d_reals
