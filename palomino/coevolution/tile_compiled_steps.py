"""A lockstep's batches through the compiled functions (tile_compiled.py), under `compile`.

tile_training.py's eager steps decide on the host which members step, which loss each takes and
which buffers each call advances. Here those decisions reach the compiled functions as tensors
of one shape for the run, built once an iteration and sent in one copy each: the steps' masks,
the Mustangs' (losses, members) weight tables, the convolutional stacks' buffer tables
(tile_turns.py) and WGAN-GP's interpolation weights. A step returns both roles' buffers, copied
back here into the stacks, and Adam updates through its own compiled function.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from palomino.coevolution.tile_compiled import CompiledBatch
from palomino.coevolution.tile_lanes import Lane, Role, Tables
from palomino.coevolution.tile_turns import StepTurns, most_trained, step_turns
from palomino.nn.host import upload_all
from palomino.nn.stacked_buffers import Buffers


class CompiledSteps:
    """The generators' and the discriminators' step of one lockstep, compiled."""

    def __init__(
        self, batch: CompiledBatch, lanes: list[Lane], g: Role, d: Role, tables: Tables, rates: dict[str, Tensor]
    ) -> None:
        self.batch, self.g, self.d, self.tables, self.rates = batch, g, d, tables, rates
        self.device = tables.samples.device
        self.weights = self._loss_weights() if len(batch.losses) > 1 else None
        self.turns = self._buffer_turns(lanes) if g.buffers or d.buffers else None

    def generator_step(self, step: int) -> Tensor:
        tables = self.tables
        z, labels = tables.generator_inputs(step)
        params = self.d.frozen(tables.g_opponents[step], tables.on_device["g_opponent"][step], by_chance=False)
        turns = self.turns[step] if self.turns else None
        outputs = self.batch.generator_step(
            self.g.params,
            params,
            z,
            labels,
            None if self.weights is None else self.weights["g"][step],
            tables.active_on["g"][step],
            (self.g.buffers, self.d.buffers),
            (turns.g_own, turns.d_facing_g) if turns else (None, None),
        )
        return self._finish(self.g, "g", step, outputs)

    def discriminator_step(self, step: int) -> Tensor:
        tables = self.tables
        z, real, labels = tables.discriminator_inputs(step)
        params = self.g.frozen(tables.d_opponents[step], tables.on_device["d_opponent"][step], by_chance=False)
        turns = self.turns[step] if self.turns else None
        outputs = self.batch.discriminator_step(
            self.d.params,
            params,
            z,
            real,
            labels,
            None if self.weights is None else self.weights["d"][step],
            tables.active_on["d"][step],
            self._interpolations(step, real) if self.batch.penalised else None,
            (self.g.buffers, self.d.buffers),
            (turns.g_facing_d, turns.d_own, turns.d_penalised) if turns else (None, None, None),
        )
        return self._finish(self.d, "d", step, outputs)

    def _finish(self, role: Role, name: str, step: int, outputs: tuple[Tensor, Tensor, Buffers, Buffers]) -> Tensor:
        """After a compiled step of `role` ("g" or "d"): both roles' buffers copied back, its members'
        Adam update, and the losses it keeps."""
        values, total, g_buffers, d_buffers = outputs
        _copy_back(self.g.buffers, g_buffers)
        _copy_back(self.d.buffers, d_buffers)
        self._update(role, total, self.tables.active_on[name][step], self.rates[name][step])
        return self._kept(values)

    def _loss_weights(self) -> dict[str, Tensor]:
        """Members that draw different losses (Mustangs): each step's (losses, members) table of
        ones where a member's loss is, for both roles, sent in one copy."""
        tables, count = self.tables, len(self.batch.losses)
        out = {}
        for role, names in (("g", tables.g_losses), ("d", tables.d_losses)):
            table = np.zeros((tables.count, count, len(names[0]) if names else 0), np.float32)
            for step, row in enumerate(names):
                for member, loss in enumerate(self.batch.index(row)):
                    if loss >= 0:
                        table[step, loss, member] = 1.0
            out[role] = table
        dtype = self.g.params[self.g.layout.names[0]].dtype
        return {role: value.to(dtype) for role, value in upload_all(out, self.device).items()}

    def _buffer_turns(self, lanes: list[Lane]) -> list[StepTurns]:
        """Convolutional stacks: each step's buffer tables (tile_turns.py)."""
        tables = self.tables
        penalised = None
        if self.batch.penalised:
            gp = {loss.name for loss in self.batch.losses if loss.gp_weight}
            rows = [[name in gp for name in row] for row in tables.d_losses]
            penalised = np.array(rows, bool).reshape(tables.d_active.shape)
        return step_turns(
            tables.g_active,
            tables.d_active,
            tables.g_opponents,
            tables.d_opponents,
            (
                most_trained([len(lane.generators) for lane in lanes]),
                most_trained([len(lane.discriminators) for lane in lanes]),
            ),
            (bool(self.g.buffers), bool(self.d.buffers)),
            penalised,
            self.device,
        )

    def _interpolations(self, step: int, real: Tensor) -> Tensor:
        """Each member's interpolation weights for a penalised step, one shape for the run: zeros
        where no lane drew one this iteration (their penalty's weight is then zero too)."""
        if self.tables.eps is None:
            return real.new_zeros(real.shape[:2] + (1,) * (real.dim() - 2))
        return self.tables.eps[self.tables.on_device["d_eps"][step]].to(real)

    def _kept(self, values: Tensor) -> Tensor:
        """A step's losses, kept for the iteration's reports: a copy where a CUDA graph's next
        replay would overwrite its outputs."""
        return values.detach().clone() if self.batch.graphs else values.detach()

    def _update(self, role: Role, total: Tensor, active: Tensor, rates: Tensor) -> None:
        grads = torch.autograd.grad(total, list(role.params.values()))
        role.adam.step(dict(zip(role.params, grads)), rates, active, self.batch.adam_step)


def _copy_back(buffers: Buffers, stepped: Buffers) -> None:
    """A compiled step's buffers into the stack's own (which the members' rows view): one
    multi-tensor copy (a launch or two on a GPU, where one copy a buffer would be ~30 a batch)."""
    if stepped:
        torch._foreach_copy_([buffers[name] for name in stepped], list(stepped.values()))
