"""Lipizzaner's TVD: the total variation distance between the class distribution of generated images,
as a classifier labels them, and the real class distribution. 0 when every class is generated as
often as it occurs in the data; 1 − p_c when only class c is generated (total mode collapse).
Scoring one class's generator, `ClassHitRate` is the share of its samples classified as that class.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric


def total_variation(p: Tensor, q: Tensor) -> Tensor:
    """½ Σ |p − q| of two distributions over the same classes."""
    if p.shape != q.shape:
        raise ValueError(f"distributions over different classes: {tuple(p.shape)} vs {tuple(q.shape)}")
    return 0.5 * (p.double() - q.double()).abs().sum()


def class_tvd(fake_logits: Tensor, real_logits: Tensor) -> float:
    """The TVD between the class histograms two sets of logits predict (N × classes each)."""
    classes = real_logits.shape[1]
    p, q = (torch.bincount(x.argmax(1), minlength=classes).double() / len(x) for x in (fake_logits, real_logits))
    return float(total_variation(p, q))


class ClassDistributionTVD(Metric):
    """torchmetrics-style: `update(images)` counts the classes `feature` (a module giving logits)
    predicts; `compute()` is their TVD from `reference` (the real class distribution)."""

    higher_is_better = False
    full_state_update = False

    def __init__(self, feature: nn.Module, reference: Tensor, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        reference = reference.double().flatten()
        if reference.numel() < 2 or not torch.isclose(reference.sum(), torch.tensor(1.0, dtype=torch.float64)):
            raise ValueError("reference must be a distribution over ≥ 2 classes that sums to 1")
        self.feature = feature
        self.register_buffer("reference", reference)
        self.add_state("counts", torch.zeros(reference.numel(), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, images: Tensor) -> None:
        predicted = self.feature(images).argmax(dim=1)
        self.counts += torch.bincount(predicted, minlength=self.reference.numel()).double()

    def compute(self) -> Tensor:
        if self.counts.sum() == 0:
            raise RuntimeError("TVD needs at least one generated sample")
        return total_variation(self.counts / self.counts.sum(), self.reference)


class ClassHitRate(Metric):
    """The share of generated images `feature` (a module giving logits) classifies as `label`: how
    often one class's generator (a partitioned run's component, a conditional draw of class c) makes
    its own class. 1 − this is that generator's TVD from a class-c-only reference."""

    higher_is_better = True
    full_state_update = False

    def __init__(self, feature: nn.Module, label: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.feature = feature
        self.label = int(label)
        self.add_state("hits", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, images: Tensor) -> None:
        predicted = self.feature(images).argmax(dim=1)
        self.hits += (predicted == self.label).sum().double()
        self.total += len(predicted)

    def compute(self) -> Tensor:
        if self.total == 0:
            raise RuntimeError("the hit rate needs at least one generated sample")
        return self.hits / self.total
