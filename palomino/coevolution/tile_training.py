"""One iteration's gradient steps for many cells at once: the tile's lockstep form of Training.run.

Every cell (a lane) takes the same steps as in `Training.run`, in the same order, with the
same draws from its own random streams: its batch, its loss (Mustangs), each individual's
mutated rate and opponent, its noise and its penalty's interpolation. Only the arithmetic is
shared: per batch, one stacked forward/backward and one stacked Adam update for all the
lanes' generators, then the same for their discriminators. So a tiled run is the untiled
run, to float tolerance (tests/test_tiles.py), and a lane's draws never depend on the others.

The lanes' stacks and per-step tables are tile_lanes.py's; under `compile` the steps go through
tile_compiled_steps.py instead of the eager ones here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from palomino.coevolution.schedule import decay_factor
from palomino.coevolution.tile_compiled_steps import CompiledSteps
from palomino.coevolution.tile_data import TileData
from palomino.coevolution.tile_lanes import Lane, Role, Tables
from palomino.coevolution.training import Steps
from palomino.nn import GanLoss, get_loss
from palomino.nn.host import upload, upload_all
from palomino.nn.precision import matmul_precision
from palomino.nn.stacked import gather, stacked_gradient_penalty


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


class _Lockstep:
    """Lanes with one batch size, stepped together on their plans."""

    def __init__(self, lanes: list[Lane], data: TileData) -> None:
        self.config = lanes[0].training.config
        self.lanes = lanes
        self.g = Role.of([[*lane.generators, *lane.frozen_generators] for lane in lanes])
        self.d = Role.of([[*lane.discriminators, *lane.frozen_discriminators] for lane in lanes])
        self.scales = [decay_factor(self.config.decay, lane.iteration / self.config.iterations) for lane in lanes]
        self.plans = [
            lane.training.plan(
                lane.generators, lane.discriminators, (len(lane.frozen_generators), len(lane.frozen_discriminators))
            )
            for lane in lanes
        ]
        self.steps = [Steps(losses_used=Counter(plan.losses_used)) for plan in self.plans]
        self.device = self.g.params[self.g.layout.names[0]].device
        self.tables = Tables(lanes, self.plans, self.g, self.d, data.of(lanes))
        # Each step's rates × its lane's decay, for every member, in one copy.
        scaled = {
            role: self.tables.rates[role] * np.array([self.scales[lane] for lane in members.lane_of])
            for role, members in (("g", self.g), ("d", self.d))
        }
        self.rates = upload_all(scaled, self.device)
        batch = data.compiled_batch(lanes[0].batch_size, self.g, self.d, self.config.losses)
        self.compiled = None if batch is None else CompiledSteps(batch, lanes, self.g, self.d, self.tables, self.rates)
        self.g_losses: list[tuple[Tensor, list[bool]]] = []
        self.d_losses: list[tuple[Tensor, list[bool]]] = []

    def run(self) -> list[Steps]:
        tables = self.tables
        graphs = self.compiled is not None and self.compiled.batch.graphs
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

    def _generator_step(self, step: int, active: list[bool]) -> Tensor:
        if self.compiled is not None:
            return self.compiled.generator_step(step)
        tables, index = self.tables, self.tables.on_device
        z, labels = tables.generator_inputs(step)
        opponents = tables.g_opponents[step]
        fake = self.g.layout.forward(self.g.params, z, labels, self.g.use(None, active))
        params = self.d.frozen(opponents, index["g_opponent"][step])
        logits = self.d.layout.forward(params, fake, labels, self.d.use(opponents, active))
        losses = tables.g_losses[step]
        values = _per_member(losses, lambda loss, rows, _: loss.generator(_rows(logits, rows)), self.device)
        self._update(self.g, values, active, tables.active_on["g"][step], self.rates["g"][step])
        return values.detach()

    def _discriminator_step(self, step: int, active: list[bool]) -> Tensor:
        if self.compiled is not None:
            return self.compiled.discriminator_step(step)
        tables, index = self.tables, self.tables.on_device
        z, real, labels = tables.discriminator_inputs(step)
        opponents = tables.d_opponents[step]
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

    def _update(self, role: Role, values: Tensor, active: list[bool], on_device: Tensor, rates: Tensor) -> None:
        everyone = all(active)
        mask = None if everyone else on_device
        total = values.sum() if everyone else (values * mask).sum()
        grads = torch.autograd.grad(total, list(role.params.values()))
        role.adam.step(dict(zip(role.params, grads)), rates, mask)

    def _collect(self, role: Role, history: list[tuple[Tensor, list[bool]]], name: str) -> None:
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
