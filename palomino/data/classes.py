"""Classes of a labelled dataset: selecting labels, one class's samples, the class priors."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from palomino.data.dataset import Dataset, subset_indices
from palomino.errors import DatasetError


def label_count(dataset: Dataset) -> int:
    """How many labels the dataset's source has (not only those present): the size of a label embedding."""
    if dataset.class_names:
        return len(dataset.class_names)
    if dataset.modes is not None:
        return len(dataset.modes)
    labels = _labels(dataset, "counting its classes")
    return int(labels.max()) + 1 if len(labels) else 0


def class_counts(dataset: Dataset) -> dict[int, int]:
    """label → number of samples, for the labels present, in label order."""
    labels, counts = torch.unique(_labels(dataset, "counting its classes"), return_counts=True)
    return {int(label): int(count) for label, count in zip(labels, counts)}


def class_priors(dataset: Dataset) -> dict[int, float]:
    """label → its share of the samples: p(c) of p(x) = Σ_c p(x | c) p(c)."""
    counts = class_counts(dataset)
    total = sum(counts.values())
    return {label: count / total for label, count in counts.items()}


def select_classes(dataset: Dataset, classes: Sequence[int], size: int = 0, seed: int = 0) -> Dataset:
    """The samples whose label is in `classes`; then `size` of them (seeded), 0 = all."""
    labels = _labels(dataset, "selecting data.classes")
    available = label_count(dataset)
    unknown = sorted(set(classes) - set(range(available)))
    if unknown:
        raise DatasetError(f"data.classes: {dataset.name} has labels 0–{available - 1}; no label {unknown[0]}")
    wanted = torch.tensor(sorted(classes), dtype=labels.dtype)
    keep = torch.isin(labels, wanted)
    present = set(torch.unique(labels[keep]).tolist())
    missing = [c for c in sorted(classes) if c not in present]
    if missing:
        raise DatasetError(
            f"data.classes: label {missing[0]} has no samples in {dataset.name} "
            f"({len(dataset)} samples; a larger data.size or data.split=train may hold it)"
        )
    index = keep.nonzero().squeeze(1)
    sub = subset_indices(len(index), size, seed, f"{dataset.name} restricted to classes {sorted(classes)}")
    if sub is not None:
        index = index[torch.from_numpy(sub)]
    return dataset.rows(index)


def class_subset(dataset: Dataset, label: int) -> Dataset:
    """One class's samples (a partitioned cell's data); an error if it has none."""
    labels = _labels(dataset, f"training class {label} on its own")
    index = (labels == label).nonzero().squeeze(1)
    if len(index) == 0:
        raise DatasetError(f"class {label} has no samples in {dataset.name} ({len(dataset)} samples)")
    return dataset.rows(index)


def _labels(dataset: Dataset, purpose: str) -> torch.Tensor:
    if dataset.labels is None:
        raise DatasetError(f"{dataset.name} has no labels, which {purpose} needs")
    return dataset.labels


def diet(dataset: Dataset, share: float, seed: int) -> Dataset:
    """A random `share` of the samples (at least one): a cell's own subset under data dieting."""
    keep = max(1, round(len(dataset) * share))
    g = torch.Generator().manual_seed(seed)
    index = torch.randperm(len(dataset), generator=g)[:keep].sort().values
    return dataset.rows(index)
