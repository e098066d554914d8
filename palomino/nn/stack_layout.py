"""Which stacked form trains a network in a tile: the perceptrons' (stacked.py) or the DCGANs' (stacked_conv.py)."""

from __future__ import annotations

from torch import nn

from palomino.nn.stacked import StackedMLP, stackable
from palomino.nn.stacked_conv import STACKABLE_CONV, StackedConv

StackLayout = StackedMLP | StackedConv


def tileable(module: nn.Module) -> bool:
    """Whether a tile can train this network stacked: every network Palomino builds can."""
    return stackable(module) or isinstance(module, STACKABLE_CONV)


def layout_of(template: nn.Module) -> StackLayout:
    """The stacked form of the template's architecture."""
    if stackable(template):
        return StackedMLP.of(template)
    if isinstance(template, STACKABLE_CONV):
        return StackedConv.of(template)
    raise TypeError(f"{type(template).__name__} has no stacked form; train it with tiles: off")
