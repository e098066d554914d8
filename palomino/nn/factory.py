"""Build a cell's generator and discriminator from the `network` section of the config."""

from __future__ import annotations

from typing import Literal, Protocol

from torch import nn

from palomino.errors import ConfigError
from palomino.nn.conditional import (
    ConditionalDCGANDiscriminator,
    ConditionalDCGANGenerator,
    ConditionalMLPDiscriminator,
    ConditionalMLPGenerator,
)
from palomino.nn.dcgan import SIZES, DCGANDiscriminator, DCGANGenerator
from palomino.nn.mlp import Activation, MLPDiscriminator, MLPGenerator

NETWORK_NAMES = ("mlp", "dcgan", "sngan")
Kind = Literal["points", "image"]


class NetworkSpec(Protocol):
    """What the builders read (config.models.NetworkConfig, or any object with these).

    Optional: `conditional` (default False), `label_dim` (default 16), `activation` (default auto)
    and `minibatch_std` (default False).
    """

    name: str
    latent_dim: int
    hidden: int
    width: int


def build_generator(
    network: NetworkSpec, sample_shape: tuple[int, ...], kind: Kind, label_count: int | None = None
) -> nn.Module:
    """Generator mapping z (B, latent_dim) to samples (B, *sample_shape); a conditional one
    (`network.conditional`) maps (z, labels in [0, label_count)). Init draws from torch's global RNG only."""
    labels = _label_args(network, label_count)
    if network.name == "mlp":
        act = mlp_activation(network, kind)
        if labels:
            return ConditionalMLPGenerator(
                network.latent_dim, network.hidden, sample_shape, tanh=kind == "image", activation=act, **labels
            )
        return MLPGenerator(network.latent_dim, network.hidden, sample_shape, tanh=kind == "image", activation=act)
    channels, size = _conv_image(network, sample_shape, kind)
    if labels:
        return ConditionalDCGANGenerator(network.latent_dim, network.width, channels, size, **labels)
    return DCGANGenerator(network.latent_dim, network.width, channels, size)


def build_discriminator(
    network: NetworkSpec, sample_shape: tuple[int, ...], kind: Kind, label_count: int | None = None
) -> nn.Module:
    """Discriminator mapping samples (B, *sample_shape) (and labels, if conditional) to raw logits (B,)."""
    labels = _label_args(network, label_count)
    if network.name == "mlp":
        act = mlp_activation(network, kind)
        spread = getattr(network, "minibatch_std", False)
        if labels:
            return ConditionalMLPDiscriminator(
                network.hidden, sample_shape, activation=act, minibatch_std=spread, **labels
            )
        return MLPDiscriminator(network.hidden, sample_shape, activation=act, minibatch_std=spread)
    channels, size = _conv_image(network, sample_shape, kind)
    spectral = network.name == "sngan"
    if labels:
        return ConditionalDCGANDiscriminator(
            network.width, channels, size, spectral=spectral, label_count=labels["label_count"]
        )
    return DCGANDiscriminator(network.width, channels, size, spectral=spectral)


def mlp_activation(network: NetworkSpec, kind: Kind) -> Activation:
    """`network.activation`, `auto` resolved: Tanh for 2-D points, LeakyReLU(0.2) for images (Lipizzaner's choices)."""
    name = getattr(network, "activation", "auto")
    if name == "auto":
        return "tanh" if kind == "points" else "leaky_relu"
    return name


def _label_args(network: NetworkSpec, label_count: int | None) -> dict[str, int]:
    """{} for an unconditional network; the embedding's arguments for a conditional one."""
    if not getattr(network, "conditional", False):
        return {}
    if not label_count or label_count < 1:
        raise ConfigError("network.conditional needs labelled data (how many labels the dataset has)")
    return {"label_count": label_count, "label_dim": getattr(network, "label_dim", 16)}


def _conv_image(network: NetworkSpec, sample_shape: tuple[int, ...], kind: Kind) -> tuple[int, int]:
    """Check that a convolutional network fits the data; return (channels, side)."""
    if network.name not in NETWORK_NAMES:
        raise ConfigError(f"unknown network.name {network.name!r}; choose one of {', '.join(NETWORK_NAMES)}")
    if kind != "image" or len(sample_shape) != 3:
        raise ConfigError(f"network.name={network.name} needs images; use network.name=mlp for 2-D points")
    channels, height, width = sample_shape
    if height != width or height not in SIZES:
        sizes = ", ".join(f"{s}×{s}" for s in SIZES)
        raise ConfigError(
            f"network.name={network.name} supports {sizes} images, not {height}×{width}; "
            "use network.name=mlp, or resize an image_folder dataset with data.image_size"
        )
    return channels, height
