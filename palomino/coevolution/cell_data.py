"""A cell's training data: its share of the dataset on its device, shuffled in epochs."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from palomino.config import ExperimentConfig
from palomino.data import Dataset, class_subset, diet
from palomino.data.regions import region_labels, regions_subset
from palomino.errors import DatasetError
from palomino.grid import Coord, Topology
from palomino.grid.partition import ClassGrid
from palomino.nn.host import to_host, upload


def cell_seed(seed: int, coord: Coord) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, coord[0], coord[1]])


def cell_dataset(
    dataset: Dataset, config: ExperimentConfig, coord: Coord, topology: Topology | ClassGrid, label: int | None
) -> Dataset:
    """The samples one cell trains on: its class's (partitioned runs), its own region
    (data_regions), then its diet's share."""
    if label is not None:
        dataset = class_subset(dataset, label)
    if config.training.data_regions and topology.size > 1:
        dataset = own_region(dataset, config.seed, coord, topology)
    if config.training.data_diet < 1:  # data dieting: a share of its own, seeded by the coordinate
        share_seed = int(cell_seed(config.seed, coord).spawn(3)[2].generate_state(1)[0])
        dataset = diet(dataset, config.training.data_diet, share_seed)
    if config.network.conditional and dataset.labels is None:
        raise ValueError(f"network.conditional needs labelled data; {dataset.name} has no labels")
    return dataset


def region_of(coord: Coord, topology: Topology | ClassGrid) -> int:
    """The number of `coord`'s region among region_labels(…, topology.size, …): r·cols + c of its grid."""
    first_row = topology.row_offset if isinstance(topology, ClassGrid) else 0
    return (coord[0] - first_row) * topology.cols + coord[1]


def own_region(dataset: Dataset, seed: int, coord: Coord, topology: Topology | ClassGrid) -> Dataset:
    """The samples of `coord`'s own region: one k-means cluster per cell, the same in every
    process for a seed; cell (r, c) owns region r·cols + c of its grid."""
    labels = region_labels(dataset, topology.size, seed)
    subset = regions_subset(dataset, labels, {region_of(coord, topology)})
    if len(subset) == 0:
        raise DatasetError(
            f"cell {Coord(*coord)}: its region of {dataset.name} holds no samples "
            f"({len(dataset)} samples in {topology.size} regions); use more data or training.data_regions: false"
        )
    return subset


class CellData:
    """Batches in shuffled epochs and random draws, from the cell's own random stream.

    `rng` is the cell's generator, shared: the order of draws is part of a run's reproducibility.
    The order is drawn on the CPU, so a run's batches do not depend on the device.
    """

    def __init__(self, dataset: Dataset, rng: np.random.Generator, device: torch.device, *, labelled: bool) -> None:
        self.rng, self.device = rng, device
        self.source = dataset.samples  # what `samples` was copied from: a tile keeps one copy of each
        self.samples = dataset.samples.to(device)
        # Labels only for a conditional network (`labelled`): an unconditional one never sees them.
        self.labels: torch.Tensor | None = None
        self.classes: list[int] = []  # the labels present, for pictures
        if labelled:
            assert dataset.labels is not None, "cell_dataset checks that a conditional network has labels"
            self.labels = dataset.labels.to(device)
            self.classes = sorted(set(dataset.labels.tolist()))
        self._reshuffle()

    def __len__(self) -> int:
        return len(self.samples)

    def _reshuffle(self) -> None:
        cpu = torch.Generator().manual_seed(int(self.rng.integers(2**62)))
        # Kept as a host array: a batch's indices are then a numpy slice, not two torch ops a batch.
        self.order = torch.randperm(len(self.samples), generator=cpu, device="cpu").numpy()
        self.cursor = 0

    def next_indices(self, batch_size: int) -> np.ndarray:
        """The next training batch's indices (on the host: a plan sends a whole iteration's at once)."""
        size = min(batch_size, len(self.samples))
        if self.cursor + size > len(self.order):
            self._reshuffle()
        index = self.order[self.cursor : self.cursor + size]
        self.cursor += size
        return index

    def random(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """n samples drawn with replacement (fitness and mixture scores), with their labels."""
        index = upload(torch.from_numpy(self.rng.integers(0, len(self.samples), size=n)), self.device)
        return self.take(index)

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The samples at `index` (on the device) and, for labelled data, their labels."""
        return self.samples[index], None if self.labels is None else self.labels[index]

    def sampled_labels(self, n: int) -> torch.Tensor | None:
        """Labels for generated samples, drawn from the class priors (the labels of random samples)."""
        if self.labels is None:
            return None
        return self.labels[upload(torch.from_numpy(self.label_indices(n)), self.device)]

    def label_indices(self, n: int) -> np.ndarray:
        """The draw behind `sampled_labels`: indices into the labels, from the cell's stream."""
        assert self.labels is not None, "only labelled data draws labels"
        return self.rng.integers(0, len(self.labels), size=n)

    def picture_labels(self, n: int) -> torch.Tensor:
        """Labels for a picture of n samples: each class in turn, in equal blocks."""
        classes = upload(self.classes, self.device)
        return classes[torch.arange(n, device=self.device) * len(classes) // n]

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {"data.order": torch.from_numpy(self.order.copy())}, {"cursor": self.cursor}

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.order = to_host(tensors["data.order"]).numpy().copy()
        self.cursor = int(meta["cursor"])
