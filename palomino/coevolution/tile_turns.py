"""Every step's buffer tables for a compiled tile of convolutional stacks, sent in one copy.

A compiled step advances BatchNorm's running statistics and spectral norm's vectors from
`Turns` tables (palomino/nn/stacked_buffers.py) of one shape for the run. A step makes up to
five stacked calls that advance buffers, each with its own tables: the generators' own forward
and their opponents' (the G step); the opponents' forward, the critics' own (real, then fake)
and, under WGAN-GP, the critics' forward on the interpolations (the D step). A call's rounds
are the most slots one member can take in it: one for a role's own call, and for opponents the
most members one lane trains (each picks its opponent in its lane).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from palomino.nn.host import upload_all
from palomino.nn.stacked_buffers import Turns, turn_tables


@dataclass(frozen=True)
class StepTurns:
    """One step's tables for each call that advances buffers (None: that role keeps none, or no
    loss has a penalty)."""

    g_own: Turns | None = None
    d_facing_g: Turns | None = None
    g_facing_d: Turns | None = None
    d_own: Turns | None = None
    d_penalised: Turns | None = None


@dataclass(frozen=True)
class _Call:
    name: str
    opponents: list[list[int]] | None  # each step's member of every slot (None: slot s is member s)
    active: np.ndarray  # (steps, slots)
    members: int
    rounds: int


def step_turns(
    g_active: np.ndarray,
    d_active: np.ndarray,
    g_opponents: list[list[int]],
    d_opponents: list[list[int]],
    trained_per_lane: tuple[int, int],
    buffered: tuple[bool, bool],
    penalised: np.ndarray | None,
    device: torch.device,
) -> list[StepTurns]:
    """`g_active`/`d_active` (steps, members) and each step's opponents as the tile's tables hold
    them; `trained_per_lane`: the most generators and discriminators one lane trains; `buffered`:
    which roles' networks keep buffers; `penalised` (steps, critics): the active critics whose
    loss has a gradient penalty (None: no loss has one)."""
    (g_count, d_count), (g_rounds, d_rounds) = (g_active.shape[1], d_active.shape[1]), trained_per_lane
    calls = []
    if buffered[0]:
        calls += [
            _Call("g_own", None, g_active, g_count, 1),
            _Call("g_facing_d", d_opponents, d_active, g_count, d_rounds),
        ]
    if buffered[1]:
        calls += [
            _Call("d_facing_g", g_opponents, g_active, d_count, g_rounds),
            _Call("d_own", None, d_active, d_count, 1),
        ]
        if penalised is not None:
            calls.append(_Call("d_penalised", None, penalised, d_count, 1))
    arrays: dict[str, np.ndarray] = {}
    for call in calls:
        per_step = [
            turn_tables(None if call.opponents is None else call.opponents[step], active, call.members, call.rounds)
            for step, active in enumerate(call.active)
        ]
        for part, values in zip(Turns._fields, zip(*per_step)):
            arrays[f"{call.name}.{part}"] = np.stack(values)
    on_device = upload_all(arrays, device) if arrays else {}
    return [
        StepTurns(
            **{call.name: Turns(*(on_device[f"{call.name}.{part}"][step] for part in Turns._fields)) for call in calls}
        )
        for step in range(len(g_active))
    ]


def most_trained(members_per_lane: Sequence[int]) -> int:
    """The most members one lane trains (at least one: a call's tables keep one round)."""
    return max([1, *members_per_lane])
