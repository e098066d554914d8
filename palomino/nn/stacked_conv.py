"""DCGAN and SNGAN networks stacked on a member axis: every layer one grouped kernel for a tile.

M members' convolutions are one convolution with `groups=M`: their feature maps lie side by
side on the channel axis, (B, M·C, H, W), and each group sees only its member's channels. A
BatchNorm over those M·C channels normalises each member's channels over its own batch, as
each member's BatchNorm does. The projection (generator) and the head (discriminator) are
`baddbmm`s, as in the perceptrons' stack (stacked.py).

Unlike a perceptron, these networks change state when they run in training mode: BatchNorm's
running statistics (which the mixture samples with) and spectral normalisation's power
iteration (its u and v). A cell updates them on every forward, its opponents' too; a stack
updates them per member in the same order (stacked_buffers.py): a discriminator that two of a
cell's generators face in one batch takes two power iterations, the second generator seeing
the weights after both, as one by one. So the stacked run is the one-by-one run, buffers
included (tests/test_tiles.py, float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from palomino.nn.conditional import ConditionalDCGANDiscriminator, ConditionalDCGANGenerator
from palomino.nn.dcgan import DCGANDiscriminator, DCGANGenerator
from palomino.nn.stacked import Params, linear
from palomino.nn.stacked_buffers import BufferTurns, BufferUse

Use = BufferUse | BufferTurns  # the buffers' bookkeeping, eager or compiled (stacked_buffers.py)
STACKABLE_CONV = (DCGANGenerator, DCGANDiscriminator, ConditionalDCGANGenerator, ConditionalDCGANDiscriminator)


@dataclass(frozen=True)
class _Conv:
    prefix: str
    transposed: bool
    stride: tuple[int, int]
    padding: tuple[int, int]
    bias: bool
    spectral: _Spectral | None


@dataclass(frozen=True)
class _Norm:
    prefix: str
    momentum: float
    eps: float


@dataclass(frozen=True)
class _Spectral:
    """Spectral normalisation of one weight: its names and torch's power-iteration settings."""

    original: str
    u: str
    v: str
    iterations: int
    eps: float

    @classmethod
    def of(cls, module: nn.Module, prefix: str) -> _Spectral | None:
        if not parametrize.is_parametrized(module, "weight"):
            return None
        norm = module.parametrizations.weight[0]
        if norm.dim != 0:
            raise TypeError(f"{prefix}: a stack normalises weights along their first axis only (spectral_norm's dim=0)")
        base = f"{prefix}parametrizations.weight."
        return cls(base + "original", base + "0._u", base + "0._v", norm.n_power_iterations, norm.eps)

    def weight(self, params: Params, use: Use | None) -> Tensor:
        """Each slot's weight ÷ its spectral norm, after the power iterations its forwards take."""
        weight = params[self.original]
        if use is None:
            raise ValueError("a spectrally normalised stack needs its members' u and v (a BufferUse)")
        with torch.no_grad():  # (slots, out, in·k·k), as torch reshapes dim 0
            u, v = use.iterate(self.u, self.v, weight.detach().flatten(2), self.iterations, self.eps)
        sigma = (u * torch.bmm(weight.flatten(2), v.unsqueeze(2)).squeeze(2)).sum(1)
        return weight / sigma.view(-1, *([1] * (weight.dim() - 1)))


Layer = _Conv | _Norm | nn.Module  # nn.Module: a stateless activation (ReLU, LeakyReLU, Tanh)


@dataclass(frozen=True)
class StackedConv:
    """How to run a stack of one DCGAN/SNGAN architecture: the template's layers, no weights."""

    generator: bool
    conditional: bool
    sample_shape: tuple[int, ...]
    first_shape: tuple[int, ...]  # the generator's projected map (C, s, s); () for a discriminator
    side: int  # a conditional discriminator's label plane (side × side); 0 otherwise
    layers: tuple[Layer, ...]
    end: str  # the generator's projection or the discriminator's head (a linear layer)
    end_spectral: _Spectral | None
    names: tuple[str, ...]
    buffer_names: tuple[str, ...]

    @classmethod
    def of(cls, template: nn.Module) -> StackedConv:
        if not isinstance(template, STACKABLE_CONV):
            raise TypeError(f"{type(template).__name__} is no DCGAN or SNGAN network")
        conditional = isinstance(template, (ConditionalDCGANGenerator, ConditionalDCGANDiscriminator))
        body = template.body if conditional else template
        p = "body." if conditional else ""
        generator = isinstance(body, DCGANGenerator)
        end = body.project if generator else body.head
        return cls(
            generator=generator,
            conditional=conditional,
            sample_shape=tuple(template.sample_shape) if generator else (),
            first_shape=tuple(body.first_shape) if generator else (),
            side=template.side if conditional and not generator else 0,
            layers=tuple(_layer(module, f"{p}net.{i}.") for i, module in enumerate(body.net)),
            end=p + ("project." if generator else "head."),
            end_spectral=_Spectral.of(end, p + ("project." if generator else "head.")),
            names=tuple(name for name, _ in template.named_parameters()),
            buffer_names=tuple(name for name, _ in template.named_buffers()),
        )

    def forward(self, params: Params, x: Tensor, labels: Tensor | None = None, use: Use | None = None) -> Tensor:
        """Generators: z (M, B, latent) → images (M, B, C, H, W); discriminators: images → logits (M, B).
        `use` names the members whose running statistics and power iterations these slots advance."""
        if self.conditional and labels is None:
            raise ValueError("a conditional stack needs the labels of its inputs")
        if self.generator:
            return self._generate(params, x, labels, use)
        return self._discriminate(params, x, labels, use)

    def _generate(self, params: Params, z: Tensor, labels: Tensor | None, use: Use | None) -> Tensor:
        if self.conditional:
            z = torch.cat([z, _embedded(params["embed.weight"], labels)], dim=2)
        h = linear(z, params[self.end + "weight"], params[self.end + "bias"])
        slots, batch = h.shape[:2]
        h = _side_by_side(h.view(slots, batch, *self.first_shape))
        h = self._body(params, h, use)
        return h.view(batch, slots, *self.sample_shape).transpose(0, 1)

    def _discriminate(self, params: Params, x: Tensor, labels: Tensor | None, use: Use | None) -> Tensor:
        slots, batch = x.shape[:2]
        if self.conditional:
            plane = _embedded(params["embed.weight"], labels).view(slots, batch, 1, self.side, self.side)
            x = torch.cat([x, plane], dim=2)
        h = self._body(params, _side_by_side(x), use)
        h = h.view(batch, slots, -1).transpose(0, 1)  # each member's maps flattened as `flatten(1)` does
        weight = self._weight(params, self.end, self.end_spectral, use)
        return linear(h, weight, params[self.end + "bias"]).squeeze(-1)

    def _body(self, params: Params, h: Tensor, use: Use | None) -> Tensor:
        for layer in self.layers:
            if isinstance(layer, _Conv):
                h = self._conv(params, layer, h, use)
            elif isinstance(layer, _Norm):
                h = _batch_norm(params, layer, h, use)
            else:
                h = layer(h)
        return h

    def _conv(self, params: Params, layer: _Conv, h: Tensor, use: Use | None) -> Tensor:
        weight = self._weight(params, layer.prefix, layer.spectral, use)
        slots = weight.shape[0]
        bias = params[layer.prefix + "bias"].reshape(-1) if layer.bias else None
        kernel = weight.reshape(-1, *weight.shape[2:])
        if layer.transposed:  # (in, out, k, k) per member: groups split the input channels
            return F.conv_transpose2d(h, kernel, bias, layer.stride, layer.padding, groups=slots)
        return F.conv2d(h, kernel, bias, layer.stride, layer.padding, groups=slots)

    @staticmethod
    def _weight(params: Params, prefix: str, spectral: _Spectral | None, use: Use | None) -> Tensor:
        return params[prefix + "weight"] if spectral is None else spectral.weight(params, use)


def _layer(module: nn.Module, prefix: str) -> Layer:
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        if module.dilation != (1, 1) or module.groups != 1 or getattr(module, "output_padding", (0, 0)) != (0, 0):
            raise TypeError(f"{prefix}: a stack takes plain convolutions (no dilation, groups or output padding)")
        return _Conv(
            prefix,
            isinstance(module, nn.ConvTranspose2d),
            module.stride,
            module.padding,
            module.bias is not None,
            _Spectral.of(module, prefix),
        )
    if isinstance(module, nn.BatchNorm2d):
        if not module.track_running_stats or module.momentum is None:
            raise TypeError(f"{prefix}: a stack takes BatchNorm with running statistics and a momentum")
        return _Norm(prefix, module.momentum, module.eps)
    if isinstance(module, (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Identity)):
        return module
    raise TypeError(f"{prefix}: {type(module).__name__} has no stacked form")


def _side_by_side(x: Tensor) -> Tensor:
    """(M, B, C, H, W) → (B, M·C, H, W): each member's channels a group of its own."""
    slots, batch, channels = x.shape[:3]
    return x.transpose(0, 1).reshape(batch, slots * channels, *x.shape[3:])


def _embedded(table: Tensor, labels: Tensor | None) -> Tensor:
    """Each member's own embedding of its labels: table (M, count, dim), labels (M, B) → (M, B, dim)."""
    assert labels is not None
    return table[torch.arange(len(table), device=table.device)[:, None], labels]


def _batch_norm(params: Params, layer: _Norm, h: Tensor, use: Use | None) -> Tensor:
    """Training-mode BatchNorm of every member's channels; each slot's batch statistics then move
    its member's running statistics, as `nn.BatchNorm2d` moves them in training mode."""
    weight, bias = params[layer.prefix + "weight"], params[layer.prefix + "bias"]
    out = F.batch_norm(h, None, None, weight.reshape(-1), bias.reshape(-1), True, 0.0, layer.eps)
    if use is not None:
        with torch.no_grad():
            slots = weight.shape[0]
            mean = h.mean((0, 2, 3)).view(slots, -1)
            var = h.var((0, 2, 3), unbiased=True).view(slots, -1)
            use.track(layer.prefix, mean, var, layer.momentum)
    return out
