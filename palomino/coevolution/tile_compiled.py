"""A tile's training batch through torch.compile (config `compile`; tile_compiled_steps.py calls it).

Three compiled functions a stack, built once and kept between iterations: the generators' step
(their forward, the opponents' forward, the losses, the masked sum), the discriminators' step
(the opponents' samples, real and fake logits, the losses) and the stacked Adam update of every
member. Autograd's backward of the first two is compiled with them (AOTAutograd); the gradient
is taken between them, outside, because torch.compile does not trace `torch.autograd.grad`.

Nothing a batch decides on the host reaches a compiled function as a Python value, so no batch
recompiles after the first: which members step is a mask tensor (all true when everyone does),
and where a batch's members draw different losses (Mustangs) each member's loss is picked by a
(losses, members) weight table of ones and zeros. The eager path is tile_training.py's own, and
its numbers are unchanged; compiled ones agree with it to float rounding (tests/test_compile.py).

WGAN-GP's penalty differentiates the critic's input gradient: `torch.autograd.grad` with
`create_graph` does not trace, so the compiled step takes that gradient with `torch.func.grad`,
which does, and AOTAutograd differentiates the result. Where a batch mixes losses (Mustangs), every
member's penalty is computed and the weight table keeps the critics' on WGAN-GP: a fixed graph
costs the others' penalties (zero interpolations where no lane drew one this iteration).

`compile: graphs` compiles in torch.compile's "reduce-overhead" mode: on CUDA each step's kernels
are recorded once as a CUDA graph and replayed, one launch where eager makes hundreds. Adam's
update writes its inputs in place, which CUDA graph trees do not record, so it runs compiled
without a graph; a step's losses, kept for the reports, are copied before the next replay
overwrites them. On a CPU the mode compiles as `on` does (the config refuses it there).

The convolutional stacks' BatchNorm running statistics and spectral-norm vectors advance per member
in the one-by-one order; their eager bookkeeping cuts slots into rounds that change from batch to
batch, so a compiled step takes `BufferTurns` (stacked_buffers.py) instead: tables of one shape for
the run. A step takes both roles' buffers and returns them as it leaves them, and the tile copies
them back; nothing is written in place inside a compiled function.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from palomino.cache import cache_root
from palomino.nn import GanLoss
from palomino.nn.stack_layout import StackLayout
from palomino.nn.stacked import Params, StackedMLP, penalty_of
from palomino.nn.stacked_adam import masked_update
from palomino.nn.stacked_buffers import Buffers, BufferTurns, Turns

log = logging.getLogger(__name__)


def keep_compiled_code() -> None:
    """Inductor's compiled kernels in Palomino's cache folder, kept between runs (a run on
    the same networks then loads them instead of compiling again): set unless the user chose
    a folder (TORCHINDUCTOR_CACHE_DIR)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "torchinductor"))


def compilable(g_layout: StackLayout, d_layout: StackLayout, asked: bool) -> bool:
    """Whether a stack's networks take the compiled path: the perceptrons' wherever a tile
    compiles; the convolutional stacks' only where `compile` asks for it (`on`, `graphs`), not
    under `auto`, which has not timed them on a GPU."""
    return asked or (isinstance(g_layout, StackedMLP) and isinstance(d_layout, StackedMLP))


class CompiledBatch:
    """The compiled steps of one stack of perceptrons trained on `losses` (the run's losses, in a
    fixed order: a member's weight row picks its own)."""

    def __init__(
        self,
        g_layout: StackLayout,
        d_layout: StackLayout,
        losses: Sequence[GanLoss],
        strict: bool = True,
        graphs: bool = False,
    ) -> None:
        """`strict` false (`compile: auto`): a function that fails to compile runs eager, with a warning.
        `graphs` (`compile: graphs`): torch.compile's "reduce-overhead" mode, which records each step's
        kernels on CUDA as a graph and replays it, one launch (nothing changes elsewhere)."""
        keep_compiled_code()
        self.losses = list(losses)
        self.g_layout, self.d_layout = g_layout, d_layout
        self.graphs = graphs
        compile_ = _compiler(strict, "reduce-overhead" if graphs else None)
        self.generator_step = compile_(self._generator_values)
        self.penalised = any(loss.gp_weight for loss in self.losses)  # its D step takes interpolations
        self.discriminator_step = compile_(self._discriminator_values)
        self.adam_step = compile_(masked_update)

    def index(self, names: Sequence[str]) -> list[int]:
        """Each name's row in the weight tables ("": an inactive member, no row)."""
        order = [loss.name for loss in self.losses]
        return [order.index(name) if name else -1 for name in names]

    def _generator_values(
        self,
        g: Params,
        d: Params,
        z: Tensor,
        labels: Tensor | None,
        weights: Tensor | None,
        mask: Tensor,
        buffers: tuple[Buffers, Buffers],
        turns: tuple[Turns | None, Turns | None],
    ) -> tuple[Tensor, Tensor, Buffers, Buffers]:
        """The members' losses, their masked sum, and both roles' buffers as the step leaves them
        (`turns`: the generators' own and their opponents', None where a role keeps no buffers)."""
        g_use, d_use = _uses(buffers, turns)
        fake = self.g_layout.forward(g, z, labels, g_use)
        logits = self.d_layout.forward(d, fake, labels, d_use)
        values = _chosen([loss.generator(logits) for loss in self.losses], weights)
        return values, (values * mask).sum(), *_left(buffers, (g_use, d_use))

    def _discriminator_values(
        self,
        d: Params,
        g: Params,
        z: Tensor,
        real: Tensor,
        labels: Tensor | None,
        weights: Tensor | None,
        mask: Tensor,
        eps: Tensor | None,
        buffers: tuple[Buffers, Buffers],
        turns: tuple[Turns | None, Turns | None, Turns | None],
    ) -> tuple[Tensor, Tensor, Buffers, Buffers]:
        """As the generators' step; `turns`: the opponents', the critics' own (real then fake),
        and the penalised critics' (WGAN-GP's forward on the interpolations)."""
        g_use, d_use = _uses(buffers, turns[:2])
        with torch.no_grad():
            fake = self.g_layout.forward(g, z, labels, g_use)
        real_logits = self.d_layout.forward(d, real, labels, d_use)
        fake_logits = self.d_layout.forward(d, fake, labels, d_use)
        per_loss = [loss.discriminator_from_logits(real_logits, fake_logits) for loss in self.losses]
        if eps is not None:
            penalty = self._penalty(d, real, fake, eps, labels, d_use, turns[2])
            per_loss = [v + loss.gp_weight * penalty if loss.gp_weight else v for v, loss in zip(per_loss, self.losses)]
        values = _chosen(per_loss, weights)
        return values, (values * mask).sum(), *_left(buffers, (g_use, d_use))

    def _penalty(
        self,
        d: Params,
        real: Tensor,
        fake: Tensor,
        eps: Tensor,
        labels: Tensor | None,
        use: BufferTurns | None,
        turns: Turns | None,
    ) -> Tensor:
        """stacked_gradient_penalty per member, its input gradient taken by torch.func (which traces).
        A critic with buffers advances them on the interpolations (the penalised members' only): they
        come out of the transform as its auxiliary output, into `use`."""
        x_hat = eps * real + (1 - eps) * fake

        def critic(x: Tensor, buffers: Buffers) -> tuple[Tensor, Buffers]:
            inner = BufferTurns(buffers, turns) if turns is not None else None
            return self.d_layout.forward(d, x, labels, inner).sum(), inner.buffers if inner else {}

        gradient, buffers = torch.func.grad(critic, has_aux=True)(x_hat, use.buffers if use else {})
        if use is not None:
            use.buffers = buffers
        return penalty_of(gradient)


def _uses(buffers: tuple[Buffers, Buffers], turns: Sequence[Turns | None]) -> tuple[BufferTurns | None, ...]:
    """Each role's bookkeeping for a compiled step (None: the role's networks keep no buffers)."""
    return tuple(BufferTurns(b, t) if t is not None else None for b, t in zip(buffers, turns))


def _left(buffers: tuple[Buffers, Buffers], uses: tuple[BufferTurns | None, ...]) -> tuple[Buffers, Buffers]:
    """Each role's buffers after the step: its bookkeeping's, or as they came."""
    g, d = (use.buffers if use is not None else given for use, given in zip(uses, buffers))
    return g, d


def _chosen(per_loss: list[Tensor], weights: Tensor | None) -> Tensor:
    """Each member's value under its own loss: the only loss, or the weight table's pick."""
    if weights is None:
        return per_loss[0]
    return (torch.stack(per_loss) * weights).sum(0)


def _compiler(strict: bool, mode: str | None = None) -> Callable[[Callable], Callable]:
    """torch.compile as a tile uses it: one whole graph a function (a graph break is an error,
    not a silent slow path) and static shapes (a tile's shapes are fixed for the run). Not
    `strict`: a first call that fails (no C++ compiler, no Triton, an inductor bug) falls back to
    the eager function for the run; it fails before it computes anything, so nothing is lost."""

    def compile_(function: Callable) -> Callable:
        compiled = torch.compile(function, fullgraph=True, dynamic=False, mode=mode)
        if strict:
            return compiled
        chosen: list[Callable] = []  # set by the first call: compiled, or the function itself

        def call(*args: object) -> object:
            if chosen:
                return chosen[0](*args)
            try:
                out = compiled(*args)
            except Exception as error:  # noqa: BLE001 — any compiler failure: say so, train eager
                log.warning("compile: auto could not compile %s, which trains eager: %s", function.__name__, error)
                chosen.append(function)
                return function(*args)
            chosen.append(compiled)
            return out

        return call

    return compile_
