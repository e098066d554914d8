"""A network's replica on given tensors: the same modules, new objects, without `copy.deepcopy`.

A tile hands every trained member back as a new individual on views of its stacks, two a cell
and iteration. `copy.deepcopy` of a module walks every attribute of every submodule through
Python's copy protocol: ~1.6 ms a perceptron, 0.6 s an iteration of a 12×12 grid on the host
while the device waits (benchmarks/host_overhead.py). A module is its `__dict__`: a replica copies
that dict and its containers (hooks, the sets and dicts torch keeps) one level deep, puts the
given tensors in place of the parameters and named buffers, and recurses into the submodules.
Palomino's networks hold only immutable values beside those (shapes, flags), so nothing mutable
is shared; tests/test_replica.py compares replicas with deepcopies for every network kind.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

_REPLACED = frozenset({"_parameters", "_buffers", "_modules"})  # built anew below, not copied first


def replica(module: nn.Module, tensors: Mapping[str, Tensor]) -> nn.Module:
    """A copy of `module` whose parameters are `tensors[name]` (as they are, no copy, each made
    an `nn.Parameter` with the original's `requires_grad`) and whose buffers are `tensors[name]`
    where named there, else copies of its own. Every parameter must be named."""
    return _replica(module, "", tensors, {})


def _replica(module: nn.Module, prefix: str, tensors: Mapping[str, Tensor], done: dict[int, nn.Module]) -> nn.Module:
    if id(module) in done:  # a submodule registered twice stays one module, as deepcopy keeps it
        return done[id(module)]
    new = module.__class__.__new__(module.__class__)
    done[id(module)] = new
    state = {key: _shallow(value) for key, value in module.__dict__.items() if key not in _REPLACED}
    state["_parameters"] = {
        name: None if p is None else nn.Parameter(tensors[prefix + name], p.requires_grad)
        for name, p in module._parameters.items()
    }
    state["_buffers"] = {
        name: None if b is None else tensors[prefix + name] if prefix + name in tensors else b.clone()
        for name, b in module._buffers.items()
    }
    state["_modules"] = {
        name: None if m is None else _replica(m, f"{prefix}{name}.", tensors, done)
        for name, m in module._modules.items()
    }
    new.__dict__.update(state)
    return new


def _shallow(value: object) -> object:
    """Containers (hook tables, the non-persistent buffers' names) copied; anything else shared."""
    return value.copy() if isinstance(value, (dict, list, set)) else value
