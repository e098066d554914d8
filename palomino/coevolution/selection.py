"""Tournament selection and replacement over fitness values (lower is better), and the policies
that decide how much of the neighbourhood a cell lets in (migration, margin, replacement)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

import numpy as np

T = TypeVar("T")


def tournament_select(
    candidates: Sequence[T], fitness: Sequence[float], count: int, size: int, rng: np.random.Generator
) -> list[T]:
    """`count` winners, each the fittest of `size` candidates drawn without replacement."""
    if not candidates:
        raise ValueError("tournament selection needs at least one candidate")
    size = min(size, len(candidates))
    winners = []
    for _ in range(count):
        entrants = rng.choice(len(candidates), size=size, replace=False)
        winners.append(candidates[min(entrants, key=lambda i: (fitness[i], i))])
    return winners


def replace_worst(
    local: list[T], local_fitness: Sequence[float], new: list[T], new_fitness: Sequence[float], n: int
) -> list[T]:
    """The `n` worst of `local` replaced by the `n` best of `new`; result sorted best first."""
    order = sorted(range(len(local)), key=lambda i: local_fitness[i])
    best_new = sorted(range(len(new)), key=lambda i: new_fitness[i])[:n]
    kept = [(local_fitness[i], local[i]) for i in order[: len(local) - len(best_new)]]
    joined = kept + [(new_fitness[i], new[i]) for i in best_new]
    joined.sort(key=lambda pair: pair[0])
    return [item for _, item in joined]


def replace_if_fitter(
    local: list[T], local_fitness: Sequence[float], new: list[T], new_fitness: Sequence[float], n: int
) -> list[T]:
    """Lipizzaner's replacement: with `local` sorted best first, its (n−i)-th worst gives way to the
    i-th best of `new` (i < n; so the best trained one faces the n-th worst, as Lipizzaner pairs
    them) only where that one is strictly fitter; result sorted best first."""
    order = sorted(range(len(local)), key=lambda i: local_fitness[i])
    best_new = sorted(range(len(new)), key=lambda i: new_fitness[i])[:n]
    joined = [(local_fitness[i], local[i]) for i in order]
    for rank, candidate in enumerate(best_new):
        slot = len(joined) - len(best_new) + rank
        if slot >= 0 and new_fitness[candidate] < joined[slot][0]:
            joined[slot] = (new_fitness[candidate], new[candidate])
    joined.sort(key=lambda pair: pair[0])
    return [item for _, item in joined]


def generational(new: list[T], new_fitness: Sequence[float]) -> list[T]:
    """(μ,λ) replacement: the trained offspring replace the whole local population, best first.
    Unlike `replace_worst`, no local individual survives for being fit once (Toutouh & Casas 2025)."""
    order = sorted(range(len(new)), key=lambda i: new_fitness[i])
    return [new[i] for i in order]


def replace(
    local: list[T],
    local_fitness: Sequence[float],
    new: list[T],
    new_fitness: Sequence[float],
    n: int,
    policy: Literal["elitist", "generational", "if_fitter"],
) -> list[T]:
    """The next local population under `policy` (training.selection.replacement)."""
    if policy == "generational":
        return generational(new, new_fitness)
    if policy == "if_fitter":
        return replace_if_fitter(local, local_fitness, new, new_fitness, n)
    return replace_worst(local, local_fitness, new, new_fitness, n)


def neighbourhood_select(
    candidates: Sequence[T],
    fitness: Sequence[float],
    local: int,
    count: int,
    size: int,
    rng: np.random.Generator,
    *,
    migration: float = 1.0,
    margin: float = 0.0,
) -> list[T]:
    """Tournament winners over a neighbourhood whose first `local` candidates are the cell's own.

    - `migration`: the chance that neighbours enter the tournament at all this time (drawn
      only when below 1, so runs at the default keep their random stream);
    - `margin`: a neighbour's fitness counts `margin` worse, so a copy replaces the cell's own
      lineage only when clearly better, not marginally.
    """
    if migration < 1 and rng.random() >= migration:
        candidates, fitness = candidates[:local], fitness[:local]
    handicapped = [f + (margin if i >= local else 0.0) for i, f in enumerate(fitness)]
    return tournament_select(candidates, handicapped, count, size, rng)
