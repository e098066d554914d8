"""Build a cell's generator and discriminator from the `network` section of the config."""

from __future__ import annotations

from typing import Literal, Protocol

from torch import nn

from palomino.errors import ConfigError
from palomino.nn.dcgan import SIZES, DCGANDiscriminator, DCGANGenerator
from palomino.nn.mlp import MLPDiscriminator, MLPGenerator

NETWORK_NAMES = ("mlp", "dcgan", "sngan")
Kind = Literal["points", "image"]


class NetworkSpec(Protocol):
    """What the builders read (config.models.NetworkConfig, or any object with these)."""

    name: str
    latent_dim: int
    hidden: int
    width: int


def build_generator(network: NetworkSpec, sample_shape: tuple[int, ...], kind: Kind) -> nn.Module:
    """Generator mapping z (B, latent_dim) to samples (B, *sample_shape). Init draws from torch's global RNG only."""
    if network.name == "mlp":
        return MLPGenerator(network.latent_dim, network.hidden, sample_shape, tanh=kind == "image")
    channels, size = _conv_image(network, sample_shape, kind)
    return DCGANGenerator(network.latent_dim, network.width, channels, size)


def build_discriminator(network: NetworkSpec, sample_shape: tuple[int, ...], kind: Kind) -> nn.Module:
    """Discriminator mapping samples (B, *sample_shape) to raw logits (B,)."""
    if network.name == "mlp":
        return MLPDiscriminator(network.hidden, sample_shape)
    channels, size = _conv_image(network, sample_shape, kind)
    return DCGANDiscriminator(network.width, channels, size, spectral=network.name == "sngan")


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
