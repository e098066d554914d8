"""Adam over stacked parameters, with a learning rate and a step count per member.

Each member of a tile keeps its own rate (mutated before every step, scaled by the decay)
and its own step count (a clone from a neighbour arrives with its moments), so one
`torch.optim.Adam` cannot serve the stack; this is its update written once for all members,
the same arithmetic as torch's single-tensor Adam (weight decay 0, no amsgrad).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from palomino.nn.host import upload
from palomino.nn.stacked import Params


class StackedAdam:
    """The members' parameters, moments and gradients each side by side in one (M, N) tensor, so a
    step is a dozen ops for the whole network, not a dozen a tensor: `params`' tensors are made
    views of `flat` (their objects, and so the forward's and autograd's leaves, stay the same)."""

    def __init__(
        self, params: Params, optimizers: Sequence[torch.optim.Adam], betas: tuple[float, float], eps: float = 1e-8
    ) -> None:
        """`optimizers[m]` is member m's Adam: its moments and step count are stacked (zeros if it never stepped)."""
        if len({p.dtype for p in params.values()}) != 1:
            raise ValueError("a stacked Adam needs every parameter in one dtype")
        self.params, self.betas, self.eps = params, betas, eps
        self.sizes = [p[0].numel() for p in params.values()]
        with torch.no_grad():
            self.flat = torch.cat([p.detach().flatten(1) for p in params.values()], dim=1)
            for param, view in zip(params.values(), self._views(self.flat)):
                param.data = view
        moments: dict[str, tuple[list[Tensor], list[Tensor]]] = {name: ([], []) for name in params}
        counts = []
        for member, optimizer in enumerate(optimizers):
            state: dict = {}
            for (name, (avg, avg_sq)), parameter in zip(moments.items(), optimizer.param_groups[0]["params"]):
                state = optimizer.state.get(parameter, {})
                if "exp_avg" in state:
                    avg.append(state["exp_avg"])
                    avg_sq.append(state["exp_avg_sq"])
                else:  # never stepped: zero moments (made only here, not for every member)
                    zeros = torch.zeros_like(params[name][member], requires_grad=False)
                    avg.append(zeros)
                    avg_sq.append(zeros)
            # One count a member: torch's Adam keeps the same one for each of its tensors (the last read).
            counts.append(float(state["step"]) if "step" in state else 0.0)
        self.exp_avg = self._flat([torch.stack(avg) for avg, _ in moments.values()])
        self.exp_avg_sq = self._flat([torch.stack(avg_sq) for _, avg_sq in moments.values()])
        self.counts = counts  # on the host too: the steps a member takes are the host's decision
        self.steps = upload(counts, self.flat.device, torch.float64)

    def _views(self, flat: Tensor) -> list[Tensor]:
        """Each parameter's part of a flat (M, N) tensor, in its own shape (views)."""
        return [part.view(p.shape) for part, p in zip(flat.split(self.sizes, dim=1), self.params.values())]

    @staticmethod
    def _flat(tensors: list[Tensor]) -> Tensor:
        return torch.cat([t.flatten(1) for t in tensors], dim=1)

    @torch.no_grad()
    def step(
        self,
        grads: Params,
        learning_rates: Tensor,
        active: Tensor | None = None,
        update: Callable[..., Tensor] | None = None,
    ) -> None:
        """One update of every `active` member (all when None) with its own learning rate (M,).
        With a mask the update is `update` (`masked_update`, or a compiled form of it: a tile
        under `compile` passes one, and a mask even where every member steps)."""
        if active is not None:
            grad = [grads[name] for name in self.params]
            args = (self.flat, self.exp_avg, self.exp_avg_sq, self.steps, grad, learning_rates, active)
            self.steps = (update or masked_update)(*args, self.betas, self.eps)
            return
        beta1, beta2 = self.betas
        steps = self.steps + 1.0
        dtype = self.flat.dtype
        size = (learning_rates.to(self.steps) / (1 - beta1**steps)).to(dtype)[:, None]
        correction = (1 - beta2**steps).sqrt().to(dtype)[:, None]
        grad = self._flat([grads[name] for name in self.params])
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = self.exp_avg_sq.sqrt().div_(correction).add_(self.eps)
        self.flat.sub_(self.exp_avg.mul(size).div_(denom))
        self.steps = steps

    @torch.no_grad()
    def member_states(self, kept: Sequence[bool], taken: Sequence[int]) -> list[list[dict[str, Tensor]]]:
        """Each member's Adam state as torch keeps it, one dict a parameter: views of the stacked
        moments (no copy) and step counts on the host, counted there (`taken`: the steps each
        member took since the stack was made; no read back). A member that never stepped and
        whose source kept no state (`kept` false) gets none, as torch's Adam would not."""
        names = list(self.params)
        counts = [count + steps for count, steps in zip(self.counts, taken)]
        # One host tensor of every count, one 0-d view a member and parameter: torch's Adam
        # increments each parameter's step in place.
        steps = torch.tensor([c for c in counts for _ in names], dtype=torch.float32).unbind(0)
        avg = [value.unbind(0) for value in self._views(self.exp_avg)]
        avg_sq = [value.unbind(0) for value in self._views(self.exp_avg_sq)]
        out: list[list[dict[str, Tensor]]] = []
        for member, count in enumerate(counts):
            if count == 0 and not kept[member]:
                out.append([{} for _ in names])
                continue
            first = member * len(names)
            out.append(
                [
                    {"step": steps[first + i], "exp_avg": avg[i][member], "exp_avg_sq": avg_sq[i][member]}
                    for i in range(len(names))
                ]
            )
        return out


def masked_update(
    flat: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    steps: Tensor,
    grads: list[Tensor],
    rates: Tensor,
    active: Tensor,
    betas: tuple[float, float],
    eps: float,
) -> Tensor:
    """Adam's update for the members where `active` (M,) holds, in place on the stacked weights
    `flat` and moments (inactive members keep theirs); returns the new step counts. Pure tensor
    arithmetic, so that tile_compiled.py compiles this same function."""
    beta1, beta2 = betas
    steps = steps + active.to(steps.dtype)
    counted = steps.clamp(min=1.0)  # a member that never stepped and is inactive: no 0/0
    size = (rates.to(steps) / (1 - beta1**counted)).to(flat.dtype)[:, None]
    correction = (1 - beta2**counted).sqrt().to(flat.dtype)[:, None]
    grad = torch.cat([g.flatten(1) for g in grads], dim=1)
    avg = exp_avg.lerp(grad, 1 - beta1)
    avg_sq = exp_avg_sq.mul(beta2).addcmul(grad, grad, value=1 - beta2)
    update = avg.mul(size).div(avg_sq.sqrt().div(correction).add(eps))
    keep = active[:, None]
    exp_avg.copy_(torch.where(keep, avg, exp_avg))
    exp_avg_sq.copy_(torch.where(keep, avg_sq, exp_avg_sq))
    flat.sub_(update.masked_fill(~keep, 0.0))
    return steps
