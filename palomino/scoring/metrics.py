"""FID, IS and KID through torchmetrics, TVD alongside, with a pluggable extractor as their `feature` module.

The four metrics see each generated batch through views of one `SharedPass`, so the extractor runs
once per batch however many metrics are asked for. The real side is not fed image by image: the
cached real features go through FID's and KID's public `update(..., real=True)` once, their feature
module passing them through as they are (`Cached`), and stay (`reset_real_features=False`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.inception import InceptionScore
from torchmetrics.image.kid import KernelInceptionDistance

from palomino.scoring.extractors import FeatureExtractor
from palomino.scoring.real_statistics import RealStatistics
from palomino.scoring.tvd import ClassDistributionTVD, ClassHitRate

IMAGE_METRICS = ("fid", "is", "kid", "tvd")
KID_SUBSET = 1000  # torchmetrics' default subset size; smaller when fewer samples are scored


class SharedPass:
    """Runs the extractor once per batch and hands its (features, logits) to every view that asks."""

    def __init__(self, extractor: FeatureExtractor) -> None:
        self.extractor = extractor
        self._images: Tensor | None = None  # held, so its identity cannot be reused by another tensor
        self._outputs: tuple[Tensor, Tensor] | None = None

    def __call__(self, images: Tensor) -> tuple[Tensor, Tensor]:
        if images is not self._images:
            self._images, self._outputs = images, self.extractor.extract(images)
        assert self._outputs is not None
        return self._outputs

    def view(self, output: str) -> nn.Module:
        return _View(
            self,
            0 if output == "features" else 1,
            self.extractor.num_features if output == "features" else len(self.extractor.classes),
        )


class _View(nn.Module):
    def __init__(self, shared: SharedPass, index: int, width: int) -> None:
        super().__init__()
        self.shared = shared
        self.index = index
        self.num_features = width  # torchmetrics' FID reads it instead of running a dummy 299×299 image

    def forward(self, images: Tensor) -> Tensor:
        return self.shared(images)[self.index]


class Cached(nn.Module):
    """A metric's feature module: `view`, except while `load` feeds it features already extracted
    (the cached real ones), which pass through as they are. So the real state is filled by the
    metric's own update, never written into its internals."""

    def __init__(self, view: nn.Module) -> None:
        super().__init__()
        self.view = view
        self.passing = False
        if hasattr(view, "num_features"):
            self.num_features = view.num_features

    def forward(self, images: Tensor) -> Tensor:
        return images if self.passing else self.view(images)

    def load(self, metric: FrechetInceptionDistance | KernelInceptionDistance, features: Tensor) -> None:
        """`features` into `metric`'s real side, as update(real=True) would have them from their images."""
        self.passing = True
        try:
            metric.update(features.to(metric.device), real=True)
        finally:
            self.passing = False


def fid_metric(view: nn.Module, real: RealStatistics) -> FrechetInceptionDistance:
    feature = Cached(view)
    metric = FrechetInceptionDistance(feature=feature, reset_real_features=False)
    feature.load(metric, real.features)
    return metric


def kid_metric(view: nn.Module, real: RealStatistics, samples: int, subsets: int = 100) -> KernelInceptionDistance:
    feature = Cached(view)
    with warnings.catch_warnings():  # "will save all extracted features in buffer": that is the point
        warnings.filterwarnings("ignore", message=".*will save all extracted features.*")
        metric = KernelInceptionDistance(
            feature=feature, subsets=subsets, subset_size=min(KID_SUBSET, samples, real.n), reset_real_features=False
        )
    feature.load(metric, real.features.clone())  # KID keeps the tensor itself
    return metric


def inception_score_metric(view: nn.Module, splits: int) -> InceptionScore:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*will save all extracted features.*")
        return InceptionScore(feature=view, splits=splits)


def build_metrics(
    names: Iterable[str],
    extractor: FeatureExtractor,
    real: RealStatistics,
    *,
    samples: int,
    is_splits: int = 10,
    label: int | None = None,
) -> dict[str, Metric]:
    """The torchmetrics objects for `names` (a subset of fid, is, kid, tvd, and hit with `label`: the
    logit index of the class scored), sharing one extractor pass."""
    names = list(names)
    if "hit" in names and label is None:
        raise ValueError("the hit rate needs the label of the class scored")
    shared = SharedPass(extractor)
    features, logits = shared.view("features"), shared.view("logits")
    make = {
        "fid": lambda: fid_metric(features, real),
        "kid": lambda: kid_metric(features, real, samples),
        "is": lambda: inception_score_metric(logits, is_splits),
        "tvd": lambda: ClassDistributionTVD(logits, real.class_distribution),
        "hit": lambda: ClassHitRate(logits, label),
    }
    return {name: make[name]() for name in names}


def update_metrics(metrics: dict[str, Metric], images: Tensor) -> None:
    """One batch of generated images in [0, 1] into every metric."""
    for name, metric in metrics.items():
        if name in ("fid", "kid"):
            metric.update(images, real=False)
        else:
            metric.update(images)


def compute_metrics(metrics: dict[str, Metric], seed: int) -> dict[str, dict[str, Any]]:
    """Each metric's value (and std where it has one). KID's subsets and IS's splits draw from torch's
    global generator: seeded here, inside fork_rng, so a score is reproducible and nothing else is disturbed."""
    out: dict[str, dict[str, Any]] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, metric in metrics.items():
            value = metric.compute()
            if isinstance(value, tuple):
                out[name] = {"value": float(value[0]), "std": float(value[1])}
            else:
                out[name] = {"value": float(value)}
    return out
