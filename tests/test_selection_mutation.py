"""Tournament selection, replacement and learning-rate mutation: exact cases and statistics."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from palomino.coevolution.mutation import mutate_learning_rates
from palomino.coevolution.selection import replace_worst, tournament_select

Z = 5.0  # statistical tolerance in standard errors: a false failure is ~1e-6 likely per check


# --- tournament selection -------------------------------------------------------------------


def test_tournament_of_the_whole_population_returns_the_global_best() -> None:
    rng = np.random.default_rng(0)
    for _trial in range(50):
        n = int(rng.integers(1, 12))
        fitness = rng.normal(size=n).tolist()
        names = [f"ind{i}" for i in range(n)]
        best = names[int(np.argmin(fitness))]
        winners = tournament_select(names, fitness, count=5, size=n, rng=rng)
        assert winners == [best] * 5


def test_tournament_larger_than_the_population_is_clamped() -> None:
    winners = tournament_select(["a", "b", "c"], [3.0, 1.0, 2.0], count=4, size=10, rng=np.random.default_rng(1))
    assert winners == ["b"] * 4


def test_tournament_of_one_is_uniform() -> None:
    rng = np.random.default_rng(2)
    n, draws = 4, 40_000
    winners = tournament_select(list(range(n)), [0.0, 1.0, 2.0, 3.0], count=draws, size=1, rng=rng)
    counts = np.bincount(winners, minlength=n)
    p = 1 / n
    assert np.all(np.abs(counts - draws * p) < Z * math.sqrt(draws * p * (1 - p))), counts


@pytest.mark.parametrize("size", [2, 3])
def test_tournament_winner_is_the_fittest_entrant(size: int) -> None:
    """Rank k (1 = best) wins iff it is drawn and every better one is not: P = C(n−k, s−1) / C(n, s).

    This pins down "fittest (lowest) of `size` entrants drawn without replacement": a tournament
    that picked the wrong entrant, drew with replacement or ignored fitness has other frequencies.
    """
    rng = np.random.default_rng(3)
    n, draws = 6, 60_000
    fitness = [0.5, -2.0, 3.0, 1.0, -1.0, 2.5]  # ranks: index 1, 4, 0, 3, 5, 2
    order = sorted(range(n), key=lambda i: fitness[i])
    winners = tournament_select(list(range(n)), fitness, count=draws, size=size, rng=rng)
    counts = np.bincount(winners, minlength=n)
    for rank, index in enumerate(order, start=1):
        p = math.comb(n - rank, size - 1) / math.comb(n, size)
        tolerance = Z * math.sqrt(draws * p * (1 - p)) + 1e-9
        assert abs(counts[index] - draws * p) <= tolerance, (rank, counts[index], draws * p)
    # The worst size−1 individuals can never win: some better entrant is always present.
    for index in order[n - size + 1 :]:
        assert counts[index] == 0


def test_better_individuals_are_selected_more_often() -> None:
    rng = np.random.default_rng(4)
    n, draws = 8, 50_000
    fitness = rng.permutation(n).astype(float).tolist()  # a random arrangement of ranks
    winners = tournament_select(list(range(n)), fitness, count=draws, size=2, rng=rng)
    counts = np.bincount(winners, minlength=n)
    by_fitness = [counts[i] for i in sorted(range(n), key=lambda i: fitness[i])]
    assert all(a > b for a, b in itertools.pairwise(by_fitness)), by_fitness


def test_tournament_is_reproducible_from_its_rng() -> None:
    args = (list("abcdefg"), [5.0, 3.0, 9.0, 1.0, 4.0, 8.0, 2.0])
    one = tournament_select(*args, count=20, size=2, rng=np.random.default_rng(9))
    two = tournament_select(*args, count=20, size=2, rng=np.random.default_rng(9))
    assert one == two


def test_tournament_needs_candidates() -> None:
    with pytest.raises(ValueError, match="at least one candidate"):
        tournament_select([], [], count=1, size=2, rng=np.random.default_rng(0))


# --- replacement -------------------------------------------------------------------------------


def test_replace_worst_replaces_the_worst_by_the_best_new() -> None:
    local, local_fitness = ["l3", "l1", "l2"], [3.0, 1.0, 2.0]
    new, new_fitness = ["n5", "n0", "n4"], [5.0, 0.5, 4.0]
    assert replace_worst(local, local_fitness, new, new_fitness, 1) == ["n0", "l1", "l2"]
    assert replace_worst(local, local_fitness, new, new_fitness, 2) == ["n0", "l1", "n4"]
    assert replace_worst(local, local_fitness, new, new_fitness, 3) == ["n0", "n4", "n5"]


def test_replace_worst_with_no_replacements_only_sorts() -> None:
    assert replace_worst(["b", "a", "c"], [2.0, 1.0, 3.0], ["x"], [0.0], 0) == ["a", "b", "c"]


def test_replace_worst_with_fewer_new_than_n() -> None:
    assert replace_worst(["a", "b", "c"], [1.0, 2.0, 3.0], ["x"], [2.5], 2) == ["a", "b", "x"]


def test_replace_worst_property() -> None:
    """Random cases: size kept, n worst gone, n best new in, result sorted by fitness."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        size = int(rng.integers(1, 7))
        n = int(rng.integers(0, size + 1))
        local_fitness = rng.normal(size=size).tolist()
        new_fitness = rng.normal(size=size).tolist()
        local = [("local", i) for i in range(size)]
        new = [("new", i) for i in range(size)]
        fitness = {
            **{("local", i): f for i, f in enumerate(local_fitness)},
            **{("new", i): f for i, f in enumerate(new_fitness)},
        }
        result = replace_worst(local, local_fitness, new, new_fitness, n)
        assert len(result) == size
        values = [fitness[item] for item in result]
        assert values == sorted(values)
        kept_local = sorted(range(size), key=lambda i: local_fitness[i])[: size - n]
        best_new = sorted(range(size), key=lambda i: new_fitness[i])[:n]
        assert set(result) == {("local", i) for i in kept_local} | {("new", i) for i in best_new}


# --- learning-rate mutation ----------------------------------------------------------------------


@pytest.mark.parametrize(("default", "alpha"), [(0.0002, 0.0001), (0.01, 0.5), (1.0, 1.0)])
def test_mutation_step_statistics(default: float, alpha: float) -> None:
    """Deltas are alpha·N(−default/10, default): check mean and std against their standard errors."""
    n = 40_000
    start = 10.0  # far from 0: no delta is clipped
    rates = mutate_learning_rates([start] * n, default, 1.0, alpha, np.random.default_rng(6))
    deltas = np.array(rates) - start
    assert np.all(deltas != 0)
    mean, std = alpha * (-default / 10), alpha * default
    assert abs(deltas.mean() - mean) < Z * std / math.sqrt(n), (deltas.mean(), mean)
    assert abs(deltas.std(ddof=1) - std) < Z * std / math.sqrt(2 * (n - 1)), (deltas.std(), std)
    assert deltas.mean() < 0  # the step is biased downwards


def test_mutation_probability_zero_changes_nothing() -> None:
    rates = list(np.random.default_rng(7).uniform(0, 1, size=1000))
    assert mutate_learning_rates(rates, 0.01, 0.0, 1.0, np.random.default_rng(8)) == rates


def test_mutation_alpha_zero_changes_nothing() -> None:
    rates = [0.1, 0.2, 0.3]
    assert mutate_learning_rates(rates, 0.01, 1.0, 0.0, np.random.default_rng(8)) == rates


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_mutation_probability_mutates_that_fraction(p: float) -> None:
    n = 40_000
    rates = mutate_learning_rates([1.0] * n, 0.01, p, 1.0, np.random.default_rng(9))
    fraction = np.mean(np.array(rates) != 1.0)
    assert abs(fraction - p) < Z * math.sqrt(p * (1 - p) / n), fraction


def test_mutation_is_independent_per_rate() -> None:
    rates = mutate_learning_rates([1.0] * 1000, 0.01, 1.0, 1.0, np.random.default_rng(10))
    assert len(set(rates)) == 1000


def test_mutation_never_goes_below_zero() -> None:
    n = 10_000
    rates = mutate_learning_rates([1e-6] * n, 0.01, 1.0, 1.0, np.random.default_rng(11))
    values = np.array(rates)
    assert np.all(values >= 0)
    assert np.any(values == 0)  # the clip did happen
    assert np.any(values > 1e-6)  # and upward steps survive


def test_mutation_keeps_the_length_and_empty_input() -> None:
    assert mutate_learning_rates([], 0.01, 1.0, 1.0, np.random.default_rng(0)) == []
    assert len(mutate_learning_rates([0.1] * 3, 0.01, 0.5, 1.0, np.random.default_rng(0))) == 3
