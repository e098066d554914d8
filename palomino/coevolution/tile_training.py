"""One iteration's gradient steps for many cells at once: the tile's lockstep form of Training.run.

Every cell (a lane) takes the same steps as in `Training.run`, in the same order, with the
same draws from its own random streams: its batch, its loss (Mustangs), each individual's
mutated rate and opponent, its noise and its penalty's interpolation. Only the arithmetic is
shared: per batch, one stacked forward/backward and one stacked Adam update for all the
lanes' generators, then the same for their discriminators. So a tiled run is the untiled
run, to float tolerance (tests/test_tiles.py), and a lane's draws never depend on the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from palomino.coevolution.individual import Individual
from palomino.coevolution.mutation import mutate_learning_rates
from palomino.coevolution.schedule import decay_factor
from palomino.coevolution.training import Steps, Training
from palomino.nn import GanLoss, get_loss
from palomino.nn.host import upload
from palomino.nn.stack_layout import StackLayout, layout_of
from palomino.nn.stacked import gather, stack, stack_buffers, stacked_gradient_penalty, unstack
from palomino.nn.stacked_adam import StackedAdam
from palomino.nn.stacked_conv import BufferUse


@dataclass
class Lane:
    """One cell's part of a tile's training: its training context and what selection gave it."""

    training: Training
    generators: list[Individual]
    discriminators: list[Individual]
    iteration: int

    @property
    def batch_size(self) -> int:
        return min(self.training.config.batch_size, len(self.training.data))


def train_tile(lanes: list[Lane]) -> list[Steps]:
    """Each lane's Steps, as `Training.run` would return them. Lanes whose batches differ in
    size (a region smaller than a batch) train in separate stacks."""
    steps: list[Steps | None] = [None] * len(lanes)
    by_size: dict[int, list[int]] = {}
    for index, lane in enumerate(lanes):
        by_size.setdefault(lane.batch_size, []).append(index)
    for indices in by_size.values():
        for index, result in zip(indices, _Lockstep([lanes[i] for i in indices]).run()):
            steps[index] = result
    return [s for s in steps if s is not None]


@dataclass
class _Role:
    """One role's members across the lanes: stacked weights and buffers, Adam, rates, the lane of each member."""

    individuals: list[Individual]
    lane_of: list[int]
    first: list[int]  # each lane's first member
    layout: StackLayout = field(init=False)
    params: dict[str, Tensor] = field(init=False)
    buffers: dict[str, Tensor] = field(init=False)
    adam: StackedAdam = field(init=False)
    rates: list[float] = field(init=False)
    last_loss: list[str | None] = field(init=False)

    def __post_init__(self) -> None:
        networks = [ind.network for ind in self.individuals]
        self.layout = layout_of(networks[0])
        self.params = stack(networks, self.layout.names)
        self.buffers = stack_buffers(networks, self.layout.buffer_names)
        betas = self.individuals[0].optimizer.param_groups[0]["betas"]
        self.adam = StackedAdam(self.params, [ind.optimizer for ind in self.individuals], betas)
        self.rates = [ind.learning_rate for ind in self.individuals]
        self.last_loss = [None] * len(self.individuals)

    @classmethod
    def of(cls, per_lane: list[list[Individual]]) -> _Role:
        individuals, lane_of, first = [], [], []
        for lane, members in enumerate(per_lane):
            first.append(len(individuals))
            individuals.extend(members)
            lane_of.extend([lane] * len(members))
        return cls(individuals, lane_of, first)

    def frozen(self, index: list[int]) -> dict[str, Tensor]:
        """The members at `index` as opponents: no gradient flows back into them."""
        detached = {k: v.detach() for k, v in self.params.items()}
        if index == list(range(len(self.individuals))):
            return detached  # each member's opponent is its lane's only one (population 1): no copy
        return gather(detached, _index(index, self.params[self.layout.names[0]].device))

    def use(self, members: list[int] | None, active: list[bool]) -> BufferUse | None:
        """The buffers that a stacked call of these members advances (None: the networks keep none)."""
        return BufferUse(self.buffers, members, active) if self.buffers else None

    def write_back(self, scales: list[float]) -> None:
        unstack(self.params, [ind.network for ind in self.individuals], self.buffers)
        self.adam.unstack([ind.optimizer for ind in self.individuals])
        for member, ind in enumerate(self.individuals):
            if self.last_loss[member] is not None:  # it stepped: its rate and loss as Training.run leaves them
                ind.set_learning_rate(self.rates[member], scales[self.lane_of[member]])
                ind.loss = self.last_loss[member]  # type: ignore[assignment]


@dataclass
class _Draws:
    """One role's draws for one batch, member by member (inactive members hold placeholders)."""

    active: list[bool]
    opponents: list[int]
    noise: list[Tensor | None]
    labels: list[Tensor | None]
    eps: list[Tensor | None]
    losses: list[str]


class _Draw:
    """Each lane's draws for one batch, from its own random streams in `Training.run`'s order."""

    def __init__(self, lanes: list[Lane], g: _Role, d: _Role, batches: list[int], steps: list[Steps]) -> None:
        self.lanes, self.g, self.d, self.batches, self.steps = lanes, g, d, batches, steps
        self.config = lanes[0].training.config
        self.size = lanes[0].batch_size

    def batch(self, step: int) -> tuple[list[Tensor | None], list[Tensor | None], _Draws, _Draws]:
        """Every lane's real batch (None once it has done its batches) and both roles' draws."""
        config = self.config
        g, d = _empty(len(self.g.individuals)), _empty(len(self.d.individuals))
        reals: list[Tensor | None] = []
        real_labels: list[Tensor | None] = []
        skip = config.discriminator_skip_each_nth_step
        for index, lane in enumerate(self.lanes):
            if step >= self.batches[index]:
                reals.append(None)
                real_labels.append(None)
                continue
            training = lane.training
            real, labels = training.data.next_batch(config.batch_size)
            reals.append(real)
            real_labels.append(labels)
            loss_name = config.losses[int(training.rng.integers(len(config.losses)))]
            self.steps[index].losses_used[loss_name] += 1
            if loss_name != "wgan_gp" or step % config.n_critic == 0:
                for member in range(self.g.first[index], self.g.first[index] + len(lane.generators)):
                    self._mutate(self.g, member, training)
                    g.active[member], g.losses[member] = True, loss_name
                    g.opponents[member] = self.d.first[index] + int(training.rng.integers(len(lane.discriminators)))
                    if labels is not None:
                        g.labels[member] = training.data.sampled_labels(self.size)
                    g.noise[member] = training.noise(self.size)
            if skip == 0 or step % (skip + 1) == 0:
                for member in range(self.d.first[index], self.d.first[index] + len(lane.discriminators)):
                    self._mutate(self.d, member, training)
                    d.active[member], d.losses[member] = True, loss_name
                    d.opponents[member] = self.g.first[index] + int(training.rng.integers(len(lane.generators)))
                    d.noise[member] = training.noise(self.size)
                    d.labels[member] = labels
                    if get_loss(loss_name).gp_weight:  # gradient_penalty's draw, on the same stream
                        shape = (self.size,) + (1,) * (real.dim() - 1)
                        rng = training.torch_rng
                        d.eps[member] = torch.rand(shape, generator=rng, device=rng.device).to(real)
        return reals, real_labels, g, d

    def _mutate(self, role: _Role, member: int, training: Training) -> None:
        mutation = self.config.mutation
        (role.rates[member],) = mutate_learning_rates(
            [role.rates[member]], self.config.learning_rate, mutation.probability, mutation.alpha, training.rng
        )


class _Lockstep:
    """Lanes with one batch size, stepped together."""

    def __init__(self, lanes: list[Lane]) -> None:
        self.config = lanes[0].training.config
        self.g = _Role.of([lane.generators for lane in lanes])
        self.d = _Role.of([lane.discriminators for lane in lanes])
        self.scales = [decay_factor(self.config.decay, lane.iteration / self.config.iterations) for lane in lanes]
        self.batches = [lane.training.batches_per_iteration() for lane in lanes]
        self.steps = [Steps() for _ in lanes]
        self.draws = _Draw(lanes, self.g, self.d, self.batches, self.steps)
        self.device = self.g.params[self.g.layout.names[0]].device
        self.d_lanes = _index(self.d.lane_of, self.device)
        self.g_losses: list[tuple[Tensor, list[bool]]] = []
        self.d_losses: list[tuple[Tensor, list[bool]]] = []

    def run(self) -> list[Steps]:
        for step in range(max(self.batches)):
            reals, labels, g_draws, d_draws = self.draws.batch(step)
            if any(g_draws.active):
                self.g_losses.append((self._generator_step(g_draws), g_draws.active))
            if any(d_draws.active):
                self.d_losses.append((self._discriminator_step(d_draws, reals, labels), d_draws.active))
        self.g.write_back(self.scales)
        self.d.write_back(self.scales)
        self._collect(self.g, self.g_losses, "generator")
        self._collect(self.d, self.d_losses, "discriminator")
        return self.steps

    # ---- the stacked steps ---------------------------------------------------------------------

    def _generator_step(self, draws: _Draws) -> Tensor:
        z = _stacked(draws.noise)
        labels = _stacked_labels(draws.labels)
        fake = self.g.layout.forward(self.g.params, z, labels, self.g.use(None, draws.active))
        opponents = self.d.frozen(draws.opponents)
        logits = self.d.layout.forward(opponents, fake, labels, self.d.use(draws.opponents, draws.active))
        values = _per_member(draws.losses, lambda loss, rows, _: loss.generator(_rows(logits, rows)), self.device)
        self._update(self.g, values, draws)
        return values.detach()

    def _discriminator_step(
        self, draws: _Draws, reals: list[Tensor | None], real_labels: list[Tensor | None]
    ) -> Tensor:
        z = _stacked(draws.noise)
        labels = _stacked_labels(draws.labels)
        real = _stacked(reals)[self.d_lanes]  # each member's lane's batch
        with torch.no_grad():
            opponents = self.g.frozen(draws.opponents)
            fake = self.g.layout.forward(opponents, z, labels, self.g.use(draws.opponents, draws.active))
        # Real then fake, each its own forward: a cell's D runs twice, BatchNorm and spectral norm included.
        own = self.d.use(None, draws.active)
        real_logits = self.d.layout.forward(self.d.params, real, labels, own)
        fake_logits = self.d.layout.forward(self.d.params, fake, labels, own)

        def loss_of(loss: GanLoss, rows: Tensor | None, members: list[int]) -> Tensor:
            value = loss.discriminator_from_logits(_rows(real_logits, rows), _rows(fake_logits, rows))
            if loss.gp_weight:
                value = value + loss.gp_weight * self._penalty(draws, rows, members, real, fake, labels)
            return value

        values = _per_member(draws.losses, loss_of, self.device)
        self._update(self.d, values, draws)
        return values.detach()

    def _penalty(
        self, draws: _Draws, rows: Tensor | None, members: list[int], real: Tensor, fake: Tensor, labels: Tensor | None
    ) -> Tensor:
        """WGAN-GP's E[(‖∇D(x̂)‖₂ − 1)²] per member, as nn.losses.gradient_penalty computes it for one."""
        rows = rows if rows is not None else torch.arange(len(real), device=self.device)
        eps = torch.stack([draws.eps[m] for m in members])  # type: ignore[misc]
        labels = None if labels is None else labels[rows]
        use = self.d.use(members, [draws.active[m] for m in members])
        params = gather(self.d.params, rows)
        return stacked_gradient_penalty(self.d.layout, params, real[rows], fake[rows], eps, labels, use)

    def _update(self, role: _Role, values: Tensor, draws: _Draws) -> None:
        everyone = all(draws.active)
        active = None if everyone else _on(self.device, draws.active, torch.bool)
        total = values.sum() if everyone else (values * active).sum()
        grads = torch.autograd.grad(total, list(role.params.values()))
        rates = [rate * self.scales[lane] for rate, lane in zip(role.rates, role.lane_of)]
        role.adam.step(dict(zip(role.params, grads)), _on(self.device, rates, torch.float64), active)
        for member, on in enumerate(draws.active):
            if on:
                role.last_loss[member] = draws.losses[member]

    def _collect(self, role: _Role, history: list[tuple[Tensor, list[bool]]], name: str) -> None:
        """Each lane's step losses in Training.run's order (step by step, member by member)."""
        for values, active in history:
            for member, value in enumerate(values.unbind()):
                if active[member]:
                    getattr(self.steps[role.lane_of[member]], name).append(value)


def _empty(members: int) -> _Draws:
    return _Draws(
        [False] * members, [0] * members, [None] * members, [None] * members, [None] * members, [""] * members
    )


def _on(device: torch.device, values: list, dtype: torch.dtype) -> Tensor:
    """Host values on the device without waiting for it: on a GPU a blocking copy per step would
    make the host wait for every queued kernel instead of running ahead."""
    return upload(values, device, dtype)


def _index(values: list[int], device: torch.device) -> Tensor:
    return _on(device, values, torch.long)


def _stacked(parts: list[Tensor | None]) -> Tensor:
    """Members' tensors stacked; inactive members' (None) as zeros, masked out later."""
    like = next(p for p in parts if p is not None)
    return torch.stack([like.new_zeros(like.shape) if p is None else p for p in parts])


def _stacked_labels(parts: list[Tensor | None]) -> Tensor | None:
    return None if all(p is None for p in parts) else _stacked(parts)


def _rows(values: Tensor, rows: Tensor | None) -> Tensor:
    return values if rows is None else values[rows]


def _per_member(
    names: list[str], compute: Callable[[GanLoss, Tensor | None, list[int]], Tensor], device: torch.device
) -> Tensor:
    """Each member's loss value under its own loss (Mustangs: a lane's draw for this batch);
    `compute` takes the loss, the members' rows on the device (None: all) and on the host."""
    used = {name for name in names if name}
    if len(used) == 1:
        return compute(get_loss(used.pop()), None, list(range(len(names))))
    first = next(name for name in names if name)
    names = [name or first for name in names]  # inactive members: any loss (masked out of the update)
    values = None
    for name in dict.fromkeys(names):
        members = [m for m, n in enumerate(names) if n == name]
        rows = _index(members, device)
        part = compute(get_loss(name), rows, members)
        values = (part.new_zeros(len(names)) if values is None else values).index_add(0, rows, part)
    assert values is not None
    return values
