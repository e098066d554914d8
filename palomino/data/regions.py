"""Regions of the data: k-means clusters, one per cell, so that each cell can train on its own
part of the distribution (`training.data_regions`): each generator then has a few modes to
learn in its steps, and the whole-grid ensemble joins the specialists.

Lloyd's k-means in torch, seeded: every process of a distributed run computes the same regions
from the same data, with no coordination. (scikit-learn's KMeans would bring scipy into the cell
image for these few lines.)
"""

from __future__ import annotations

import torch

from palomino.data.dataset import Dataset

FIT_SAMPLES = 10_000  # k-means is fitted on at most this many samples, then every sample is assigned
ROUNDS = 50


def kmeans(points: torch.Tensor, k: int, seed: int, rounds: int = ROUNDS) -> torch.Tensor:
    """k centroids of `points` (n × d): k-means++ seeding, then Lloyd's rounds."""
    g = torch.Generator().manual_seed(seed)
    points = points.double()
    if k >= len(points):
        return points[torch.randperm(len(points), generator=g)][:k].clone()
    centres = [points[int(torch.randint(len(points), (1,), generator=g))]]
    nearest = torch.cdist(points, centres[0][None]).squeeze(1) ** 2
    for _ in range(1, k):  # k-means++: far points are likelier next centres
        weights = nearest / nearest.sum() if nearest.sum() > 0 else torch.ones_like(nearest)
        centre = points[int(torch.multinomial(weights, 1, generator=g))]
        centres.append(centre)
        nearest = torch.minimum(nearest, ((points - centre) ** 2).sum(1))
    centroids = torch.stack(centres)
    for _ in range(rounds):
        assigned = torch.cdist(points, centroids).argmin(1)
        moved = centroids.clone()
        for j in range(k):
            members = points[assigned == j]
            if len(members):  # an empty cluster keeps its centre
                moved[j] = members.mean(0)
        if torch.equal(moved, centroids):
            break
        centroids = moved
    return centroids


def region_labels(dataset: Dataset, k: int, seed: int) -> torch.Tensor:
    """Each sample's region (0 … k−1): its nearest of k centroids fitted on a seeded subset.

    Computed once per dataset, k and seed: every cell of a grid asks for the same labels (k-means
    of MNIST took ~10 s of CPU, once for each of a 5×5 grid's 25 cells before)."""
    key = ("region_labels", k, seed)
    if key not in dataset.derived:
        flat = dataset.samples.reshape(len(dataset), -1).float()
        g = torch.Generator().manual_seed(seed)
        fit = flat[torch.randperm(len(flat), generator=g)[:FIT_SAMPLES]]
        centroids = kmeans(fit, k, seed).float()
        dataset.derived[key] = torch.cat([torch.cdist(chunk, centroids).argmin(1) for chunk in flat.split(4096)])
    return dataset.derived[key]


def regions_subset(dataset: Dataset, labels: torch.Tensor, regions: set[int]) -> Dataset:
    """The samples whose region is in `regions`."""
    index = torch.isin(labels, torch.tensor(sorted(regions), dtype=labels.dtype)).nonzero().squeeze(1)
    return dataset.rows(index)
