"""Perceptrons stacked on a leading member axis: one batched kernel per layer for a whole tile.

A tile (palomino/coevolution/tile.py) trains many cells' networks at once. Their weights are
stacked: `Linear(in, out)`'s weight (out, in) becomes (M, out, in) for M members, and a layer
is one `baddbmm` over all of them instead of M small matmuls (each launch-bound on a GPU and
Python-bound on a CPU). Inputs carry the member axis too: (M, B, …) in, (M, B, …) out.

The stacked forms compute exactly what each member's module computes (checked in float64 by
tests/test_tiles.py), so a tile cuts its weights back into ordinary modules at its edges and
snapshots, checkpoints and the wire never see a stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from palomino.nn.conditional import ConditionalMLPDiscriminator, ConditionalMLPGenerator
from palomino.nn.mlp import MLPDiscriminator, MLPGenerator, batch_spread

STACKABLE = (MLPGenerator, MLPDiscriminator, ConditionalMLPGenerator, ConditionalMLPDiscriminator)
Params = dict[str, Tensor]


def stackable(module: nn.Module) -> bool:
    """Whether a tile can train this network in its stacked form (the perceptrons, for now)."""
    return isinstance(module, STACKABLE)


@dataclass(frozen=True)
class StackedMLP:
    """How to run a stack of one perceptron architecture: the template's layers, no weights.

    `prefix` is where the perceptron's own parameters live ("body." in a conditional wrapper).
    """

    generator: bool
    sample_shape: tuple[int, ...]
    activation: nn.Module  # stateless (Tanh, ReLU, LeakyReLU(0.2)): applies to any shape
    output: nn.Module  # the generator's Tanh or Identity
    minibatch_std: bool
    conditional: bool
    names: tuple[str, ...]  # parameter names, in `named_parameters()` order (Adam's order too)

    @classmethod
    def of(cls, template: nn.Module) -> StackedMLP:
        if not stackable(template):
            raise TypeError(f"{type(template).__name__} has no stacked form; a tile stacks {_names()}")
        conditional = isinstance(template, (ConditionalMLPGenerator, ConditionalMLPDiscriminator))
        body = template.body if conditional else template
        generator = isinstance(body, MLPGenerator)
        return cls(
            generator=generator,
            sample_shape=tuple(template.sample_shape),
            activation=body.net[1],
            output=body.net[5] if generator else nn.Identity(),
            minibatch_std=False if generator else body.minibatch_std,
            conditional=conditional,
            names=tuple(name for name, _ in template.named_parameters()),
        )

    buffer_names: tuple[str, ...] = ()  # a perceptron keeps no state beside its weights

    def forward(self, params: Params, x: Tensor, labels: Tensor | None = None, use: object = None) -> Tensor:
        """Generators: z (M, B, latent) → samples (M, B, *sample_shape); discriminators:
        samples (M, B, *sample_shape) → logits (M, B). `labels` (M, B) for conditional stacks.
        `use` is the convolutional stacks' buffer bookkeeping (stacked_conv.py); perceptrons have none."""
        p = "body.net." if self.conditional else "net."
        h = x if self.generator else x.flatten(2)
        if self.conditional:
            if labels is None:
                raise ValueError("a conditional stack needs the labels of its inputs")
            table = params["embed.weight"]  # (M, label_count, label_dim): each member's own embedding
            h = torch.cat([h, table[torch.arange(len(table), device=table.device)[:, None], labels]], dim=2)
        h = self._hidden(h, params[p + "0.weight"], params[p + "0.bias"])
        if self.minibatch_std:
            spread = batch_spread(h, 1) if h.shape[1] > 1 else h.new_zeros(h.shape[0])
            h = torch.cat([h, spread[:, None, None].expand(-1, h.shape[1], 1)], dim=2)
        h = self._hidden(h, params[p + "2.weight"], params[p + "2.bias"])
        h = linear(h, params[p + "4.weight"], params[p + "4.bias"])
        if not self.generator:
            return h.squeeze(-1)
        return self.output(h).view(h.shape[0], h.shape[1], *self.sample_shape)

    def _hidden(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """activation(linear(x)). Tanh on a CPU as 2·σ(2u) − 1 (the 2u from the matrix product's own
        scaling): torch's CPU tanh costs ~4× its sigmoid (2.1 against 0.45 ns an element on this
        project's machine), and the toys' Tanh perceptrons spent a quarter of an iteration in it.
        The two differ by float rounding (≤ 2e-7 in float32, 3e-16 in float64)."""
        if not (isinstance(self.activation, nn.Tanh) and x.device.type == "cpu"):
            return self.activation(linear(x, weight, bias))
        doubled = torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2), beta=2, alpha=2)
        if doubled.requires_grad:  # sigmoid keeps its output for the backward pass: no in-place after it
            return torch.sigmoid(doubled).mul(2).sub_(1)
        return doubled.sigmoid_().mul_(2).sub_(1)


def stacked_gradient_penalty(
    layout: Any, params: Params, real: Tensor, fake: Tensor, eps: Tensor, labels: Tensor | None = None, use: Any = None
) -> Tensor:
    """WGAN-GP's E[(‖∇D(x̂)‖₂ − 1)²] for each member (M,), as nn.losses.gradient_penalty computes it
    for one: x̂ = eps·real + (1 − eps)·fake, with each member's own `eps` (M, B, 1, …). `layout` is a
    StackedMLP or a StackedConv (with its `use`)."""
    x_hat = (eps * real.detach() + (1 - eps) * fake.detach()).requires_grad_(True)
    (grad,) = torch.autograd.grad(layout.forward(params, x_hat, labels, use).sum(), x_hat, create_graph=True)
    return penalty_of(grad)


def penalty_of(input_gradient: Tensor) -> Tensor:
    """WGAN-GP's E[(‖∇D(x̂)‖₂ − 1)²] for each member (M,) from its critic's input gradients (M, B, …)."""
    return (input_gradient.flatten(2).norm(2, dim=2) - 1).square().mean(-1)


def linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """x (M, B, in) · weightᵀ (M, in, out) + bias (M, out): one kernel for every member."""
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


def stack(modules: Sequence[nn.Module], names: Sequence[str]) -> Params:
    """The members' parameters stacked (copies), as leaves that collect gradients: one op a
    parameter name, whatever the number of members."""
    with torch.no_grad():
        stacked = {name: torch.stack([parameter_at(m, name) for m in modules]) for name in names}
    return {name: value.requires_grad_(True) for name, value in stacked.items()}


def parameter_at(module: nn.Module, name: str) -> Tensor:
    """`dict(module.named_parameters())[name]` by its path's dictionaries: walking every submodule
    for each network of a stack (thousands a 12×12 grid's fitness stacks) took 0.1 s an iteration."""
    *path, leaf = name.split(".")
    for part in path:
        module = module._modules[part]  # type: ignore[assignment]
    return module._parameters[leaf]  # type: ignore[return-value]


@torch.no_grad()
def stack_buffers(modules: Sequence[nn.Module], names: Sequence[str]) -> Params:
    """The members' buffers (BatchNorm's running statistics, spectral norm's u and v) stacked (copies)."""
    per_module = [dict(m.named_buffers()) for m in modules]
    return {name: torch.stack([b[name] for b in per_module]) for name in names}


@torch.no_grad()
def unstack(params: Params, modules: Sequence[nn.Module], buffers: Params | None = None) -> None:
    """Copy each member's slice back into its own module (its buffers too, when given): one
    multi-tensor copy for all of them, not one copy a member and tensor."""
    members = {name: value.unbind(0) for name, value in params.items()}
    stacked_buffers = {name: value.unbind(0) for name, value in (buffers or {}).items()}
    targets, sources = [], []
    for index, module in enumerate(modules):
        for name, parameter in module.named_parameters():
            targets.append(parameter)
            sources.append(members[name][index])
        for name, buffer in module.named_buffers() if buffers else ():
            targets.append(buffer)
            sources.append(stacked_buffers[name][index])
    if targets:
        torch._foreach_copy_(targets, sources)


def gather(params: Params, index: Tensor) -> Params:
    """The members at `index` (opponents, a loss's rows), still connected to `params`' gradients."""
    return {name: value[index] for name, value in params.items()}


def _names() -> str:
    return ", ".join(cls.__name__ for cls in STACKABLE)


def same_architecture(modules: Sequence[nn.Module]) -> bool:
    """Whether these networks stack: one stackable class, parameters of one shape."""
    if not modules or not all(stackable(m) and type(m) is type(modules[0]) for m in modules):
        return False
    shapes = _shapes(modules[0])
    return all(_shapes(m) == shapes for m in modules[1:])


def _shapes(module: nn.Module) -> tuple[torch.Size, ...]:
    """A stackable perceptron's weight shapes (its biases follow them), read from its layers
    directly: walking `parameters()` for every network of every fitness call cost 4 % of a grid
    iteration."""
    modules = module._modules
    body = modules.get("body", module)
    layers = body._modules["net"]._modules  # type: ignore[union-attr]
    weights = tuple(layers[index]._parameters["weight"].shape for index in ("0", "2", "4"))  # type: ignore[union-attr]
    embed = modules.get("embed")
    return weights if embed is None else (*weights, embed._parameters["weight"].shape)  # type: ignore[union-attr]


@torch.no_grad()
def apply_each(modules: Sequence[nn.Module], inputs: Sequence[Tensor], labels: Tensor | None = None) -> Tensor:
    """Every module on every input, each input its own batch as in a separate call: (modules,
    inputs, B, …) from inputs of B samples each (`labels` (B,) shared by all of them).

    The fitness's all-vs-all tables and the generators' samples in a few stacked calls instead of
    one call per pair. Without minibatch std the inputs are one long batch; with it each
    (module, input) pair is its own member, so the batch statistics stay each input's own."""
    layout = StackedMLP.of(modules[0])
    params = {k: v.detach() for k, v in stack(modules, layout.names).items()}
    count, batch = len(inputs), len(inputs[0])
    if layout.minibatch_std:
        index = torch.arange(len(modules), device=inputs[0].device).repeat_interleave(count)
        x = torch.stack(list(inputs)).repeat(len(modules), *([1] * inputs[0].dim()))
        y = None if labels is None else labels.expand(len(x), batch)
        out = layout.forward(gather(params, index), x, y)
    else:
        x = torch.cat(list(inputs)).expand(len(modules), count * batch, *inputs[0].shape[1:])
        y = None if labels is None else labels.repeat(count).expand(len(modules), count * batch)
        out = layout.forward(params, x, y)
    return out.reshape(len(modules), count, batch, *out.shape[2:])
