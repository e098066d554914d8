"""Adam over stacked parameters, with a learning rate and a step count per member.

Each member of a tile keeps its own rate (mutated before every step, scaled by the decay)
and its own step count (a clone from a neighbour arrives with its moments), so one
`torch.optim.Adam` cannot serve the stack; this is its update written once for all members,
the same arithmetic as torch's single-tensor Adam (weight decay 0, no amsgrad).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from palomino.nn.host import values
from palomino.nn.stacked import Params


class StackedAdam:
    def __init__(
        self, params: Params, optimizers: Sequence[torch.optim.Adam], betas: tuple[float, float], eps: float = 1e-8
    ) -> None:
        """`optimizers[m]` is member m's Adam: its moments and step count are stacked (zeros if it never stepped)."""
        self.params, self.betas, self.eps = params, betas, eps
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
        self.exp_avg: Params = {name: torch.stack(avg) for name, (avg, _) in moments.items()}
        self.exp_avg_sq: Params = {name: torch.stack(avg_sq) for name, (_, avg_sq) in moments.items()}
        device = next(iter(params.values())).device
        self.steps = torch.tensor(counts, dtype=torch.float64, device=device)

    @torch.no_grad()
    def step(self, grads: Params, learning_rates: Tensor, active: Tensor | None = None) -> None:
        """One update of every `active` member (all when None) with its own learning rate (M,)."""
        beta1, beta2 = self.betas
        steps = self.steps + (1.0 if active is None else active.to(self.steps.dtype))
        counted = steps.clamp(min=1.0)  # a member that never stepped and is inactive: no 0/0
        step_size = learning_rates.to(self.steps) / (1 - beta1**counted)
        correction2 = (1 - beta2**counted).sqrt()
        shaped: dict[tuple[torch.dtype, int], tuple[Tensor, ...]] = {}  # once a dtype and rank, not a tensor
        for name, param in self.params.items():
            key = (param.dtype, param.dim())
            if key not in shaped:
                shape = (-1,) + (1,) * (param.dim() - 1)
                masks = () if active is None else (active.view(shape), ~active.view(shape))
                shaped[key] = (correction2.to(param.dtype).view(shape), step_size.to(param.dtype).view(shape), *masks)
            correction, size, *masks = shaped[key]
            grad, exp_avg, exp_avg_sq = grads[name], self.exp_avg[name], self.exp_avg_sq[name]
            if active is not None:  # inactive members keep their moments: update copies, then choose
                exp_avg, exp_avg_sq = exp_avg.clone(), exp_avg_sq.clone()
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = exp_avg_sq.sqrt().div_(correction).add_(self.eps)
            update = exp_avg.mul(size).div_(denom)
            if not masks:
                param.sub_(update)
            else:
                keep, drop = masks
                self.exp_avg[name] = torch.where(keep, exp_avg, self.exp_avg[name])
                self.exp_avg_sq[name] = torch.where(keep, exp_avg_sq, self.exp_avg_sq[name])
                param.sub_(update.masked_fill_(drop, 0.0))
        self.steps = steps

    @torch.no_grad()
    def member_states(self, kept: Sequence[bool]) -> list[list[dict[str, Tensor]]]:
        """Each member's Adam state as torch keeps it, one dict a parameter: views of the stacked
        moments (no copy) and step counts on the host. A member that never stepped and whose
        source kept no state (`kept` false) gets none, as torch's Adam would not."""
        names = list(self.params)
        counts = values(self.steps)
        # One host tensor of every count, one 0-d view a member and parameter: torch's Adam
        # increments each parameter's step in place.
        steps = torch.tensor([c for c in counts for _ in names], dtype=torch.float32).unbind(0)
        avg = {name: value.unbind(0) for name, value in self.exp_avg.items()}
        avg_sq = {name: value.unbind(0) for name, value in self.exp_avg_sq.items()}
        out: list[list[dict[str, Tensor]]] = []
        for member, count in enumerate(counts):
            if count == 0 and not kept[member]:
                out.append([{} for _ in names])
                continue
            first = member * len(names)
            out.append(
                [
                    {"step": steps[first + i], "exp_avg": avg[name][member], "exp_avg_sq": avg_sq[name][member]}
                    for i, name in enumerate(names)
                ]
            )
        return out
