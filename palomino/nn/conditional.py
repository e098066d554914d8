"""Conditional generators and discriminators (Mirza & Osindero's CGAN; DC-CGAN for images).

A learned label embedding is joined to z (generators) and to the input (discriminators):
the MLP discriminator takes it beside the flattened sample, the DCGAN discriminator as an
extra input channel (the embedding reshaped to one H×W map). Each wraps the unconditional
network of the same family, so both share one definition of the layers.

Conditional networks take `(x, labels)`; `apply` calls any network the right way.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from palomino.nn.dcgan import DCGANDiscriminator, DCGANGenerator
from palomino.nn.mlp import Activation, MLPDiscriminator, MLPGenerator


def is_conditional(network: nn.Module) -> bool:
    return bool(getattr(network, "conditional", False))


def apply(network: nn.Module, x: Tensor, labels: Tensor | None = None) -> Tensor:
    """`network(x)`, or `network(x, labels)` for a conditional network (which needs them)."""
    if is_conditional(network):
        if labels is None:
            raise ValueError("a conditional network needs the labels of its inputs")
        return network(x, labels)
    return network(x)


class ConditionalMLPGenerator(nn.Module):
    """(z ⊕ embed(y)) → Lipizzaner's perceptron → (B, *sample_shape)."""

    conditional = True

    def __init__(
        self,
        latent_dim: int,
        hidden: int,
        sample_shape: tuple[int, ...],
        *,
        tanh: bool,
        label_count: int,
        label_dim: int,
        activation: Activation = "leaky_relu",
    ):
        super().__init__()
        self.latent_dim, self.label_count = latent_dim, label_count
        self.sample_shape = tuple(sample_shape)
        self.embed = nn.Embedding(label_count, label_dim)
        self.body = MLPGenerator(latent_dim + label_dim, hidden, sample_shape, tanh=tanh, activation=activation)

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        return self.body(torch.cat([z, self.embed(labels)], dim=1))


class ConditionalMLPDiscriminator(nn.Module):
    """(flatten(x) ⊕ embed(y)) → perceptron → (B,) logits."""

    conditional = True

    def __init__(
        self,
        hidden: int,
        sample_shape: tuple[int, ...],
        *,
        label_count: int,
        label_dim: int,
        activation: Activation = "leaky_relu",
        minibatch_std: bool = False,
    ):
        super().__init__()
        self.sample_shape, self.label_count = tuple(sample_shape), label_count
        self.embed = nn.Embedding(label_count, label_dim)
        self.body = MLPDiscriminator(
            hidden, (math.prod(sample_shape) + label_dim,), activation=activation, minibatch_std=minibatch_std
        )

    def forward(self, x: Tensor, labels: Tensor) -> Tensor:
        return self.body(torch.cat([x.flatten(1), self.embed(labels)], dim=1))


class ConditionalDCGANGenerator(nn.Module):
    """(z ⊕ embed(y)) → the DCGAN generator."""

    conditional = True

    def __init__(self, latent_dim: int, width: int, channels: int, size: int, *, label_count: int, label_dim: int):
        super().__init__()
        self.latent_dim, self.label_count = latent_dim, label_count
        self.sample_shape = (channels, size, size)
        self.embed = nn.Embedding(label_count, label_dim)
        self.body = DCGANGenerator(latent_dim + label_dim, width, channels, size)

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        return self.body(torch.cat([z, self.embed(labels)], dim=1))


class ConditionalDCGANDiscriminator(nn.Module):
    """[x, embed(y) as one H×W channel] → the DCGAN (or SNGAN) discriminator."""

    conditional = True

    def __init__(self, width: int, channels: int, size: int, *, spectral: bool, label_count: int):
        super().__init__()
        self.side, self.label_count = size, label_count
        self.embed = nn.Embedding(label_count, size * size)
        self.body = DCGANDiscriminator(width, channels + 1, size, spectral=spectral)

    def forward(self, x: Tensor, labels: Tensor) -> Tensor:
        plane = self.embed(labels).view(x.shape[0], 1, self.side, self.side)
        return self.body(torch.cat([x, plane], dim=1))
