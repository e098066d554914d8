"""One iteration's draws for one cell, taken up front: batches, losses, rates, opponents, noise.

`Training.run` and a tile's lockstep both execute a plan, so they draw the same numbers from
the cell's own streams in the same order (the numpy stream in exactly the order the steps have
always drawn it). What a plan changes is *when*: every index a step needs is known before the
first step, so a tile sends one table per iteration instead of a few small copies per step, and
the noise of a whole iteration is one draw instead of one per member and batch.

The torch stream: on a CPU, consecutive draws of a multiple of 16 normals equal one draw of them
all (torch fills them in blocks of 16), so a plan draws them at once there and a CPU run keeps its
numbers; other sizes, and the penalty's uniforms between them, are drawn one by one as before.
On a GPU every iteration takes one draw of noise (and one of interpolations under WGAN-GP).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np
import torch
from torch import Tensor

from palomino.coevolution.cell_data import CellData
from palomino.coevolution.mutation import mutate_learning_rates
from palomino.config import TrainingConfig
from palomino.nn import get_loss


@dataclass
class MemberStep:
    """One individual's step in one batch."""

    rate: float  # its learning rate after this step's mutation (before the decay's scale)
    opponent: int  # index into the other role's pool: its selected individuals, then any frozen ones
    noise: int  # row of the plan's noise
    labels: int | None = None  # a conditional generator's row of the plan's label draws
    eps: int | None = None  # a discriminator's row of the plan's penalty interpolations


@dataclass
class StepPlan:
    loss: str
    generators: list[MemberStep]  # empty: the generators sit this batch out (WGAN-GP's n_critic)
    discriminators: list[MemberStep]  # empty: the discriminator skip


@dataclass
class IterationPlan:
    batches: np.ndarray  # (steps, size): indices into the cell's data
    steps: list[StepPlan]
    label_draws: np.ndarray | None  # (draws, size): indices into the data's labels (conditional)
    noise: Tensor  # (draws, size, latent), on the cell's device
    eps: Tensor | None  # (draws, size, 1, …) of the default dtype, or None without a penalty
    losses_used: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.batches.shape[1]


def draw_plan(
    config: TrainingConfig,
    data: CellData,
    rng: np.random.Generator,
    torch_rng: torch.Generator,
    latent: int,
    rates: tuple[list[float], list[float]],
    batches_per_iteration: int,
    pools: tuple[int, int] | None = None,
) -> IterationPlan:
    """The plan of one iteration of `batches_per_iteration` steps for selected sub-populations
    whose rates are `rates` (generators, discriminators). Draws from `rng` exactly as the steps
    used to, step by step. `pools`: how many individuals of each role an opponent is drawn from
    (the members that step first, then frozen ones; none: the members alone)."""
    g_rates, d_rates = list(rates[0]), list(rates[1])
    g_pool, d_pool = pools or (len(g_rates), len(d_rates))
    shared = config.selection.opponents == "per_batch"  # Lipizzaner: one opponent a batch for all
    skip = config.discriminator_skip_each_nth_step
    batches, steps, label_draws, torch_draws = [], [], [], []  # torch_draws: "noise" / "eps", in order
    drawn = {"noise": 0, "eps": 0}
    losses_used: dict[str, int] = {}
    mutation = config.mutation
    size = min(config.batch_size, len(data))

    def take(kind: str) -> int:
        torch_draws.append(kind)
        drawn[kind] += 1
        return drawn[kind] - 1

    def mutate(rates: list[float], member: int) -> float:
        (rate,) = mutate_learning_rates(
            [rates[member]], config.learning_rate, mutation.probability, mutation.alpha, rng
        )
        if mutation.reaches_optimizer:  # else drawn and dropped, as Lipizzaner's rebuilt Adam drops it
            rates[member] = rate
        return rates[member]

    def opponent(pool: int, drawn: int | None) -> int:
        return drawn if drawn is not None else int(rng.integers(pool))

    for step in range(batches_per_iteration):
        batches.append(data.next_indices(config.batch_size))
        loss = config.losses[int(rng.integers(len(config.losses)))]
        losses_used[loss] = losses_used.get(loss, 0) + 1
        g_steps: list[MemberStep] = []
        d_steps: list[MemberStep] = []
        if loss != "wgan_gp" or step % config.n_critic == 0:
            shared_d = int(rng.integers(d_pool)) if shared and g_rates else None
            for member in range(len(g_rates)):
                rate = mutate(g_rates, member)
                move = MemberStep(rate, opponent(d_pool, shared_d), noise=-1)
                if data.labels is not None:
                    move.labels = len(label_draws)
                    label_draws.append(data.label_indices(size))
                move.noise = take("noise")
                g_steps.append(move)
        if skip == 0 or step % (skip + 1) == 0:
            shared_g = int(rng.integers(g_pool)) if shared and d_rates else None
            for member in range(len(d_rates)):
                rate = mutate(d_rates, member)
                move = MemberStep(rate, opponent(g_pool, shared_g), noise=take("noise"))
                if get_loss(loss).gp_weight:
                    move.eps = take("eps")
                d_steps.append(move)
        steps.append(StepPlan(loss, g_steps, d_steps))
    sample_dims = data.samples.dim() - 1
    noise, eps = _draw(torch_draws, (size, latent), (size,) + (1,) * sample_dims, torch_rng)
    return IterationPlan(
        batches=np.stack(batches),
        steps=steps,
        label_draws=np.stack(label_draws) if label_draws else None,
        noise=noise,
        eps=eps,
        losses_used=losses_used,
    )


def _draw(
    order: list[str], noise_shape: tuple[int, ...], eps_shape: tuple[int, ...], generator: torch.Generator
) -> tuple[Tensor, Tensor | None]:
    """The noise (normals) and penalty interpolations (uniforms) that `order` asks for, in that order."""
    device = generator.device
    noise_count, eps_count = order.count("noise"), order.count("eps")
    if device.type != "cpu":  # one draw each: the stream is the plan's own on a GPU
        noise = torch.randn((noise_count, *noise_shape), generator=generator, device=device)
        eps = torch.rand((eps_count, *eps_shape), generator=generator, device=device) if eps_count else None
        return noise, eps
    noises: list[Tensor] = []
    epses: list[Tensor] = []
    start = 0
    while start < len(order):  # runs of one kind, each run as the one-by-one draws would give it
        end = start
        while end < len(order) and order[end] == order[start]:
            end += 1
        run = end - start
        if order[start] == "noise":
            if prod(noise_shape) % 16 == 0:  # blocks of 16 line up: one draw is the run's draws
                noises.append(torch.randn((run, *noise_shape), generator=generator))
            else:
                noises.extend(torch.randn(noise_shape, generator=generator)[None] for _ in range(run))
        else:  # uniforms are drawn one after another, whatever the split
            epses.append(torch.rand((run, *eps_shape), generator=generator))
        start = end
    noise = torch.cat(noises) if noises else torch.empty((0, *noise_shape))
    return noise, (torch.cat(epses) if epses else None)
