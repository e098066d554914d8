"""Sampling through the grid's discriminators: keep what they find as real as real data.

A generator maps a connected latent space continuously, so between two modes it leaves samples
on the bridge (about 15 % on the ring of 8). Its discriminators have learnt where the data is
not: discriminator rejection sampling (Azadi et al., ICLR 2019) discards a generated sample whose
logit is low. Here the test is calibrated on real data, so it is one interpretable number: with
`quantile` q, a generated sample is kept when the mean logit of the critics is at least that of
the q-quantile of real samples — the critics would themselves reject a share q of the real data.
The grid has many discriminators; their mean is a steadier judge than any one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from palomino.nn.host import to_host

MAX_ROUNDS = 20  # draws of candidates per request before the best rejected ones fill the rest


@dataclass
class CriticFilter:
    critics: Sequence[nn.Module]
    threshold: float  # on the critics' mean logit

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The critics' mean logit per sample (higher: more real)."""
        values = []
        for critic in self.critics:
            critic.eval()
            device = next(critic.parameters()).device
            values.append(to_host(critic(x.to(device)).reshape(len(x), -1).mean(1).float()))
        return torch.stack(values).mean(0)

    @classmethod
    def calibrate(cls, critics: Sequence[nn.Module], real: torch.Tensor, quantile: float) -> CriticFilter:
        """The filter that would reject a share `quantile` of `real`."""
        probe = cls(critics, float("-inf"))
        return cls(critics, float(torch.quantile(probe.logits(real).double(), quantile)))

    @torch.no_grad()
    def draw(self, generate: Callable[[int], torch.Tensor], n: int) -> torch.Tensor:
        """n generated samples that pass. `generate(k)` gives k fresh candidates; after MAX_ROUNDS
        rounds (a generator its critics almost never believe) the highest-scoring rejected
        candidates fill what is missing, so a request is always answered."""
        kept: list[torch.Tensor] = []
        rejected: list[tuple[torch.Tensor, torch.Tensor]] = []
        have, ask = 0, n
        for _ in range(MAX_ROUNDS):
            candidates = generate(ask)
            scores = self.logits(candidates)
            passed = scores >= self.threshold
            kept.append(candidates[passed.to(candidates.device)])
            rejected.append((candidates[~passed.to(candidates.device)], scores[~passed]))
            have += int(passed.sum())
            if have >= n:
                return torch.cat(kept)[:n]
            rate = max(float(passed.float().mean()), 0.05)
            ask = min(int((n - have) / rate * 1.2) + 1, 20 * n)
        rest = torch.cat([c for c, _ in rejected])
        order = torch.cat([s for _, s in rejected]).argsort(descending=True)
        return torch.cat([*kept, rest[order[: n - have].to(rest.device)]])
