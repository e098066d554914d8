"""Plain GANs trained side by side: the referee's baselines (benchmarks/quality.py).

Each GAN is one generator and one discriminator with the grid's networks, loss (its first),
Adam and decay schedule, and none of its coevolution: no neighbours, selection, mutation or
mixture. GAN i trains on `datasets[i]` (all the same data, or each its own region) from
`seeds[i]`, drawing its batches and noise from a stream of its own, so a GAN's result does
not depend on how many others train beside it.

Perceptrons train as one stack (palomino/nn/stacked.py): every step is one batched forward,
backward and Adam update for all of them — the referee's N independent GANs are a tile
without exchange. Other networks (dcgan, sngan) train one after another with the same steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from palomino.coevolution.schedule import decay_factor
from palomino.config import ExperimentConfig
from palomino.data import Dataset
from palomino.nn import GanLoss, build_discriminator, build_generator, get_loss
from palomino.nn.stacked import StackedMLP, stack, stackable, stacked_gradient_penalty, unstack
from palomino.nn.stacked_adam import StackedAdam


@dataclass(frozen=True)
class Budget:
    """Optimiser steps per GAN; discriminator steps are spread evenly between generator steps."""

    generator: int
    discriminator: int

    def discriminator_steps_after(self, step: int) -> int:
        """How many discriminator steps follow generator step `step` (0-based)."""
        done = round(step * self.discriminator / self.generator)
        return round((step + 1) * self.discriminator / self.generator) - done


@dataclass
class PlainGan:
    """One baseline GAN: its networks and where its draws come from."""

    generator: nn.Module
    discriminator: nn.Module
    data: Dataset
    stream: torch.Generator  # its batches' indices and its noise, on the CPU
    learning_rate: float  # before the decay schedule

    @classmethod
    def build(
        cls, config: ExperimentConfig, data: Dataset, seed: int, device: torch.device, learning_rate: float
    ) -> PlainGan:
        if config.network.conditional:
            raise ValueError("the plain baselines are unconditional; set network.conditional: false")
        with torch.random.fork_rng(devices=[]):  # the initial weights from `seed`, the caller's RNG untouched
            torch.manual_seed(seed)
            generator = build_generator(config.network, data.sample_shape, data.kind).to(device)
            discriminator = build_discriminator(config.network, data.sample_shape, data.kind).to(device)
        return cls(generator, discriminator, data, torch.Generator().manual_seed(seed), learning_rate)

    def batch_size(self, config: ExperimentConfig) -> int:
        return min(config.training.batch_size, len(self.data))

    def noise(self, config: ExperimentConfig) -> Tensor:
        return torch.randn(self.batch_size(config), config.network.latent_dim, generator=self.stream)

    def real(self, config: ExperimentConfig) -> Tensor:
        return self.data.samples[torch.randint(len(self.data), (self.batch_size(config),), generator=self.stream)]


def train_independent(
    config: ExperimentConfig,
    datasets: Sequence[Dataset],
    budget: Budget,
    seeds: Sequence[int],
    device: str | torch.device = "cpu",
    stacked: bool | None = None,
    learning_rates: Sequence[float] | None = None,
) -> list[tuple[nn.Module, nn.Module]]:
    """(generator, discriminator) of GAN i, trained on `datasets[i]` from `seeds[i]` for `budget`.

    `stacked`: None stacks perceptrons and trains other networks one by one; False trains every
    GAN one by one (the reference form, for tests and benchmarks). `learning_rates[i]`: GAN i's
    step size (default training.learning_rate for all), so a sweep over rates is one stack too."""
    if len(datasets) != len(seeds):
        raise ValueError(f"{len(datasets)} datasets but {len(seeds)} seeds: one of each per GAN")
    for index, data in enumerate(datasets):
        if not len(data):
            raise ValueError(f"dataset {index} is empty: every GAN needs data to train on")
    rates = [config.training.learning_rate] * len(seeds) if learning_rates is None else list(learning_rates)
    if len(rates) != len(seeds):
        raise ValueError(f"{len(rates)} learning rates for {len(seeds)} GANs: one per GAN")
    device = torch.device(device)
    gans = [PlainGan.build(config, data, seed, device, rate) for data, seed, rate in zip(datasets, seeds, rates)]
    if stacked is None:
        stacked = bool(gans) and stackable(gans[0].generator) and stackable(gans[0].discriminator)
    if stacked:
        by_size: dict[int, list[PlainGan]] = {}
        for gan in gans:  # a region smaller than a batch draws smaller batches: a stack of its own
            by_size.setdefault(gan.batch_size(config), []).append(gan)
        for group in by_size.values():
            _Stack(config, group, device).train(budget)
    else:
        for gan in gans:
            _train_one(config, gan, budget, device)
    return [(gan.generator.eval(), gan.discriminator.eval()) for gan in gans]


def _train_one(config: ExperimentConfig, gan: PlainGan, budget: Budget, device: torch.device) -> None:
    """The reference form: one GAN, torch's Adam, module by module."""
    t = config.training
    loss = get_loss(t.losses[0])
    G, D = gan.generator.train(), gan.discriminator.train()
    opt_g = torch.optim.Adam(G.parameters(), lr=gan.learning_rate, betas=t.adam_betas)
    opt_d = torch.optim.Adam(D.parameters(), lr=gan.learning_rate, betas=t.adam_betas)
    for step in range(budget.generator):
        scale = decay_factor(t.decay, step / budget.generator)  # the grid's schedule over the same share
        for group in [*opt_g.param_groups, *opt_d.param_groups]:
            group["lr"] = gan.learning_rate * scale
        z = gan.noise(config).to(device)
        opt_g.zero_grad(set_to_none=True)
        loss.generator(D(G(z))).backward(inputs=list(G.parameters()))
        opt_g.step()
        for _ in range(budget.discriminator_steps_after(step)):
            real = gan.real(config).to(device)
            with torch.no_grad():
                fake = G(gan.noise(config).to(device))
            opt_d.zero_grad(set_to_none=True)
            loss.discriminator(D, real, fake, generator=gan.stream).backward(inputs=list(D.parameters()))
            opt_d.step()


class _Stack:
    """GANs with one batch size, stepped together: the same draws as `_train_one`, shared arithmetic."""

    def __init__(self, config: ExperimentConfig, gans: list[PlainGan], device: torch.device) -> None:
        self.config, self.gans, self.device = config, gans, device
        self.loss: GanLoss = get_loss(config.training.losses[0])
        self.g_layout = StackedMLP.of(gans[0].generator)
        self.d_layout = StackedMLP.of(gans[0].discriminator)
        self.g = stack([gan.generator for gan in gans], self.g_layout.names)
        self.d = stack([gan.discriminator for gan in gans], self.d_layout.names)
        betas = config.training.adam_betas
        # Adams that never stepped: StackedAdam starts every member's moments at zero.
        self.adam_g = StackedAdam(self.g, [torch.optim.Adam(gan.generator.parameters()) for gan in gans], betas)
        self.adam_d = StackedAdam(self.d, [torch.optim.Adam(gan.discriminator.parameters()) for gan in gans], betas)

    def train(self, budget: Budget) -> None:
        t = self.config.training
        base = torch.tensor([gan.learning_rate for gan in self.gans], dtype=torch.float64)
        for step in range(budget.generator):
            rates = (base * decay_factor(t.decay, step / budget.generator)).to(self.device, non_blocking=True)
            self._generator_step(rates)
            for _ in range(budget.discriminator_steps_after(step)):
                self._discriminator_step(rates)
        unstack(self.g, [gan.generator for gan in self.gans])
        unstack(self.d, [gan.discriminator for gan in self.gans])

    def _draw(self, draw) -> Tensor:
        return torch.stack([draw(gan) for gan in self.gans]).to(self.device, non_blocking=True)

    def _generator_step(self, rates: Tensor) -> None:
        z = self._draw(lambda gan: gan.noise(self.config))
        detached = {k: v.detach() for k, v in self.d.items()}
        values = self.loss.generator(self.d_layout.forward(detached, self.g_layout.forward(self.g, z)))
        grads = torch.autograd.grad(values.sum(), list(self.g.values()))
        self.adam_g.step(dict(zip(self.g, grads)), rates)

    def _discriminator_step(self, rates: Tensor) -> None:
        # Each GAN's draws in _train_one's order: its batch, its noise, then the penalty's interpolation.
        real = self._draw(lambda gan: gan.real(self.config))
        z = self._draw(lambda gan: gan.noise(self.config))
        with torch.no_grad():
            fake = self.g_layout.forward(self.g, z)
        values = self.loss.discriminator_from_logits(
            self.d_layout.forward(self.d, real), self.d_layout.forward(self.d, fake)
        )
        if self.loss.gp_weight:
            shape = (len(real[0]),) + (1,) * (real.dim() - 2)
            eps = self._draw(lambda gan: torch.rand(shape, generator=gan.stream)).to(real)
            values = values + self.loss.gp_weight * stacked_gradient_penalty(self.d_layout, self.d, real, fake, eps)
        grads = torch.autograd.grad(values.sum(), list(self.d.values()))
        self.adam_d.step(dict(zip(self.d, grads)), rates)
