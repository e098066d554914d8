"""All-vs-all neighbourhood fitness: every generator against every discriminator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from palomino.nn import GanLoss, apply
from palomino.nn.stacked import apply_each, same_architecture

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
    Tables are built on the device and moved once: no synchronisation per pair. Perceptrons
    are evaluated stacked (a few calls for the whole table, nn/stacked.py).
    """
    if same_architecture(discriminators):
        return _stacked_table(fakes, discriminators, real, loss, d_reals, labels)
    d_reals = list(d_reals) if d_reals is not None else [apply(d, real, labels) for d in discriminators]
    g_rows, d_rows = [], []
    for fake in fakes:
        d_fakes = [apply(d, fake, labels) for d in discriminators]
        g_rows.append(torch.stack([loss.generator(f) for f in d_fakes]))
        d_rows.append(torch.stack([loss.discriminator_from_logits(r, f) for r, f in zip(d_reals, d_fakes)]))
    return torch.stack(g_rows).cpu(), torch.stack(d_rows).cpu(), d_reals


def _stacked_table(
    fakes: Sequence[torch.Tensor],
    discriminators: Sequence[nn.Module],
    real: torch.Tensor,
    loss: GanLoss,
    d_reals: Sequence[torch.Tensor] | None,
    labels: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """loss_table's result from one stacked evaluation: every D on every fake (and on `real`)."""
    inputs = list(fakes) if d_reals is not None else [*fakes, real]
    logits = apply_each(discriminators, inputs, labels)  # (D, inputs, N)
    d_fake = logits[:, : len(fakes)]
    d_real = torch.stack(list(d_reals)) if d_reals is not None else logits[:, len(fakes)]
    g_table = loss.generator(d_fake).T  # (G, D): losses average over the last axis
    d_table = loss.discriminator_from_logits(d_real[:, None], d_fake).T
    return g_table.cpu(), d_table.cpu(), list(d_real.unbind())


def generate(
    generators: Sequence[nn.Module], z: torch.Tensor, labels: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Each generator's samples of the same noise (stacked for perceptrons)."""
    if same_architecture(generators):
        return list(apply_each(generators, [z], labels)[:, 0].unbind())
    return [apply(g, z, labels) for g in generators]
