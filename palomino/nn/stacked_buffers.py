"""Which member's buffers each slot of a stacked convolutional call advances (stacked_conv.py).

A DCGAN's BatchNorm running statistics and an SNGAN's power-iteration vectors (u, v) change on
every training-mode forward. A stack runs slots, not members: a slot may repeat a member (two
generators facing one critic) or be inactive (a lane done with its batches, a skipped step).
Each member advances once per active slot that runs it, slot after slot, as the cells do one
by one. Two forms compute those updates:

- `BufferUse` (eager): cuts the slots into rounds in which every member appears at most once
  and writes each round into the member's buffers in place. Its rounds come from host lists,
  so their number and sizes change from batch to batch.
- `BufferTurns` (compiled, tile_compiled.py): the same updates from tables of one shape for the
  run, so a compiled step never recompiles. `turn[s]` is which of its member's turns slot s takes
  (−1: inactive); `order[r, p]` is the slot of member p's r-th turn (−1: none), with a fixed
  number of rounds (the most slots one member can have in the tile). It writes nothing: it
  replaces the entries of its own `buffers` dict, which the compiled step returns and the tile
  copies back. Each entry gets the same arithmetic as in the eager form, so the two agree to
  float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from palomino.nn.host import upload

Buffers = dict[str, Tensor]


class BufferUse:
    """The eager form: rounds of (slots, members) index tensors, built from host lists.

    `members[s]` is the member that slot s runs (None: slot s is member s)."""

    def __init__(self, buffers: Buffers, members: Sequence[int] | None, active: Sequence[bool]) -> None:
        self.buffers = buffers
        slots = len(active)
        members = list(range(slots)) if members is None else list(members)
        device = next(iter(buffers.values())).device if buffers else torch.device("cpu")
        self.members = upload(members, device, torch.long)
        seen: dict[int, int] = {}
        rounds: list[tuple[list[int], list[int]]] = []
        for slot, (member, on) in enumerate(zip(members, active)):
            if not on:
                continue
            turn = seen.get(member, 0)
            seen[member] = turn + 1
            if turn == len(rounds):
                rounds.append(([], []))
            rounds[turn][0].append(slot)
            rounds[turn][1].append(member)
        self.rounds = [(upload(s, device, torch.long), upload(m, device, torch.long)) for s, m in rounds]

    def iterate(self, u: str, v: str, matrix: Tensor, iterations: int, eps: float) -> tuple[Tensor, Tensor]:
        """Each slot's (u, v) after the power iterations its forward takes on `matrix` (slots, out, in);
        the members' u and v left as after their last slot."""
        u_all, v_all = self.buffers[u], self.buffers[v]
        slot_u, slot_v = u_all[self.members], v_all[self.members]
        for slots, members in self.rounds:
            mu, mv = _power_iteration(u_all[members], v_all[members], matrix[slots], iterations, eps)
            u_all[members], v_all[members] = mu, mv
            slot_u[slots], slot_v[slots] = mu, mv
        return slot_u, slot_v

    def track(self, prefix: str, mean: Tensor, var: Tensor, momentum: float) -> None:
        """Each active slot's batch statistics (slots, channels) moved into its member's running ones."""
        running_mean = self.buffers[prefix + "running_mean"]
        running_var = self.buffers[prefix + "running_var"]
        count = self.buffers[prefix + "num_batches_tracked"]
        for slot, member in self.rounds:
            running_mean[member] = _moved(running_mean[member], mean[slot], momentum)
            running_var[member] = _moved(running_var[member], var[slot], momentum)
            count[member] += 1


class Turns(NamedTuple):
    """A stacked call's buffer tables, on the device: members (slots,), turn (slots,), order (rounds, members)."""

    members: Tensor
    turn: Tensor
    order: Tensor


def turn_tables(
    members: Sequence[int] | None, active: Sequence[bool], member_count: int, rounds: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The host's tables for one call (see `Turns`): `rounds` must cover the most active slots of one member."""
    slots = len(active)
    chosen = np.arange(slots) if members is None else np.asarray(members, np.int64)
    turn = np.full(slots, -1, np.int64)
    order = np.full((rounds, member_count), -1, np.int64)
    taken = np.zeros(member_count, np.int64)
    for slot in np.flatnonzero(np.asarray(active, bool)):
        member = chosen[slot]
        if taken[member] >= rounds:
            raise ValueError(f"member {member} runs in more than {rounds} slots of one call")
        turn[slot], order[taken[member], member] = taken[member], slot
        taken[member] += 1
    return chosen.astype(np.int64), turn, order


class BufferTurns:
    """The compiled form: the same updates from `Turns`, whose shapes do not change between batches."""

    def __init__(self, buffers: Buffers, turns: Turns) -> None:
        self.buffers = dict(buffers)  # its own dict: entries are replaced, never written in place
        self.members, self.turn, self.order = turns

    def iterate(self, u: str, v: str, matrix: Tensor, iterations: int, eps: float) -> tuple[Tensor, Tensor]:
        u_all, v_all = self.buffers[u], self.buffers[v]
        slot_u, slot_v = u_all[self.members], v_all[self.members]
        # A slot's r-th round starts where its member's previous slot left u and v; a slot of
        # the same member has the same weights, so slot s repeats the rounds up to its own turn.
        for r in range(len(self.order)):
            mu, mv = _power_iteration(slot_u, slot_v, matrix, iterations, eps)
            taken = (self.turn >= r).unsqueeze(1)
            slot_u, slot_v = torch.where(taken, mu, slot_u), torch.where(taken, mv, slot_v)
        self.buffers[u], self.buffers[v] = self._last(u_all, slot_u), self._last(v_all, slot_v)
        return slot_u, slot_v

    def track(self, prefix: str, mean: Tensor, var: Tensor, momentum: float) -> None:
        names = [prefix + "running_mean", prefix + "running_var", prefix + "num_batches_tracked"]
        running_mean, running_var, count = (self.buffers[name] for name in names)
        for slots in self.order:
            taken, slot = (slots >= 0).unsqueeze(1), slots.clamp(min=0)
            running_mean = torch.where(taken, _moved(running_mean, mean[slot], momentum), running_mean)
            running_var = torch.where(taken, _moved(running_var, var[slot], momentum), running_var)
        count = count + (self.order >= 0).sum(0).to(count.dtype)
        self.buffers.update(zip(names, (running_mean, running_var, count)))

    def _last(self, stored: Tensor, per_slot: Tensor) -> Tensor:
        """Each member's value after its last slot (its stored one where no slot ran it)."""
        out = stored
        for slots in self.order:
            out = torch.where((slots >= 0).unsqueeze(1), per_slot[slots.clamp(min=0)], out)
        return out


def _power_iteration(u: Tensor, v: Tensor, matrix: Tensor, iterations: int, eps: float) -> tuple[Tensor, Tensor]:
    """torch's spectral_norm power iteration, batched over slots (u is recomputed from v first)."""
    for _ in range(iterations):
        u = F.normalize(torch.bmm(matrix, v.unsqueeze(2)).squeeze(2), dim=1, eps=eps)
        v = F.normalize(torch.bmm(matrix.transpose(1, 2), u.unsqueeze(2)).squeeze(2), dim=1, eps=eps)
    return u, v


def _moved(running: Tensor, batch: Tensor, momentum: float) -> Tensor:
    """BatchNorm's running update: (1 − momentum)·running + momentum·batch, as nn.BatchNorm2d."""
    return running * (1 - momentum) + batch * momentum
