"""Tournament selection and replacement over fitness values (lower is better)."""

from __future__ import annotations

from typing import Sequence, TypeVar

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


def replace_worst(local: list[T], local_fitness: Sequence[float], new: list[T], new_fitness: Sequence[float], n: int) -> list[T]:
    """The `n` worst of `local` replaced by the `n` best of `new`; result sorted best first."""
    order = sorted(range(len(local)), key=lambda i: local_fitness[i])
    best_new = sorted(range(len(new)), key=lambda i: new_fitness[i])[:n]
    kept = [(local_fitness[i], local[i]) for i in order[: len(local) - len(best_new)]]
    joined = kept + [(new_fitness[i], new[i]) for i in best_new]
    joined.sort(key=lambda pair: pair[0])
    return [item for _, item in joined]
