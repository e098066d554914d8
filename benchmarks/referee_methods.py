"""What the referee (benchmarks/quality.py) trains beside the grid: the grid's runs and their
ablations, the plain GAN, N independent GANs (on all the data, or each on its cell's region), and
how their samples are drawn and filtered as the grid's are."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from referee_cases import THREADS
from referee_scoring import draw

from palomino.baselines import Budget, train_independent
from palomino.config import ExperimentConfig
from palomino.data import Dataset
from palomino.engine.embedded import train_embedded
from palomino.runs.directory import RunDirectory, read_jsonl
from palomino.runs.filter_rule import FilterRule
from palomino.runs.mixture import Mixture
from palomino.scoring.extractors import ensemble_features


def train_baselines(
    config: ExperimentConfig, datasets: list[Dataset], budget: Budget, seeds: list[int], device: str
) -> tuple[list[torch.nn.Module], list[torch.nn.Module], float]:
    """(generators, discriminators, seconds): plain GANs trained side by side as one stack
    (palomino.baselines), back on the CPU to be scored; GAN i on datasets[i] from seeds[i]."""
    start = time.perf_counter()
    trained = train_independent(config, datasets, budget, seeds, device)
    seconds = time.perf_counter() - start
    return [g.cpu() for g, _ in trained], [d.cpu() for _, d in trained], seconds


def run_grid(config: ExperimentConfig, train: Dataset, out: Path) -> tuple[RunDirectory, float]:
    torch.set_num_threads(THREADS)
    run = RunDirectory.create(out, config)
    start = time.perf_counter()
    features = ensemble_features(config, train.kind, config.device)
    outcome = asyncio.run(train_embedded(config, run, train, ensemble_features=features))
    if not outcome.finished:
        raise RuntimeError(f"{run.path}: training did not finish")
    return run, time.perf_counter() - start


def grid_steps(run: RunDirectory) -> tuple[int, int, int]:
    """(generator steps, discriminator steps, cells) summed over metrics.jsonl."""
    records = list(read_jsonl(run.path / "metrics.jsonl"))
    g = sum(r["steps"]["generator"] for r in records)
    d = sum(r["steps"]["discriminator"] for r in records)
    return g, d, len({tuple(r["cell"]) for r in records})


def own_generator(run: RunDirectory, cell: str) -> torch.nn.Module:
    mixture = Mixture.load(run.result_dir / "cells" / cell)
    return mixture.generators[mixture.components.index(cell)]


def plain_setting(config: ExperimentConfig, total: Budget, scale: int) -> tuple[ExperimentConfig, Budget, str]:
    """(config, budget, row name) of the plain GAN: the grid's total steps in sequence, or with
    `scale` S > 1 batches S times larger and S times fewer steps (the same samples seen)."""
    if scale == 1:
        return config, total, "plain"
    training = config.training.model_copy(update={"batch_size": config.training.batch_size * scale})
    budget = Budget(max(1, total.generator // scale), max(1, total.discriminator // scale))
    return config.model_copy(update={"training": training}), budget, f"plain-batch×{scale}"


def searched_weights(
    config: ExperimentConfig, train: Dataset, generators: list[torch.nn.Module], critics: list[torch.nn.Module]
) -> np.ndarray:
    """Mixture weights for independent GANs on the regions found as the grid's result finds its
    own (palomino.runs.grid_ensemble: forward selection, then a (1+1)-ES, on the same score and
    features): what the grid's lead over data-share weights owes to that search."""
    from palomino.grid import Topology
    from palomino.runs.grid_ensemble import grid_ensemble

    cells = [str(c) for c in Topology(config.grid.rows, config.grid.cols).cells()]
    features = ensemble_features(config, train.kind, "cpu")
    return grid_ensemble(generators, cells, train, config, "cpu", critics, features=features).ensemble.weights


def without_neighbours(config: ExperimentConfig) -> ExperimentConfig:
    """The grid without communication: grid.neighbourhood none, each cell alone with the same policies."""
    return config.model_copy(update={"grid": config.grid.model_copy(update={"neighbourhood": "none"})})


def communicates(config: ExperimentConfig) -> bool:
    return config.grid.neighbourhood != "none"


def without_selection(config: ExperimentConfig) -> ExperimentConfig:
    """The grid without selection: tournaments of one (a random candidate, no fitness pressure) and
    generational replacement (the trained offspring replace their parents whatever their fitness);
    the neighbourhood, migration and every other policy as they are."""
    training = config.training
    selection = training.selection.model_copy(update={"replacement": "generational"})
    return config.model_copy(
        update={"training": training.model_copy(update={"tournament_size": 1, "selection": selection})}
    )


def selects(config: ExperimentConfig) -> bool:
    """Whether fitness chooses anything in the grid: not under generational replacement with
    tournaments of one, or with one candidate each (one individual a cell, no migrants: the regions
    cases), where the grid already is its no-selection ablation."""
    training = config.training
    one_candidate = training.population_size == 1 and training.selection.migration == 0
    return training.selection.replacement != "generational" or not (training.tournament_size == 1 or one_candidate)


def without_mutation(config: ExperimentConfig) -> ExperimentConfig:
    """The grid without its cells' own policies: no learning-rate mutation and one loss, the first
    (the baselines' loss); the neighbourhood, selection and every other setting as they are."""
    training = config.training
    mutation = training.mutation.model_copy(update={"probability": 0.0})
    return config.model_copy(
        update={"training": training.model_copy(update={"mutation": mutation, "losses": training.losses[:1]})}
    )


def mutates(config: ExperimentConfig) -> bool:
    """Whether the cells do anything of their own beyond a plain GAN's step: mutate their rates
    (a chance and a step above 0) or draw among several losses."""
    mutation = config.training.mutation
    return (mutation.probability > 0 and mutation.alpha > 0) or len(config.training.losses) > 1


# --ablations: each name's run directory, the config with it taken out, and whether the grid has
# any of it (if not, the grid's own run is the row).
ABLATIONS: dict[str, tuple[str, Callable[[ExperimentConfig], ExperimentConfig], Callable[[ExperimentConfig], bool]]] = {
    "grid-alone": ("alone", without_neighbours, communicates),
    "grid-no-selection": ("no-selection", without_selection, selects),
    "grid-no-mutation": ("no-mutation", without_mutation, mutates),
}


def regions_baseline(
    seed: int, config: ExperimentConfig, train: Dataset, per: Budget, device: str
) -> tuple[tuple[list[torch.nn.Module], list[torch.nn.Module]], list[Dataset], float]:
    """indep-regions: each independent GAN on its cell's own data (cell_dataset, as the grid splits
    it): ((generators, discriminators), their data, seconds)."""
    from palomino.coevolution.cell_data import cell_dataset
    from palomino.grid import Topology

    topology = Topology(config.grid.rows, config.grid.cols, config.grid.neighbourhood)
    parts = [cell_dataset(train, config, coord, topology, None) for coord in topology.cells()]
    nets, critics, seconds = train_baselines(config, parts, per, [seed + 3000 + i for i in range(len(parts))], device)
    return (nets, critics), parts, seconds


@dataclass
class Baseline:
    """Samples of baseline generators as the grid's result is sampled: an equal-weight mixture and,
    where the case sets training.ensemble.critic_quantile, through their own discriminators
    calibrated the same way on training data (palomino.coevolution.rejection), by the same rule
    (training.ensemble.critic: together, or each generator through its own critic calibrated on
    its own data): the filter is then not what tells the grid from its baselines."""

    config: ExperimentConfig
    train: Dataset
    n: int
    seed: int

    def sample(
        self,
        generators: list[torch.nn.Module],
        critics: list[torch.nn.Module],
        weights: np.ndarray | None = None,
        own_data: list[Dataset] | None = None,
        at: int | None = None,
    ) -> torch.Tensor:
        """n samples; `at` seeds them (default the case's seed + 100, as the grid's are drawn)."""
        at = self.seed + 100 if at is None else at
        quantile = self.config.training.ensemble.critic_quantile
        weights = np.full(len(generators), 1 / len(generators)) if weights is None else weights
        if quantile <= 0:
            return draw(generators, weights, self.n, self.config.network.latent_dim, at)
        from palomino.coevolution.rejection import CriticFilter

        def real(data: Dataset) -> torch.Tensor:
            return data.samples[
                torch.randperm(len(data), generator=torch.Generator().manual_seed(self.seed + 11))[:2000]
            ]

        names = [str(i) for i in range(len(generators))]
        mixture = Mixture(
            generators,
            weights,
            names,
            self.config.network,
            self.train.sample_shape,
            self.train.kind,
            {},
            critics=critics,
            critic_cells=names,
        )
        if self.config.training.ensemble.critic == "own":
            own = own_data or [self.train] * len(generators)
            thresholds = [CriticFilter.calibrate([c], real(d), quantile).threshold for c, d in zip(critics, own)]
            mixture.use_filter(FilterRule(rule="own", thresholds=thresholds, quantile=quantile))
        else:
            threshold = CriticFilter.calibrate(critics, real(self.train), quantile).threshold
            mixture.use_filter(FilterRule(threshold=threshold, quantile=quantile))
        return mixture.sample(self.n, seed=at, data_space=False)


def _cells(run: RunDirectory) -> list[str]:
    return [p.name for p in (run.result_dir / "cells").iterdir() if p.is_dir()]
