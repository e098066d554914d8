"""A tile's lanes as stacks: each role's members stacked (weights, buffers, Adam, rates), and
every lane's plan as per-step tables over those members, sent to the device in one copy.

tile_training.py steps them eagerly, tile_compiled_steps.py through the compiled functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from palomino.coevolution.individual import Individual
from palomino.coevolution.plan import IterationPlan
from palomino.coevolution.training import Training
from palomino.nn.host import upload_all
from palomino.nn.stack_layout import StackLayout, layout_of
from palomino.nn.stacked import gather, stack, stack_buffers
from palomino.nn.stacked_adam import StackedAdam
from palomino.nn.stacked_buffers import BufferUse


@dataclass
class Lane:
    """One cell's part of a tile's training: its training context and what selection gave it."""

    training: Training
    generators: list[Individual]
    discriminators: list[Individual]
    iteration: int
    # Opponents that never step (selection off: the neighbours' copies), stacked after the members.
    frozen_generators: list[Individual] = field(default_factory=list)
    frozen_discriminators: list[Individual] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return min(self.training.config.batch_size, len(self.training.data))


@dataclass
class Role:
    """One role's members across the lanes: stacked weights and buffers, Adam, rates, the lane of each member."""

    individuals: list[Individual]
    lane_of: list[int]
    first: list[int]  # each lane's first member
    layout: StackLayout = field(init=False)
    params: dict[str, Tensor] = field(init=False)
    buffers: dict[str, Tensor] = field(init=False)
    adam: StackedAdam = field(init=False)
    detached: dict[str, Tensor] = field(init=False)
    rates: list[float] = field(init=False)
    last_loss: list[str | None] = field(init=False)

    def __post_init__(self) -> None:
        networks = [ind.network for ind in self.individuals]
        self.layout = layout_of(networks[0])
        self.params = stack(networks, self.layout.names)
        self.buffers = stack_buffers(networks, self.layout.buffer_names)
        betas = self.individuals[0].optimizer.param_groups[0]["betas"]
        self.adam = StackedAdam(self.params, [ind.optimizer for ind in self.individuals], betas)
        # The same numbers without a gradient, for opponents: Adam updates them in place, so one
        # detach an iteration serves every step (an opponent is used before its own update).
        self.detached = {k: v.detach() for k, v in self.params.items()}
        self.rates = [ind.learning_rate for ind in self.individuals]
        self.last_loss = [None] * len(self.individuals)

    @classmethod
    def of(cls, per_lane: list[list[Individual]]) -> Role:
        individuals, lane_of, first = [], [], []
        for lane, members in enumerate(per_lane):
            first.append(len(individuals))
            individuals.extend(members)
            lane_of.extend([lane] * len(members))
        return cls(individuals, lane_of, first)

    def frozen(self, index: list[int], on_device: Tensor, by_chance: bool = True) -> dict[str, Tensor]:
        """The members at `index` (`on_device`: the same, on the device) as opponents: no gradient
        flows back into them. `by_chance` false (a compiled step, whose inputs keep one layout for
        the run: a copy's differs from the stack's): the stack itself wherever every lane has one
        member, else always a copy."""
        if by_chance:
            single = index == list(range(len(self.individuals)))
        else:  # one member a lane on both sides: an active member's opponent is its lane's one (inactive: masked)
            single = len(self.first) == len(self.individuals) == len(index)
        return self.detached if single else gather(self.detached, on_device)

    def use(self, members: list[int] | None, active: list[bool]) -> BufferUse | None:
        """The buffers that a stacked call of these members advances (None: the networks keep none)."""
        return BufferUse(self.buffers, members, active) if self.buffers else None

    def materialise(self, scales: list[float], taken: np.ndarray) -> list[Individual]:
        """Each member as a new individual whose weights, buffers and Adam state are its rows of
        the stacks (views: no copy a member). Selection hands a tile its winners themselves, not
        clones (a clone would be copied again into the stack); the tile never writes to them."""
        params = {name: value.detach().unbind(0) for name, value in self.params.items()}
        buffers = {name: value.unbind(0) for name, value in self.buffers.items()}
        states = self.adam.member_states([bool(ind.optimizer.state) for ind in self.individuals], taken.tolist())
        out = []
        for member, ind in enumerate(self.individuals):
            rows = {name: rows[member] for name, rows in [*params.items(), *buffers.items()]}
            trained = ind.like(rows, states[member])
            if self.last_loss[member] is not None:  # it stepped: its rate and loss as Training.run leaves them
                trained.set_learning_rate(self.rates[member], scales[self.lane_of[member]])
                trained.loss = self.last_loss[member]  # type: ignore[assignment]
            out.append(trained)
        return out


class Tables:
    """Every lane's plan as per-step tables over the tile's members, sent to the device in one
    copy per iteration (inactive entries point at row 0 and are masked out). The host keeps what
    its decisions need: who is active, each member's loss and opponent."""

    def __init__(
        self,
        lanes: list[Lane],
        plans: list[IterationPlan],
        g: Role,
        d: Role,
        data: tuple[Tensor, Tensor | None, list[int]],
    ) -> None:
        """`data`: the lanes' datasets on the device and each lane's offset into them (TileData.of)."""
        self.count = max(len(plan.steps) for plan in plans)
        samples, labels, offsets = data
        self.samples, self.labels = samples, labels
        noise_rows = _offsets([len(plan.noise) for plan in plans])
        eps_rows = _offsets([0 if plan.eps is None else len(plan.eps) for plan in plans])
        self.noise = torch.cat([plan.noise for plan in plans])
        epses = [plan.eps for plan in plans if plan.eps is not None]
        self.eps = torch.cat(epses) if epses else None
        size = plans[0].size
        g_shape, d_shape = (self.count, len(g.individuals)), (self.count, len(d.individuals))
        self.g_active, self.d_active = np.zeros(g_shape, bool), np.zeros(d_shape, bool)
        self.g_losses = [[""] * len(g.individuals) for _ in range(self.count)]
        self.d_losses = [[""] * len(d.individuals) for _ in range(self.count)]
        dims = {
            "g_opponent": g_shape,
            "g_noise": g_shape,
            "g_label": (*g_shape, size),
            "d_opponent": d_shape,
            "d_noise": d_shape,
            "d_eps": d_shape,
            "d_real": (*d_shape, size),
        }
        long = {name: np.zeros(shape, np.int64) for name, shape in dims.items()}
        self.rates = {"g": np.zeros(g_shape), "d": np.zeros(d_shape)}
        for lane, plan in enumerate(plans):
            for step, drawn in enumerate(plan.steps):
                for k, move in enumerate(drawn.generators):
                    member = g.first[lane] + k
                    self.g_active[step, member], self.g_losses[step][member] = True, drawn.loss
                    long["g_opponent"][step, member] = d.first[lane] + move.opponent
                    long["g_noise"][step, member] = noise_rows[lane] + move.noise
                    if move.labels is not None and plan.label_draws is not None:
                        long["g_label"][step, member] = plan.label_draws[move.labels] + offsets[lane]
                    self.rates["g"][step, member] = move.rate
                for k, move in enumerate(drawn.discriminators):
                    member = d.first[lane] + k
                    self.d_active[step, member], self.d_losses[step][member] = True, drawn.loss
                    long["d_opponent"][step, member] = g.first[lane] + move.opponent
                    long["d_noise"][step, member] = noise_rows[lane] + move.noise
                    if move.eps is not None:
                        long["d_eps"][step, member] = eps_rows[lane] + move.eps
                    self.rates["d"][step, member] = move.rate
                for k in range(len(lanes[lane].discriminators)):  # each member sees its lane's batch
                    long["d_real"][step, d.first[lane] + k] = plan.batches[step] + offsets[lane]
        self.g_opponents = long["g_opponent"].tolist()
        self.d_opponents = long["d_opponent"].tolist()
        # The integer tables and the masks each in one copy to the device.
        self.on_device = upload_all(long, samples.device)
        self.active_on = upload_all({"g": self.g_active, "d": self.d_active}, samples.device)

    def generator_inputs(self, step: int) -> tuple[Tensor, Tensor | None]:
        """A step's noise and labels for every generator member (inactive ones: row 0's, masked out)."""
        index = self.on_device
        labels = None if self.labels is None else self.labels[index["g_label"][step]]
        return self.noise[index["g_noise"][step]], labels

    def discriminator_inputs(self, step: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """A step's noise, each critic's lane's real batch and that batch's labels."""
        index = self.on_device
        batch = index["d_real"][step]
        labels = None if self.labels is None else self.labels[batch]
        return self.noise[index["d_noise"][step]], self.samples[batch], labels


def _offsets(counts: list[int]) -> list[int]:
    """Where each of consecutive blocks of these sizes starts."""
    out, total = [], 0
    for count in counts:
        out.append(total)
        total += count
    return out
