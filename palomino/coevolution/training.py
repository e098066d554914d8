"""One iteration's gradient steps: the selected sub-populations train against each other."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from palomino.coevolution.cell_data import CellData
from palomino.coevolution.individual import Individual
from palomino.coevolution.mutation import mutate_learning_rates
from palomino.coevolution.schedule import decay_factor
from palomino.config import TrainingConfig
from palomino.nn import apply, get_loss
from palomino.nn.losses import GanLoss


@dataclass
class Steps:
    """What the steps did: the losses drawn, and each step's loss (on the device, unsynchronised)."""

    losses_used: Counter[str] = field(default_factory=Counter)
    generator: list[torch.Tensor] = field(default_factory=list)
    discriminator: list[torch.Tensor] = field(default_factory=list)


@dataclass
class Training:
    """The cell's training context: its settings, data, random streams and noise."""

    config: TrainingConfig
    data: CellData
    rng: np.random.Generator
    torch_rng: torch.Generator
    noise: Callable[[int], torch.Tensor]

    def batches_per_iteration(self) -> int:
        return self.config.batches_per_iteration or max(1, len(self.data) // self.config.batch_size)

    def run(self, new_g: list[Individual], new_d: list[Individual], iteration: int) -> Steps:
        """Each batch: every selected generator steps against a random selected discriminator,
        then every selected discriminator against a random selected generator (Lipizzaner's
        order and opponents: the sub-populations that selection drew from the neighbourhood,
        which adapt to each other, not the neighbours' frozen snapshots).

        Conditional networks: the generator's labels are drawn from the class priors; the
        discriminator sees the real batch with its labels and fakes made with the same labels."""
        training = self.config
        scale = decay_factor(training.decay, iteration / training.iterations)
        params = {id(ind): list(ind.network.parameters()) for ind in [*new_g, *new_d]}
        losses = {name: get_loss(name) for name in training.losses}
        steps = Steps()
        skip = training.discriminator_skip_each_nth_step
        for step in range(self.batches_per_iteration()):
            real, real_labels = self.data.next_batch(training.batch_size)
            loss_name = training.losses[int(self.rng.integers(len(training.losses)))]
            steps.losses_used[loss_name] += 1
            # WGAN-GP: the critic takes n_critic steps per generator step.
            if loss_name != "wgan_gp" or step % training.n_critic == 0:
                for ind in new_g:
                    self._mutate(ind, scale)
                    opponent = new_d[int(self.rng.integers(len(new_d)))]
                    value = self._generator_loss(ind, opponent, losses[loss_name], real.shape[0], real_labels)
                    steps.generator.append(_step(ind, value, params[id(ind)], loss_name))
            if skip == 0 or step % (skip + 1) == 0:
                for ind in new_d:
                    self._mutate(ind, scale)
                    opponent = new_g[int(self.rng.integers(len(new_g)))]
                    with torch.no_grad():
                        fake = apply(opponent.network, self.noise(real.shape[0]), real_labels)
                    value = losses[loss_name].discriminator(
                        ind.network, real, fake, generator=self.torch_rng, labels=real_labels
                    )
                    steps.discriminator.append(_step(ind, value, params[id(ind)], loss_name))
        return steps

    def _mutate(self, ind: Individual, scale: float) -> None:
        """Mutate the learning rate before each step, as Lipizzaner does; the step takes it × `scale`."""
        mutation = self.config.mutation
        (rate,) = mutate_learning_rates(
            [ind.learning_rate], self.config.learning_rate, mutation.probability, mutation.alpha, self.rng
        )
        ind.set_learning_rate(rate, scale)

    def _generator_loss(
        self, ind: Individual, opponent: Individual, loss: GanLoss, n: int, real_labels: torch.Tensor | None
    ) -> torch.Tensor:
        if real_labels is None:
            return loss.generator(opponent.network(ind.network(self.noise(n))))
        labels = self.data.sampled_labels(n)
        return loss.generator(opponent.network(ind.network(self.noise(n), labels), labels))


def _step(ind: Individual, value: torch.Tensor, params: list[torch.Tensor], loss_name: str) -> torch.Tensor:
    ind.optimizer.zero_grad(set_to_none=True)
    value.backward(inputs=params)
    ind.optimizer.step()
    ind.loss = loss_name
    return value.detach()
