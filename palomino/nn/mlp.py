"""Lipizzaner's four-layer perceptron, for 2-D toys and flattened images."""

from __future__ import annotations

import math

from torch import Tensor, nn


class MLPGenerator(nn.Module):
    """latent → hidden → hidden → prod(sample_shape), reshaped to (B, *sample_shape).

    Lipizzaner's FourLayerPerceptronFactory: LeakyReLU(0.2) hidden activations, Tanh output
    for images (data in [-1, 1]); toys take a linear output (points are not bounded).
    """

    def __init__(self, latent_dim: int, hidden: int, sample_shape: tuple[int, ...], *, tanh: bool):
        super().__init__()
        self.latent_dim = latent_dim
        self.sample_shape = tuple(sample_shape)
        self.net = nn.Sequential(
            nn.Linear(latent_dim, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, math.prod(sample_shape)),
            nn.Tanh() if tanh else nn.Identity(),
        )

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z).view(z.shape[0], *self.sample_shape)


class MLPDiscriminator(nn.Module):
    """prod(sample_shape) → hidden → hidden → 1 logit (Lipizzaner's Sigmoid lives in the losses)."""

    def __init__(self, hidden: int, sample_shape: tuple[int, ...]):
        super().__init__()
        self.sample_shape = tuple(sample_shape)
        self.net = nn.Sequential(
            nn.Linear(math.prod(sample_shape), hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.flatten(1)).squeeze(1)
