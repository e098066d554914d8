"""One iteration's gradient steps for many cells at once: the tile's lockstep form of Training.run.

Every cell (a lane) takes the same steps as in `Training.run`, in the same order, with the
same draws from its own random streams: its batch, its loss (Mustangs), each individual's
mutated rate and opponent, its noise and its penalty's interpolation. Only the arithmetic is
shared: per batch, one stacked forward/backward and one stacked Adam update for all the
lanes' generators, then the same for their discriminators. So a tiled run is the untiled
run, to float tolerance (tests/test_tiles.py), and a lane's draws never depend on the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from palomino.coevolution.cell_data import CellData
from palomino.coevolution.individual import Individual
from palomino.coevolution.plan import IterationPlan
from palomino.coevolution.schedule import decay_factor
from palomino.coevolution.tile_compiled import CompiledBatch, compilable
from palomino.coevolution.tile_turns import StepTurns, most_trained, step_turns
from palomino.coevolution.training import Steps, Training
from palomino.nn import GanLoss, get_loss
from palomino.nn.host import upload, upload_all
from palomino.nn.precision import matmul_precision
from palomino.nn.stack_layout import StackLayout, layout_of
from palomino.nn.stacked import gather, stack, stack_buffers, stacked_gradient_penalty
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


def train_tile(lanes: list[Lane], data: TileData | None = None) -> list[Steps]:
    """Each lane's Steps, as `Training.run` would return them. Lanes whose batches differ in
    size (a region smaller than a batch) train in separate stacks. `data`: the tile's data on the
    device, kept between iterations (a new one is built when none is given)."""
    data = data or TileData()
    steps: list[Steps | None] = [None] * len(lanes)
    by_size: dict[int, list[int]] = {}
    for index, lane in enumerate(lanes):
        by_size.setdefault(lane.batch_size, []).append(index)
    first = lanes[0].training
    with matmul_precision(first.precision, first.data.device):
        for indices in by_size.values():
            for index, result in zip(indices, _Lockstep([lanes[i] for i in indices], data).run()):
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
    def of(cls, per_lane: list[list[Individual]]) -> _Role:
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


class _Tables:
    """Every lane's plan as per-step tables over the tile's members, sent to the device in one
    copy per iteration (inactive entries point at row 0 and are masked out). The host keeps what
    its decisions need: who is active, each member's loss and opponent."""

    def __init__(self, lanes: list[Lane], plans: list[IterationPlan], g: _Role, d: _Role, data: TileData) -> None:
        self.count = max(len(plan.steps) for plan in plans)
        samples, labels, offsets = data.of(lanes)
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


def _copy_back(buffers: dict[str, Tensor], stepped: dict[str, Tensor]) -> None:
    """A compiled step's buffers into the stack's own (which the members' rows view): one
    multi-tensor copy (a launch or two on a GPU, where one copy a buffer would be ~30 a batch)."""
    if stepped:
        torch._foreach_copy_([buffers[name] for name in stepped], list(stepped.values()))


def _offsets(counts: list[int]) -> list[int]:
    """Where each of consecutive blocks of these sizes starts."""
    out, total = [], 0
    for count in counts:
        out.append(total)
        total += count
    return out


class TileData:
    """A tile's training data on its device as one tensor (the lanes' datasets side by side, each
    once however many lanes share it), with each lane's offset into it. Kept between iterations:
    a tile builds it once, and again only when a lane's data changes (a relocated cell)."""

    def __init__(self, compiled: bool = False, strict: bool = True, graphs: bool = False) -> None:
        self._datas: list[CellData] = []  # held, so that no other object can take their ids
        self._value: tuple[Tensor, Tensor | None, list[int]] | None = None
        self.compiled = compiled  # train through tile_compiled.py where the networks allow
        self.strict = strict  # a compiler failure is an error (compile: on), else eager (auto)
        self.graphs = graphs  # compiled steps replayed as CUDA graphs (compile: graphs)
        self._batches: dict[int, CompiledBatch] = {}  # a batch size's compiled steps, kept for the run

    def compiled_batch(self, batch: int, g: _Role, d: _Role, losses: list[str]) -> CompiledBatch | None:
        """The compiled steps for stacks of this batch size (built on first use), or None: eager."""
        if not (self.compiled and compilable(g.layout, d.layout, asked=self.strict)):
            return None
        if batch not in self._batches:
            losses_ = [get_loss(name) for name in losses]
            self._batches[batch] = CompiledBatch(g.layout, d.layout, losses_, self.strict, self.graphs)
        return self._batches[batch]

    def of(self, lanes: list[Lane]) -> tuple[Tensor, Tensor | None, list[int]]:
        datas = [lane.training.data for lane in lanes]
        same = len(datas) == len(self._datas) and all(a is b for a, b in zip(datas, self._datas))
        if not same or self._value is None:
            self._datas, self._value = datas, self._build(datas)
        return self._value

    @staticmethod
    def _build(datas: list[CellData]) -> tuple[Tensor, Tensor | None, list[int]]:
        unique: dict[int, int] = {}  # the host dataset a lane's data came from → its offset in the tile's
        parts: list[CellData] = []
        offsets, total = [], 0
        for data in datas:
            if id(data.source) not in unique:
                unique[id(data.source)] = total
                parts.append(data)
                total += len(data.samples)
            offsets.append(unique[id(data.source)])
        if len(parts) == 1:  # one dataset for every lane (no regions): the first lane's, no copy
            return parts[0].samples, parts[0].labels, offsets
        samples = torch.cat([data.samples for data in parts])
        labels = None if parts[0].labels is None else torch.cat([data.labels for data in parts])  # type: ignore[misc]
        return samples, labels, offsets


class _Lockstep:
    """Lanes with one batch size, stepped together on their plans."""

    def __init__(self, lanes: list[Lane], data: TileData) -> None:
        self.config = lanes[0].training.config
        self.lanes = lanes
        self.g = _Role.of([[*lane.generators, *lane.frozen_generators] for lane in lanes])
        self.d = _Role.of([[*lane.discriminators, *lane.frozen_discriminators] for lane in lanes])
        self.scales = [decay_factor(self.config.decay, lane.iteration / self.config.iterations) for lane in lanes]
        self.plans = [
            lane.training.plan(
                lane.generators, lane.discriminators, (len(lane.frozen_generators), len(lane.frozen_discriminators))
            )
            for lane in lanes
        ]
        self.steps = [Steps(losses_used=Counter(plan.losses_used)) for plan in self.plans]
        self.device = self.g.params[self.g.layout.names[0]].device
        self.tables = _Tables(lanes, self.plans, self.g, self.d, data)
        # Each step's rates × its lane's decay, for every member, in one copy.
        scaled = {
            role: self.tables.rates[role] * np.array([self.scales[lane] for lane in members.lane_of])
            for role, members in (("g", self.g), ("d", self.d))
        }
        self.rates = upload_all(scaled, self.device)
        self.compiled = data.compiled_batch(lanes[0].batch_size, self.g, self.d, self.config.losses)
        self.weights = self._loss_weights() if self.compiled and len(self.compiled.losses) > 1 else None
        self.turns = self._buffer_turns() if self.compiled and (self.g.buffers or self.d.buffers) else None
        self.g_losses: list[tuple[Tensor, list[bool]]] = []
        self.d_losses: list[tuple[Tensor, list[bool]]] = []

    def run(self) -> list[Steps]:
        tables = self.tables
        graphs = self.compiled is not None and self.compiled.graphs
        for step in range(tables.count):
            if graphs:  # a new replay may reuse the last one's memory: what a step keeps, it clones
                torch.compiler.cudagraph_mark_step_begin()
            g_active, d_active = tables.g_active[step].tolist(), tables.d_active[step].tolist()
            if any(g_active):
                self.g_losses.append((self._generator_step(step, g_active), g_active))
            if any(d_active):
                self.d_losses.append((self._discriminator_step(step, d_active), d_active))
        self._last_moves()
        tables = self.tables
        for role, members, active in (
            (self.g, "generators", tables.g_active),
            (self.d, "discriminators", tables.d_active),
        ):
            trained = role.materialise(self.scales, active.sum(axis=0))
            for lane, first in zip(self.lanes, role.first):  # in place: the cell's Selected holds these lists
                chosen = getattr(lane, members)
                chosen[:] = trained[first : first + len(chosen)]
        self._collect(self.g, self.g_losses, "generator")
        self._collect(self.d, self.d_losses, "discriminator")
        return self.steps

    def _last_moves(self) -> None:
        """Each member's rate and loss as its last step left them (Training.run's order)."""
        tables = self.tables
        for name, role, active, losses in (
            ("g", self.g, tables.g_active, tables.g_losses),
            ("d", self.d, tables.d_active, tables.d_losses),
        ):
            for member in range(len(role.individuals)):
                stepped = np.flatnonzero(active[:, member])
                if len(stepped):
                    role.rates[member] = float(tables.rates[name][stepped[-1], member])
                    role.last_loss[member] = losses[stepped[-1]][member]

    # ---- the stacked steps ---------------------------------------------------------------------

    def _loss_weights(self) -> dict[str, Tensor]:
        """A compiled tile whose members draw different losses: each step's (losses, members)
        table of ones where a member's loss is, for both roles, sent in one copy."""
        assert self.compiled is not None
        tables, count = self.tables, len(self.compiled.losses)
        out = {}
        for role, names in (("g", tables.g_losses), ("d", tables.d_losses)):
            table = np.zeros((tables.count, count, len(names[0]) if names else 0), np.float32)
            for step, row in enumerate(names):
                for member, loss in enumerate(self.compiled.index(row)):
                    if loss >= 0:
                        table[step, loss, member] = 1.0
            out[role] = table
        dtype = self.g.params[self.g.layout.names[0]].dtype
        return {role: value.to(dtype) for role, value in upload_all(out, self.device).items()}

    def _buffer_turns(self) -> list[StepTurns]:
        """A compiled tile of convolutional stacks: each step's buffer tables (tile_turns.py)."""
        assert self.compiled is not None
        tables = self.tables
        penalised = None
        if self.compiled.penalised:
            gp = {loss.name for loss in self.compiled.losses if loss.gp_weight}
            penalised = np.array([[name in gp for name in row] for row in tables.d_losses], bool).reshape(
                tables.d_active.shape
            )
        return step_turns(
            tables.g_active,
            tables.d_active,
            tables.g_opponents,
            tables.d_opponents,
            (
                most_trained([len(lane.generators) for lane in self.lanes]),
                most_trained([len(lane.discriminators) for lane in self.lanes]),
            ),
            (bool(self.g.buffers), bool(self.d.buffers)),
            penalised,
            self.device,
        )

    def _generator_step(self, step: int, active: list[bool]) -> Tensor:
        tables, index = self.tables, self.tables.on_device
        z = tables.noise[index["g_noise"][step]]
        labels = None if tables.labels is None else tables.labels[index["g_label"][step]]
        opponents = tables.g_opponents[step]
        if self.compiled is not None:
            params = self.d.frozen(opponents, index["g_opponent"][step], by_chance=False)
            weights = None if self.weights is None else self.weights["g"][step]
            turns = self.turns[step] if self.turns else None
            values, total, g_buffers, d_buffers = self.compiled.generator_step(
                self.g.params,
                params,
                z,
                labels,
                weights,
                tables.active_on["g"][step],
                (self.g.buffers, self.d.buffers),
                (turns.g_own, turns.d_facing_g) if turns else (None, None),
            )
            _copy_back(self.g.buffers, g_buffers)
            _copy_back(self.d.buffers, d_buffers)
            self._compiled_update(self.g, total, tables.active_on["g"][step], self.rates["g"][step])
            return self._kept(values)
        fake = self.g.layout.forward(self.g.params, z, labels, self.g.use(None, active))
        params = self.d.frozen(opponents, index["g_opponent"][step])
        logits = self.d.layout.forward(params, fake, labels, self.d.use(opponents, active))
        losses = tables.g_losses[step]
        values = _per_member(losses, lambda loss, rows, _: loss.generator(_rows(logits, rows)), self.device)
        self._update(self.g, values, active, tables.active_on["g"][step], self.rates["g"][step])
        return values.detach()

    def _discriminator_step(self, step: int, active: list[bool]) -> Tensor:
        tables, index = self.tables, self.tables.on_device
        z = tables.noise[index["d_noise"][step]]
        batch = index["d_real"][step]
        real = tables.samples[batch]  # each member's lane's batch
        labels = None if tables.labels is None else tables.labels[batch]
        opponents = tables.d_opponents[step]
        if self.compiled is not None:
            params = self.g.frozen(opponents, index["d_opponent"][step], by_chance=False)
            weights = None if self.weights is None else self.weights["d"][step]
            eps = self._interpolations(step, real) if self.compiled.penalised else None
            turns = self.turns[step] if self.turns else None
            values, total, g_buffers, d_buffers = self.compiled.discriminator_step(
                self.d.params,
                params,
                z,
                real,
                labels,
                weights,
                tables.active_on["d"][step],
                eps,
                (self.g.buffers, self.d.buffers),
                (turns.g_facing_d, turns.d_own, turns.d_penalised) if turns else (None, None, None),
            )
            _copy_back(self.g.buffers, g_buffers)
            _copy_back(self.d.buffers, d_buffers)
            self._compiled_update(self.d, total, tables.active_on["d"][step], self.rates["d"][step])
            return self._kept(values)
        with torch.no_grad():
            params = self.g.frozen(opponents, index["d_opponent"][step])
            fake = self.g.layout.forward(params, z, labels, self.g.use(opponents, active))
        # Real then fake, each its own forward: a cell's D runs twice, BatchNorm and spectral norm included.
        own = self.d.use(None, active)
        real_logits = self.d.layout.forward(self.d.params, real, labels, own)
        fake_logits = self.d.layout.forward(self.d.params, fake, labels, own)

        def loss_of(loss: GanLoss, rows: Tensor | None, members: list[int]) -> Tensor:
            value = loss.discriminator_from_logits(_rows(real_logits, rows), _rows(fake_logits, rows))
            if loss.gp_weight:
                value = value + loss.gp_weight * self._penalty(step, active, rows, members, real, fake, labels)
            return value

        values = _per_member(tables.d_losses[step], loss_of, self.device)
        self._update(self.d, values, active, tables.active_on["d"][step], self.rates["d"][step])
        return values.detach()

    def _interpolations(self, step: int, real: Tensor) -> Tensor:
        """Each member's interpolation weights for a compiled penalised step, one shape for the run:
        zeros where no lane drew one this iteration (their penalty's weight is then zero too)."""
        if self.tables.eps is None:
            return real.new_zeros(real.shape[:2] + (1,) * (real.dim() - 2))
        return self.tables.eps[self.tables.on_device["d_eps"][step]].to(real)

    def _penalty(
        self,
        step: int,
        active: list[bool],
        rows: Tensor | None,
        members: list[int],
        real: Tensor,
        fake: Tensor,
        labels: Tensor | None,
    ) -> Tensor:
        """WGAN-GP's E[(‖∇D(x̂)‖₂ − 1)²] per member, as nn.losses.gradient_penalty computes it for one."""
        assert self.tables.eps is not None, "a plan with a penalty draws its interpolations"
        rows = rows if rows is not None else torch.arange(len(real), device=self.device)
        eps = self.tables.eps[self.tables.on_device["d_eps"][step][rows]].to(real)
        labels = None if labels is None else labels[rows]
        use = self.d.use(members, [active[m] for m in members])
        params = gather(self.d.params, rows)
        return stacked_gradient_penalty(self.d.layout, params, real[rows], fake[rows], eps, labels, use)

    def _update(self, role: _Role, values: Tensor, active: list[bool], on_device: Tensor, rates: Tensor) -> None:
        everyone = all(active)
        mask = None if everyone else on_device
        total = values.sum() if everyone else (values * mask).sum()
        grads = torch.autograd.grad(total, list(role.params.values()))
        role.adam.step(dict(zip(role.params, grads)), rates, mask)

    def _kept(self, values: Tensor) -> Tensor:
        """A compiled step's losses, kept for the iteration's reports: a copy where a CUDA graph's
        next replay would overwrite its outputs."""
        assert self.compiled is not None
        return values.detach().clone() if self.compiled.graphs else values.detach()

    def _compiled_update(self, role: _Role, total: Tensor, active: Tensor, rates: Tensor) -> None:
        assert self.compiled is not None
        grads = torch.autograd.grad(total, list(role.params.values()))
        role.adam.step(dict(zip(role.params, grads)), rates, active, self.compiled.adam_step)

    def _collect(self, role: _Role, history: list[tuple[Tensor, list[bool]]], name: str) -> None:
        """Each lane's step losses in Training.run's order (step by step, member by member), as
        one tensor a lane: one gather for every lane (one index sent), then views."""
        if not history:
            return
        values = torch.stack([v for v, _ in history])  # (steps, members)
        active = np.array([a for _, a in history])
        members = len(role.individuals)
        rows, lanes, counts = [], [], []
        for lane, first in enumerate(role.first):
            end = role.first[lane + 1] if lane + 1 < len(role.first) else members
            steps, member = np.nonzero(active[:, first:end])  # row-major: step by step, member by member
            if len(steps):
                rows.append(steps * members + first + member)
                lanes.append(lane)
                counts.append(len(steps))
        if not rows:
            return
        taken = values.reshape(-1)[upload(torch.from_numpy(np.concatenate(rows)), self.device)]
        for lane, losses in zip(lanes, taken.split(counts)):
            setattr(self.steps[lane], name, losses)


def _on(device: torch.device, values: list, dtype: torch.dtype) -> Tensor:
    """Host values on the device without waiting for it: on a GPU a blocking copy per step would
    make the host wait for every queued kernel instead of running ahead."""
    return upload(values, device, dtype)


def _index(values: list[int], device: torch.device) -> Tensor:
    return _on(device, values, torch.long)


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
