"""An individual: a network with its own Adam state and learning rate, and its fitness."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from palomino.nn.replica import replica

Role = Literal["generator", "discriminator"]


def make_adam(network: nn.Module, learning_rate: float, betas: tuple[float, float]) -> torch.optim.Adam:
    return torch.optim.Adam(network.parameters(), lr=learning_rate, betas=betas)


@dataclass
class Individual:
    role: Role
    network: nn.Module
    optimizer: torch.optim.Adam
    learning_rate: float
    fitness: float = float("inf")  # a loss: lower is better
    loss: str = ""  # the loss of its last training step (Mustangs)
    origin: str = ""  # "r-c" of the cell that trained it last

    def set_learning_rate(self, learning_rate: float, scale: float = 1.0) -> None:
        """Its own rate (inherited, mutated) and the step the optimiser takes: rate × the schedule's scale."""
        self.learning_rate = learning_rate
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate * scale

    def clone(self) -> Individual:
        """An independent copy, Adam moments included (selection copies, never aliases). Each
        tensor is cloned alone: a tile's individuals hold views of its stacks, and deepcopy
        copies a view's whole storage."""
        named = [*self.network.named_parameters(), *self.network.named_buffers()]
        states = [self.optimizer.state.get(p, {}) for p in self.network.parameters()]
        return self.like(
            {n: t.detach().clone() for n, t in named}, [{k: v.clone() for k, v in s.items()} for s in states]
        )

    def like(self, tensors: Mapping[str, torch.Tensor], states: list[dict[str, torch.Tensor]]) -> Individual:
        """An individual with this one's rate, fitness, loss, origin and optimiser settings, on a
        copy of its network whose parameters (and the buffers named) are `tensors`, by name,
        as they are (no copy), with these Adam states (one a parameter, in order; empty: never
        stepped)."""
        network = replica(self.network, tensors)
        optimizer = make_adam(network, self.learning_rate, self.optimizer.param_groups[0]["betas"])
        optimizer.param_groups[0].update({k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"})
        for parameter, state in zip(network.parameters(), states):
            if state:
                optimizer.state[parameter] = state
        return Individual(self.role, network, optimizer, self.learning_rate, self.fitness, self.loss, self.origin)

    def owning(self) -> Individual:
        """This individual, or where its tensors are views of a tile's stacks, a copy with storage
        of its own (the same numbers): one that outlives its iteration would keep every member of
        that stack alive. A copy, not a change in place: a deferred snapshot may be reading it."""
        tensors = [*self.network.parameters(), *self.network.buffers()]
        tensors += [v for state in self.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        return self.clone() if any(_shared(t) for t in tensors) else self

    def tensors(self, prefix: str, moments: bool = True) -> dict[str, torch.Tensor]:
        """Weights (and buffers) and, with `moments`, Adam's state, as a flat, safetensors-ready
        dict (copies, not views)."""
        out = {f"{prefix}.net.{k}": v.detach().clone() for k, v in self.network.state_dict().items()}
        if not moments:
            return out
        for index, state in self.optimizer.state_dict()["state"].items():
            for name, value in state.items():
                out[f"{prefix}.opt.{index}.{name}"] = torch.as_tensor(value).detach().clone()
        return out

    def load_tensors(self, tensors: dict[str, torch.Tensor], prefix: str) -> None:
        """Inverse of `tensors`; raises ValueError naming the first mismatching tensor."""
        net_prefix, opt_prefix = f"{prefix}.net.", f"{prefix}.opt."
        weights = {k[len(net_prefix) :]: v for k, v in tensors.items() if k.startswith(net_prefix)}
        expected = self.network.state_dict()
        if weights.keys() != expected.keys():
            missing = sorted(expected.keys() - weights.keys()) or sorted(weights.keys() - expected.keys())
            raise ValueError(f"{prefix}: tensors do not match the architecture (first mismatch: {missing[0]})")
        for name, value in weights.items():
            if value.shape != expected[name].shape:
                raise ValueError(f"{prefix}.{name}: shape {tuple(value.shape)}, expected {tuple(expected[name].shape)}")
        self.network.load_state_dict(weights)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith(opt_prefix):
                index, _, name = key[len(opt_prefix) :].partition(".")
                state.setdefault(int(index), {})[name] = value.clone()  # never alias the source
        saved = self.optimizer.state_dict()
        saved["state"] = state
        self.optimizer.load_state_dict(saved)
        self.set_learning_rate(self.learning_rate)


def _shared(tensor: torch.Tensor) -> bool:
    """Whether this tensor is a view of a larger storage (a tile's stack)."""
    return tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size()


@dataclass
class Population:
    """A cell's local sub-population of one role, best first after `sort`."""

    individuals: list[Individual] = field(default_factory=list)

    @property
    def best(self) -> Individual:
        return min(self.individuals, key=lambda ind: ind.fitness)

    def __len__(self) -> int:
        return len(self.individuals)

    def __iter__(self):
        return iter(self.individuals)
