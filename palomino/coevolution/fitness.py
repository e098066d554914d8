"""All-vs-all neighbourhood fitness: every generator against every discriminator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from palomino.nn import GanLoss, apply
from palomino.nn.host import to_host
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
def fitness_tables(
    fakes: Sequence[torch.Tensor],
    discriminators: Sequence[nn.Module],
    real: torch.Tensor,
    loss: GanLoss,
    labels: torch.Tensor | None = None,
    *,
    generators: int | None = None,
    critics: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(generator losses, discriminator losses): the first `generators` fakes (all by default)
    against every discriminator, (g, D), and every fake against the first `critics`
    discriminators (all by default), (G, c); on the CPU.

    A cell whose neighbours never enter its selection needs only its own individuals' fitness:
    with perceptrons, only those rows and columns are evaluated (a third of the table at five
    neighbours and population 1). `labels`: conditional networks' labels, shared by `real` and
    every fake (generated with them). Tables are built on the device and moved once: no
    synchronisation per pair. Perceptrons are evaluated stacked (a few calls for the whole
    table, nn/stacked.py).
    """
    g = len(fakes) if generators is None else generators
    c = len(discriminators) if critics is None else critics
    if same_architecture(discriminators):
        return _stacked_tables(fakes, discriminators, real, loss, labels, g, c)
    # One module at a time, every pair, in the order they always ran: a DCGAN's BatchNorm
    # statistics and spectral norm move with every forward in training mode.
    d_reals = [apply(d, real, labels) for d in discriminators] if c else []
    g_rows, d_rows = [], []
    for fake in fakes:
        d_fakes = [apply(d, fake, labels) for d in discriminators]
        g_rows.append(torch.stack([loss.generator(f) for f in d_fakes]))
        if c:
            d_rows.append(torch.stack([loss.discriminator_from_logits(r, f) for r, f in zip(d_reals, d_fakes)]))
    g_table = to_host(torch.stack(g_rows)[:g])
    d_table = to_host(torch.stack(d_rows)[:, :c]) if c else torch.empty(len(fakes), 0)
    return g_table, d_table


def _stacked_tables(
    fakes: Sequence[torch.Tensor],
    discriminators: Sequence[nn.Module],
    real: torch.Tensor,
    loss: GanLoss,
    labels: torch.Tensor | None,
    g: int,
    c: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fitness_tables' result from stacked evaluations: the whole table in one, parts in two."""
    count = len(fakes)
    if g == count and c == len(discriminators):
        logits = apply_each(discriminators, [*fakes, real], labels)  # (D, G + 1, N)
        d_fake, d_real = logits[:, :count], logits[:, count]
        g_table = loss.generator(d_fake).T  # (G, D): losses average over the last axis
        both = torch.stack([g_table, loss.discriminator_from_logits(d_real[:, None], d_fake).T])
        g_host, d_host = to_host(both).unbind()  # one read for both tables
        return g_host, d_host
    g_table = torch.empty(0, len(discriminators))
    if g:
        g_table = to_host(loss.generator(apply_each(discriminators, fakes[:g], labels)).T)
    d_table = torch.empty(count, 0)
    if c:
        logits = apply_each(discriminators[:c], [*fakes, real], labels)  # (c, G + 1, N)
        d_table = to_host(loss.discriminator_from_logits(logits[:, count, None], logits[:, :count]).T)
    return g_table, d_table


def generate(
    generators: Sequence[nn.Module], z: torch.Tensor, labels: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Each generator's samples of the same noise (stacked for perceptrons)."""
    if same_architecture(generators):
        return list(apply_each(generators, [z], labels)[:, 0].unbind())
    return [apply(g, z, labels) for g in generators]
