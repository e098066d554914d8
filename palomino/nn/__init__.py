"""Generators, discriminators and GAN losses (torch). See factory.py and losses.py."""

from palomino.nn.conditional import apply, is_conditional
from palomino.nn.factory import NETWORK_NAMES, NetworkSpec, build_discriminator, build_generator
from palomino.nn.losses import LOSS_NAMES, GanLoss, get_loss, gradient_penalty

__all__ = [
    "LOSS_NAMES",
    "NETWORK_NAMES",
    "GanLoss",
    "NetworkSpec",
    "apply",
    "build_discriminator",
    "build_generator",
    "get_loss",
    "gradient_penalty",
    "is_conditional",
]
