"""Real-data statistics: the extractor's features of the real images and the real class distribution,
computed once per (dataset, split, size, extractor, class) and cached on disk as safetensors + JSON.
One class's statistics (what a partitioned run's class-c generators are scored against) are keyed
`<dataset>-<split>-class<c>-…`; the whole data's keep their key without a class.

The key also holds a hash of the real images themselves, so a different data directory, subset
seed or file never reuses another's statistics. Files are written atomically: parallel scorers
that race to fill the cache each write a complete file, and the last one wins.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from palomino.data import Dataset
from palomino.io import atomic_write
from palomino.scoring.extractors import FeatureExtractor

log = logging.getLogger(__name__)
FORMAT = 1


@dataclass
class RealStatistics:
    features: torch.Tensor  # (N, num_features) float32: FID's mean and covariance, KID's sample
    class_distribution: torch.Tensor  # (classes,) float64, sums to 1: TVD's reference
    class_source: str  # "labels" (the dataset's own) or "predictions" (the extractor's on the real images)
    key: str
    path: Path | None = None  # where it is cached
    cached: bool = False  # loaded from the cache rather than computed

    @property
    def n(self) -> int:
        return len(self.features)


def images_digest(images: torch.Tensor) -> str:
    return hashlib.sha256(images.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def real_images(dataset: Dataset, samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Up to `samples` real images in [0, 1] (a seeded subset; 0 = all) and their labels."""
    index = None
    if 0 < samples < len(dataset):
        index = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:samples]
    images = dataset.samples if index is None else dataset.samples[index]
    labels = dataset.labels if index is None or dataset.labels is None else dataset.labels[index]
    return dataset.to_data_space(images), labels


@torch.no_grad()
def extract_all(
    extractor: FeatureExtractor, images: torch.Tensor, batch_size: int, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    features, logits = [], []
    for i in range(0, len(images), batch_size):
        f, lg = extractor.extract(images[i : i + batch_size].to(device))
        features.append(f.float().cpu())
        logits.append(lg.float().cpu())
    return torch.cat(features), torch.cat(logits)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def reference_statistics(
    dataset: Dataset,
    split: str,
    extractor: FeatureExtractor,
    *,
    samples: int,
    batch_size: int,
    cache_dir: Path,
    device: str = "cpu",
    label: int | None = None,
) -> RealStatistics:
    """The real statistics of `dataset` under `extractor`, from the cache or computed and cached.

    `label`: `dataset` is that class's samples only (class_subset), which the key then says."""
    images, labels = real_images(dataset, samples)
    tag = "" if label is None else f"class{label}-"
    identity = f"{extractor.identity}|{images_digest(images)}" + ("" if label is None else f"|class {label}")
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    key = _safe(f"{dataset.name}-{split}-{tag}{len(images)}-{extractor.identity}-{digest}")
    folder = Path(cache_dir) / "real-statistics"
    path, meta_path = folder / f"{key}.safetensors", folder / f"{key}.json"
    cached = _cached(path, meta_path, key, (len(images), extractor.num_features))
    if cached is not None:
        return cached
    features, logits = extract_all(extractor, images, batch_size, device)
    classes = len(extractor.classes)
    # The dataset's labels are the true class distribution when the classifier was trained on this dataset;
    # otherwise (another dataset, Inception's ImageNet classes) the extractor's predictions on real images are.
    if labels is not None and extractor.dataset == dataset.name and int(labels.max()) < classes:
        counts, source = torch.bincount(labels, minlength=classes), "labels"
    else:
        counts, source = torch.bincount(logits.argmax(1), minlength=classes), "predictions"
    distribution = counts.double() / counts.sum()
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(path, save({"features": features.contiguous(), "class_distribution": distribution}))
    meta = {
        "format": FORMAT,
        "key": key,
        "dataset": dataset.name,
        "split": split,
        "n": len(images),
        "extractor": extractor.identity,
        "num_features": extractor.num_features,
        "class_source": source,
        **({} if label is None else {"class": label}),
    }
    atomic_write(meta_path, json.dumps(meta, indent=2).encode())
    return RealStatistics(features, distribution, source, key, path, cached=False)


def _cached(path: Path, meta_path: Path, key: str, shape: tuple[int, int]) -> RealStatistics | None:
    """The cached statistics under `key`, or None (absent, unreadable or not what the key says)."""
    if not (path.is_file() and meta_path.is_file()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        tensors = load_file(str(path))
        if meta.get("format") == FORMAT and meta.get("key") == key and tensors["features"].shape == shape:
            return RealStatistics(
                tensors["features"], tensors["class_distribution"], meta["class_source"], key, path, cached=True
            )
        log.warning("%s does not match its description; computing the real statistics again", path)
    except (OSError, ValueError, KeyError, SafetensorError) as error:
        log.warning("%s is unreadable (%s); computing the real statistics again", path, error)
    return None
