"""Lipizzaner's four-layer perceptron, for 2-D toys and flattened images."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

Activation = Literal["leaky_relu", "tanh", "relu"]


def hidden_activation(name: Activation) -> nn.Module:
    """The hidden layers' non-linearity. Lipizzaner's ring networks use Tanh and its MNIST
    perceptron LeakyReLU(0.2); on the 2-D toys LeakyReLU lets one lineage collapse onto a
    few modes (benchmarks/quality.py), so `network.activation: auto` picks by data kind."""
    if name == "tanh":
        return nn.Tanh()
    if name == "relu":
        return nn.ReLU()
    if name == "leaky_relu":
        return nn.LeakyReLU(0.2)
    raise ValueError(f"unknown activation {name!r}: use leaky_relu, tanh or relu")


def batch_spread(h: Tensor, dim: int) -> Tensor:
    """Minibatch std's statistic: the features' standard deviation over the batch axis `dim`
    (biased), averaged over the features (the last axis). Two passes (mean, then the squared
    deviations) instead of `Tensor.std`, which took 8–20× longer over a batch axis that is not
    the last on this project's CPU, and more than a third of a grid-4x4 iteration."""
    centred = h - h.mean(dim, keepdim=True)
    return centred.square().mean(dim).sqrt().mean(-1)


class MLPGenerator(nn.Module):
    """latent → hidden → hidden → prod(sample_shape), reshaped to (B, *sample_shape).

    Tanh output for images (data in [-1, 1]); toys take a linear output (points are not bounded).
    """

    def __init__(
        self,
        latent_dim: int,
        hidden: int,
        sample_shape: tuple[int, ...],
        *,
        tanh: bool,
        activation: Activation = "leaky_relu",
    ):
        super().__init__()
        self.latent_dim = latent_dim
        self.sample_shape = tuple(sample_shape)
        self.net = nn.Sequential(
            nn.Linear(latent_dim, hidden),
            hidden_activation(activation),
            nn.Linear(hidden, hidden),
            hidden_activation(activation),
            nn.Linear(hidden, math.prod(sample_shape)),
            nn.Tanh() if tanh else nn.Identity(),
        )

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z).view(z.shape[0], *self.sample_shape)


class MLPDiscriminator(nn.Module):
    """prod(sample_shape) → hidden → hidden → 1 logit (Lipizzaner's Sigmoid lives in the losses).

    `minibatch_std`: the second layer also sees how much the batch's first-layer features vary
    (Karras et al. 2018, ProGAN). A generator that has dropped one of its modes makes batches
    that vary less than real ones, which a per-sample critic cannot see.
    """

    def __init__(
        self,
        hidden: int,
        sample_shape: tuple[int, ...],
        *,
        activation: Activation = "leaky_relu",
        minibatch_std: bool = False,
    ):
        super().__init__()
        self.sample_shape = tuple(sample_shape)
        self.minibatch_std = minibatch_std
        self.net = nn.Sequential(  # one Sequential, so checkpoints keep their keys either way
            nn.Linear(math.prod(sample_shape), hidden),
            hidden_activation(activation),
            nn.Linear(hidden + int(minibatch_std), hidden),
            hidden_activation(activation),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        if not self.minibatch_std:
            return self.net(x.flatten(1)).squeeze(1)
        h = self.net[:2](x.flatten(1))
        spread = batch_spread(h, 0) if len(h) > 1 else h.new_zeros(())
        return self.net[2:](torch.cat([h, spread.expand(len(h), 1)], 1)).squeeze(1)
