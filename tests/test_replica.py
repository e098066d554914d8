"""palomino/nn/replica.py: a network's replica on given tensors is what `copy.deepcopy` with
those tensors in its memo made (Individual.like's way before), for every network kind: the
same outputs and state, the given tensors in place, and nothing mutable shared with the source."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from palomino.nn import build_discriminator, build_generator
from palomino.nn.replica import replica

KINDS = [
    ("mlp", (2,), "points", False, False),
    ("mlp", (1, 28, 28), "image", True, False),  # minibatch std in its discriminator
    ("mlp", (1, 28, 28), "image", False, True),  # conditional
    ("dcgan", (1, 28, 28), "image", False, False),  # BatchNorm's running statistics
    ("dcgan", (1, 28, 28), "image", False, True),
    ("sngan", (3, 32, 32), "image", False, False),  # spectral norm: a parametrized class, u and v
]


def networks(name: str, shape: tuple[int, ...], kind: str, std: bool, conditional: bool) -> list[nn.Module]:
    spec = SimpleNamespace(
        name=name, latent_dim=8, hidden=16, width=4, conditional=conditional, label_dim=5, minibatch_std=std
    )
    labels = 10 if conditional else None
    return [build_generator(spec, shape, kind, labels), build_discriminator(spec, shape, kind, labels)]


def deepcopied(module: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """Individual.like's copy before replica.py: deepcopy with the tensors in its memo."""
    memo: dict[int, torch.Tensor] = {}
    for name, parameter in module.named_parameters():
        memo[id(parameter)] = nn.Parameter(tensors[name], parameter.requires_grad)
    for name, buffer in module.named_buffers():
        if name in tensors:
            memo[id(buffer)] = tensors[name]
    return copy.deepcopy(module, memo)


def inputs(module: nn.Module, shape: tuple[int, ...], conditional: bool) -> tuple:
    torch.manual_seed(1)
    first = getattr(module, "latent_dim", None)
    x = torch.randn(6, first) if first is not None else torch.randn(6, *shape)
    return (x, torch.randint(0, 10, (6,))) if conditional else (x,)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: f"{k[0]}-{k[2]}{'-std' if k[3] else ''}{'-cond' if k[4] else ''}")
def test_a_replica_is_the_deepcopy_with_the_given_tensors(kind: tuple) -> None:
    torch.manual_seed(0)
    for source in networks(*kind):
        params = {n: p.detach().clone() for n, p in source.named_parameters()}
        some_buffers = {n: b.clone() for n, b in list(source.named_buffers())[:1]}  # one named, the rest copied
        new, old = replica(source, {**params, **some_buffers}), deepcopied(source, {**params, **some_buffers})
        assert type(new) is type(old) is type(source)
        assert [n for n, _ in new.named_modules()] == [n for n, _ in old.named_modules()]
        for name, p in new.named_parameters():
            assert isinstance(p, nn.Parameter) and p.data_ptr() == params[name].data_ptr(), name
        for name, b in new.named_buffers():
            if name in some_buffers:
                assert b is some_buffers[name], name
            else:  # its own copy, as deepcopy makes it
                assert b.data_ptr() != dict(source.named_buffers())[name].data_ptr(), name
        # The same numbers, in training mode (BatchNorm and power iterations move state) and eval.
        x = inputs(source, kind[1], kind[4])
        assert torch.equal(new(*x), old(*x))
        for (name, a), (_, b) in zip(new.state_dict().items(), old.state_dict().items()):
            assert torch.equal(a, b), name
        new.eval(), old.eval()
        assert torch.equal(new(*x), old(*x))
        # Nothing mutable shared with the source: its mode, hooks and buffers are its own.
        assert source.training and all(m.training for m in source.modules())
        new.register_forward_hook(lambda *_: None)
        assert not source._forward_hooks
        before = {n: b.clone() for n, b in source.named_buffers()}
        new.train()
        new(*x)
        assert all(torch.equal(b, before[n]) for n, b in source.named_buffers() if n not in some_buffers)


def test_every_parameter_must_be_given() -> None:
    generator = networks("mlp", (2,), "points", False, False)[0]
    named = dict(generator.named_parameters())
    named.pop(next(iter(named)))
    with pytest.raises(KeyError):
        replica(generator, named)
