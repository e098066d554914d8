"""One iteration's gradient steps: the selected sub-populations train against each other."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from palomino.coevolution.cell_data import CellData
from palomino.coevolution.individual import Individual
from palomino.coevolution.plan import IterationPlan, draw_plan
from palomino.coevolution.schedule import decay_factor
from palomino.config import TrainingConfig
from palomino.nn import apply, get_loss, host
from palomino.nn.host import upload
from palomino.nn.precision import matmul_precision


@dataclass
class Steps:
    """What the steps did: the losses drawn, and each step's loss (on the device, unsynchronised)."""

    losses_used: Counter[str] = field(default_factory=Counter)
    # Each step's loss in order: a list (one cell) or one tensor (a tile's lane).
    generator: list[torch.Tensor] | torch.Tensor = field(default_factory=list)
    discriminator: list[torch.Tensor] | torch.Tensor = field(default_factory=list)
    means: dict[str, float] | None = None  # each role's mean step loss, once read back (read_means)


def stacked(losses: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """Step losses as one tensor (a lane's are one already)."""
    return losses if isinstance(losses, torch.Tensor) else torch.stack(losses)


def read_means(done: list[Steps]) -> None:
    """Every Steps' mean generator and discriminator loss, read back in one go (a tile's cells
    would otherwise read two numbers each)."""
    parts = [
        stacked(losses).mean() if len(losses) else None
        for steps in done
        for losses in (steps.generator, steps.discriminator)
    ]
    present = [p for p in parts if p is not None]
    values = iter(host.values(torch.stack(present)) if present else [])
    means = [float("nan") if p is None else next(values) for p in parts]
    for index, steps in enumerate(done):
        steps.means = {"generator": means[2 * index], "discriminator": means[2 * index + 1]}


@dataclass
class Training:
    """The cell's training context: its settings, data and random streams."""

    config: TrainingConfig
    data: CellData
    rng: np.random.Generator
    torch_rng: torch.Generator
    latent_dim: int
    precision: str = "float32"  # the steps' matrix products (palomino/nn/precision.py)

    def batches_per_iteration(self) -> int:
        return self.config.batches_per_iteration or max(1, len(self.data) // self.config.batch_size)

    def plan(self, new_g: list[Individual], new_d: list[Individual], frozen: tuple[int, int] = (0, 0)) -> IterationPlan:
        """This iteration's draws, from the cell's streams in the order the steps use them;
        `frozen`: how many opponents of each role stand behind the members without stepping."""
        rates = ([ind.learning_rate for ind in new_g], [ind.learning_rate for ind in new_d])
        pools = (len(new_g) + frozen[0], len(new_d) + frozen[1])
        return draw_plan(
            self.config,
            self.data,
            self.rng,
            self.torch_rng,
            self.latent_dim,
            rates,
            self.batches_per_iteration(),
            pools,
        )

    def run(
        self,
        new_g: list[Individual],
        new_d: list[Individual],
        iteration: int,
        frozen_g: list[Individual] | None = None,
        frozen_d: list[Individual] | None = None,
    ) -> Steps:
        """Each batch: every selected generator steps against a random selected discriminator,
        then every selected discriminator against a random selected generator (Lipizzaner's
        order and opponents: the sub-populations that selection drew from the neighbourhood,
        which adapt to each other, not the neighbours' frozen snapshots).

        Conditional networks: the generator's labels are drawn from the class priors; the
        discriminator sees the real batch with its labels and fakes made with the same labels.
        Every draw comes from the iteration's plan (plan.py), which a tile executes too.
        `frozen_g`, `frozen_d`: opponents that never step (Lipizzaner without selection: the
        neighbours' copies), drawn from after the members."""
        training = self.config
        scale = decay_factor(training.decay, iteration / training.iterations)
        params = {id(ind): list(ind.network.parameters()) for ind in [*new_g, *new_d]}
        frozen_g, frozen_d = frozen_g or [], frozen_d or []
        pool_g, pool_d = [*new_g, *frozen_g], [*new_d, *frozen_d]
        plan = self.plan(new_g, new_d, (len(frozen_g), len(frozen_d)))
        device = self.data.device
        batches = upload(torch.from_numpy(plan.batches), device)  # the iteration's batches in one copy
        label_rows = None if plan.label_draws is None else upload(torch.from_numpy(plan.label_draws), device)
        steps = Steps()
        with matmul_precision(self.precision, device):
            for step, drawn in enumerate(plan.steps):
                real, real_labels = self.data.take(batches[step])
                loss = get_loss(drawn.loss)
                steps.losses_used[drawn.loss] += 1
                for ind, move in zip(new_g, drawn.generators):
                    ind.set_learning_rate(move.rate, scale)
                    opponent = pool_d[move.opponent]
                    labels = None
                    if move.labels is not None and label_rows is not None and self.data.labels is not None:
                        labels = self.data.labels[label_rows[move.labels]]
                    value = loss.generator(
                        apply(opponent.network, apply(ind.network, plan.noise[move.noise], labels), labels)
                    )
                    steps.generator.append(_step(ind, value, params[id(ind)], drawn.loss))
                for ind, move in zip(new_d, drawn.discriminators):
                    ind.set_learning_rate(move.rate, scale)
                    opponent = pool_g[move.opponent]
                    with torch.no_grad():
                        fake = apply(opponent.network, plan.noise[move.noise], real_labels)
                    eps = None if move.eps is None or plan.eps is None else plan.eps[move.eps]
                    value = loss.discriminator(ind.network, real, fake, labels=real_labels, eps=eps)
                    steps.discriminator.append(_step(ind, value, params[id(ind)], drawn.loss))
        return steps


def _step(ind: Individual, value: torch.Tensor, params: list[torch.Tensor], loss_name: str) -> torch.Tensor:
    ind.optimizer.zero_grad(set_to_none=True)
    value.backward(inputs=params)
    ind.optimizer.step()
    ind.loss = loss_name
    return value.detach()
