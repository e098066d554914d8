"""The whole-grid ensemble of a finished run: every cell's generator, weights optimised on real data.

Where the score comes from: 2-D points, a kernel MMD² with fine bandwidths; images, FID on the
`features` the caller passes in (the configured classifier's: palomino.scoring.extractors.
ensemble_features; this package never imports palomino.scoring, which imports it), else MMD² on pixels. The real samples are split in two: one half selects, the other (with other
generated samples) gives the held-out score written to mixture.json.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from palomino.coevolution.cell_data import region_of
from palomino.coevolution.ensemble_search import (
    FINE_BANDWIDTH_FACTORS,
    Ensemble,
    FrechetScore,
    WeightScore,
    optimise_ensemble,
)
from palomino.coevolution.mixture_weights import BANDWIDTH_FACTORS, MixtureScore
from palomino.coevolution.rejection import CriticFilter
from palomino.config import ExperimentConfig
from palomino.data import Dataset
from palomino.data.regions import region_labels, regions_subset
from palomino.grid import Topology, parse_coord
from palomino.nn import apply
from palomino.runs.filter_rule import FilterRule

if TYPE_CHECKING:
    from palomino.runs.mixture import Mixture

log = logging.getLogger(__name__)

REAL_SAMPLES = 4000  # split in two: selection and held out
Features = Callable[[torch.Tensor], torch.Tensor]  # generated images (generator space) → feature vectors


@dataclass
class GridEnsemble:
    ensemble: Ensemble
    cells: list[str]  # "r-c" of every component, in the order of `ensemble.weights`
    generators: list[nn.Module]
    score_name: str
    # What each component's samples pass through (training.ensemble.critic), calibrated on real
    # data: one filter of every critic ("mean"), or each cell's own critic ("own"); None: no filter.
    filters: list[CriticFilter] | None = None
    quantile: float | None = None
    rule: str = "mean"

    def filter_rule(self) -> FilterRule | None:
        """mixture.json's "filter" for these filters."""
        if not self.filters:
            return None
        if self.rule == "own":
            return FilterRule(rule="own", thresholds=[f.threshold for f in self.filters], quantile=self.quantile)
        return FilterRule(threshold=self.filters[0].threshold, quantile=self.quantile)

    def apply_filter(self, mixture: Mixture) -> None:
        """Make `mixture` (of the same components) sample through these filters."""
        if self.filters:
            mixture.use_filter(self.filter_rule())

    def summary(self) -> dict[str, Any]:
        e = self.ensemble
        rule = self.filter_rule()
        return {
            "scope": "grid",
            "score_name": self.score_name,
            "held_out_score": e.held_out_score,
            "selection_score": e.selection_score,
            "equal_weight_score": e.equal_weight_score,
            "cells": self.cells,
            "weights": [float(w) for w in e.weights],
            **({"filter": rule.encode()} if rule else {}),
        }


def samples_per_component(components: int, kind: str) -> int:
    # The MMD's kernel matrix is (C·m)²: keep it near 5,000² whatever the grid's size.
    budget = 5000 if kind == "points" else 2000
    return max(50, budget // components)


@torch.no_grad()
def grid_ensemble(
    generators: list[nn.Module],
    cells: list[str],
    dataset: Dataset,
    config: ExperimentConfig,
    device: str | torch.device = "cpu",
    critics: list[nn.Module] | None = None,
    *,
    features: Features | None = None,
) -> GridEnsemble:
    """Optimise a mixture over `generators` (one per cell, named by `cells`) against `dataset`.

    With `critics` (the cells' discriminators, in the order of `cells`) and
    training.ensemble.critic_quantile > 0, every component is sampled through them
    (palomino.coevolution.rejection) and the weights are optimised for what passes. Rule "mean":
    all critics together, calibrated on the selection half of the real samples; rule "own": each
    component through its own cell's critic, calibrated on that cell's own data (its region).

    `features`: for images, what FID is computed on (None: MMD² on pixels)."""
    settings = config.training.ensemble
    rng = np.random.Generator(np.random.PCG64([config.seed, 7]))
    torch_rng = torch.Generator(device=device).manual_seed(config.seed + 7)
    real = dataset.samples
    order = torch.randperm(len(real), generator=torch.Generator().manual_seed(config.seed + 11))[:REAL_SAMPLES]
    half = len(order) // 2
    real_select, real_held = real[order[:half]].to(device), real[order[half:]].to(device)
    m = settings.samples or samples_per_component(len(generators), dataset.kind)
    latent = config.network.latent_dim

    quantile = settings.critic_quantile
    filters: list[CriticFilter] | None = None
    if critics and quantile > 0:
        if settings.critic == "own":
            own = own_real_samples(dataset, config, cells, half)
            filters = [CriticFilter.calibrate([c], r.to(device), quantile) for c, r in zip(critics, own)]
        else:
            filters = [CriticFilter.calibrate(critics, real_select, quantile)] * len(generators)

    def draw() -> list[torch.Tensor]:
        out = []
        for i, g in enumerate(generators):
            g.eval()

            def generate(k: int, g: nn.Module = g) -> torch.Tensor:
                return apply(g, torch.randn(k, latent, generator=torch_rng, device=device))

            out.append(generate(m) if filters is None else filters[i].draw(generate, m).to(device))
            g.train()
        return out

    fakes_select, fakes_held = draw(), draw()
    select, held, name = _scores(fakes_select, fakes_held, real_select, real_held, dataset.kind, features)
    ensemble = optimise_ensemble(select, held, rng, sigma=settings.sigma, es_steps=settings.es_steps)
    return GridEnsemble(ensemble, cells, generators, name, filters, quantile if filters else None, settings.critic)


def own_real_samples(dataset: Dataset, config: ExperimentConfig, cells: list[str], limit: int) -> list[torch.Tensor]:
    """Up to `limit` real samples of each cell's own data, as its critic saw it: its k-means region
    with training.data_regions (palomino.coevolution.cell_data.own_region's numbering), else all the
    data. A cell outside the configured grid (a resized run) is calibrated on all the data."""
    pick = torch.Generator().manual_seed(config.seed + 13)
    if not config.training.data_regions or config.grid.rows * config.grid.cols < 2:
        return [dataset.samples[torch.randperm(len(dataset), generator=pick)[:limit]]] * len(cells)
    topology = Topology(config.grid.rows, config.grid.cols)
    labels = region_labels(dataset, topology.size, config.seed)
    out = []
    for name in cells:
        coord = parse_coord(name)
        own = regions_subset(dataset, labels, {region_of(coord, topology)}) if coord in topology else None
        if own is None or len(own) == 0:
            log.warning(
                "cell %s has no region of the %d×%d grid: its critic is calibrated on all the data",
                name,
                topology.rows,
                topology.cols,
            )
            own = dataset
        out.append(own.samples[torch.randperm(len(own), generator=pick)[:limit]])
    return out


def _scores(
    fakes_select: list[torch.Tensor],
    fakes_held: list[torch.Tensor],
    real_select: torch.Tensor,
    real_held: torch.Tensor,
    kind: str,
    features: Features | None,
) -> tuple[WeightScore, WeightScore, str]:
    """The score the weights are chosen on and the held-out one they are reported on, and its name:
    FID on `features` for images when given (the classifier's), else MMD²."""
    if kind == "image" and features is not None:
        select = FrechetScore.from_features([features(f) for f in fakes_select], features(real_select))
        held = FrechetScore.from_features([features(f) for f in fakes_held], features(real_held))
        return select, held, "fid (classifier features)"
    if kind == "image":
        log.info(
            "no classifier configured: the grid ensemble is optimised on pixel MMD² (set scoring.classifier for FID)"
        )
    factors = FINE_BANDWIDTH_FACTORS if kind == "points" else BANDWIDTH_FACTORS
    select_mmd = MixtureScore.from_samples(fakes_select, real_select, factors)
    return select_mmd, MixtureScore.from_samples(fakes_held, real_held, factors), "mmd2"
