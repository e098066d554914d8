"""The small CNN that scores image GANs offline: its penultimate layer feeds FID/KID, its logits IS and TVD.

Trained by `palomino classifier train` on the training split and tested on the test split; where
only the test split exists (the offline MNIST copy) it trains on a seeded part of it and is tested
on the rest (`holdout`, 2,000 of 10,000 by default). Saved as FILE.safetensors (weights) plus
FILE.json (dataset, classes, image shape, architecture, accuracy, split, SHA-256 of the weights).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load as load_tensors
from torch import nn

from palomino.config import DataConfig
from palomino.data import Dataset, load_dataset
from palomino.errors import ConfigError, DatasetError, PalominoError
from palomino.io import atomic_write
from palomino.runs.checkpoints import encode_tensors

log = logging.getLogger(__name__)
FORMAT = 1
KIND = "palomino-classifier"


class ClassifierNet(nn.Module):
    """Three conv blocks (BatchNorm, ReLU, max-pool) → a `features`-wide layer → logits.

    Input: images in [0, 1] of the shape it was trained on (`adapt_images` resizes others).
    """

    def __init__(
        self, channels: int, classes: int, widths: tuple[int, ...] = (32, 64, 128), features: int = 128
    ) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        previous = channels
        for width in widths:
            blocks += [
                nn.Conv2d(previous, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            previous = width
        self.body = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.embed = nn.Sequential(nn.Linear(previous * 4, features), nn.ReLU())
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(features, classes)
        self.num_features = features

    def features_and_logits(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.embed(self.body(images * 2 - 1))  # [0, 1] → [−1, 1], as the GANs generate
        return features, self.head(self.dropout(features))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features_and_logits(images)[1]


def adapt_images(images: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Images in [0, 1] of any size and 1 or 3 channels → `shape` (C, H, W): resize, grey ↔ colour."""
    if images.dim() != 4:
        raise ValueError(f"expected images (N, C, H, W), got shape {tuple(images.shape)}")
    channels, height, width = shape
    images = images.float()
    if images.shape[1] != channels:
        if images.shape[1] == 3 and channels == 1:
            images = images.mean(dim=1, keepdim=True)
        elif images.shape[1] == 1:
            images = images.expand(-1, channels, -1, -1)
        else:
            raise ValueError(f"cannot turn {images.shape[1]}-channel images into {channels}-channel ones")
    if images.shape[-2:] != (height, width):
        images = F.interpolate(images, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    return images


@dataclass
class TrainedClassifier:
    net: ClassifierNet
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return float(self.meta["accuracy"])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.meta["image_shape"])  # type: ignore[return-value]

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.meta["classes"])


@dataclass(frozen=True)
class Split:
    train: Dataset
    test: Dataset
    description: str


def _subset(dataset: Dataset, index: torch.Tensor) -> Dataset:
    return Dataset(
        dataset.name, dataset.samples[index], dataset.labels[index], dataset.kind, class_names=dataset.class_names
    )


def _try_split(data: DataConfig, split: str, seed: int) -> Dataset | None:
    try:  # never download just to find out which splits are here
        return load_dataset(data.model_copy(update={"split": split, "size": 0, "download": False}), seed)
    except DatasetError:
        return None


def classifier_split(data: DataConfig, holdout: int = 2000, seed: int = 0) -> Split:
    """The standard train/test split where the training split exists; otherwise `holdout` test images
    for testing and the rest of the test split for training (the offline MNIST copy: 8,000 / 2,000)."""
    train = _try_split(data, "train", seed)
    test = _try_split(data, "test", seed)
    if train is not None and test is not None:
        return Split(train, test, "standard train / test split")
    if train is None and test is None:  # neither here: the usual download or the message on what goes where
        train = load_dataset(data.model_copy(update={"split": "train", "size": 0}), seed)
        test = load_dataset(data.model_copy(update={"split": "test", "size": 0}), seed)
        return Split(train, test, "standard train / test split")
    only = train if train is not None else test
    assert only is not None
    if not 0 < holdout < len(only):
        raise ConfigError(
            f"--holdout {holdout}: must be between 1 and {len(only) - 1} (the split has {len(only)} images)"
        )
    order = torch.randperm(len(only), generator=torch.Generator().manual_seed(seed))
    which = "training" if train is not None else "test"
    return Split(
        _subset(only, order[holdout:]),
        _subset(only, order[:holdout]),
        f"only the {which} split is here: {len(only) - holdout} of its images for training, {holdout} for testing",
    )


def _shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Random translations of up to `max_shift` pixels per image (the cheapest augmentation that helps)."""
    n, _, height, width = images.shape
    shifts = torch.randint(-max_shift, max_shift + 1, (n, 2), generator=generator).float()
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = theta[:, 1, 1] = 1
    theta[:, 0, 2] = shifts[:, 0] * 2 / width
    theta[:, 1, 2] = shifts[:, 1] * 2 / height
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="nearest", padding_mode="zeros", align_corners=False)


@torch.no_grad()
def accuracy(net: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 1000) -> float:
    net.eval()
    correct = sum(
        int((net(images[i : i + batch_size]).argmax(1) == labels[i : i + batch_size]).sum())
        for i in range(0, len(images), batch_size)
    )
    return correct / len(images)


def default_epochs(n_train: int) -> int:
    """About 150,000 image presentations, 5 to 30 epochs: the MNIST 8k holdout and Fashion-MNIST's 60k both converge."""
    return max(5, min(30, round(150_000 / n_train)))


def _fit(
    net: ClassifierNet,
    train: Dataset,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    generator: torch.Generator,
    on_epoch: Callable[[int, int, float], None] | None,
) -> ClassifierNet:
    """AdamW with a one-cycle schedule on randomly shifted images; returns the net in eval mode."""
    images = train.to_data_space(train.samples)
    optimizer = torch.optim.AdamW(net.parameters(), lr=learning_rate, weight_decay=5e-4)
    steps = epochs * math.ceil(len(images) / batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=learning_rate, total_steps=steps)
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(images), generator=generator)
        total = 0.0
        for i in range(0, len(images), batch_size):
            index = order[i : i + batch_size]
            loss = F.cross_entropy(net(_shift(images[index], 2, generator)), train.labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(index)
        if on_epoch is not None:
            on_epoch(epoch + 1, epochs, total / len(images))
    return net.eval()


def train_classifier(
    data: DataConfig,
    *,
    seed: int = 0,
    epochs: int | None = None,
    holdout: int = 2000,
    train_size: int = 0,
    test_size: int = 0,
    batch_size: int = 128,
    learning_rate: float = 3e-3,
    on_epoch: Callable[[int, int, float], None] | None = None,
) -> TrainedClassifier:
    """Train the CNN on `data` (a DataConfig of an image dataset with labels); seeded, CPU.

    `train_size` / `test_size` keep a seeded subset (0 = all); `on_epoch(epoch, epochs, loss)` reports progress.
    """
    start = time.perf_counter()
    split = classifier_split(data, holdout, seed)
    train, test = split.train, split.test
    if train.kind != "image" or train.labels is None:
        raise ConfigError(f"--data {data.name}: the classifier needs labelled images")
    generator = torch.Generator().manual_seed(seed)
    for size, name in ((train_size, "train"), (test_size, "test")):
        if size < 0:
            raise ConfigError(f"--{name}-size {size}: must be ≥ 0 (0 = all)")
    if train_size:
        train = _subset(train, torch.randperm(len(train), generator=generator)[:train_size])
    if test_size:
        test = _subset(test, torch.randperm(len(test), generator=generator)[:test_size])
    classes = int(max(train.labels.max(), test.labels.max())) + 1
    class_names = train.class_names or tuple(str(c) for c in range(classes))
    epochs = epochs or default_epochs(len(train))

    shape = train.sample_shape
    with torch.random.fork_rng(devices=[]):  # seeded initial weights and dropout, the caller's generator untouched
        torch.manual_seed(seed)
        net = _fit(
            ClassifierNet(shape[0], len(class_names)), train, epochs, batch_size, learning_rate, generator, on_epoch
        )
    meta = {
        "format": FORMAT,
        "kind": KIND,
        "dataset": train.name,
        "classes": list(class_names),
        "image_shape": list(shape),
        "architecture": {"widths": [32, 64, 128], "features": net.num_features},
        "accuracy": accuracy(net, test.to_data_space(test.samples), test.labels),
        "train_size": len(train),
        "test_size": len(test),
        "split": split.description,
        "epochs": epochs,
        "seed": seed,
        "seconds": round(time.perf_counter() - start, 1),
        "torch": torch.__version__,
    }
    return TrainedClassifier(net, meta)


def sidecar(path: Path) -> Path:
    return Path(path).with_suffix(".json")


def save_classifier(trained: TrainedClassifier, path: Path) -> Path:
    """FILE.safetensors (weights) + FILE.json (metadata with the weights' SHA-256); both atomic."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ConfigError(f"--out {path}: the classifier file must end in .safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = encode_tensors(trained.net.state_dict())
    meta = {**trained.meta, "sha256": hashlib.sha256(payload).hexdigest()}
    atomic_write(path, payload)
    atomic_write(sidecar(path), json.dumps(meta, indent=2).encode())
    trained.meta = meta
    return path


def load_classifier(path: Path, device: str = "cpu") -> TrainedClassifier:
    """Load and verify a classifier saved by `save_classifier` (checksum, architecture, metadata)."""
    path = Path(path)
    retrain = f"train one: palomino classifier train --data mnist --data-dir DIR --out {path}"
    try:
        payload = path.read_bytes()
        meta = json.loads(sidecar(path).read_text())
    except FileNotFoundError as error:
        raise PalominoError(f"classifier {path}: {error.filename} is missing; {retrain}") from None
    except (OSError, ValueError) as error:
        raise PalominoError(f"classifier {path}: unreadable ({error}); {retrain}") from None
    if not isinstance(meta, dict) or meta.get("kind") != KIND or meta.get("format") != FORMAT:
        raise PalominoError(f"classifier {path}: {sidecar(path)} is not a palomino classifier description; {retrain}")
    if hashlib.sha256(payload).hexdigest() != meta.get("sha256"):
        raise PalominoError(
            f"classifier {path}: the weights do not match the SHA-256 in {sidecar(path)} (corrupt or replaced); {retrain}"
        )
    architecture = meta["architecture"]
    net = ClassifierNet(
        meta["image_shape"][0], len(meta["classes"]), tuple(architecture["widths"]), architecture["features"]
    )
    try:
        net.load_state_dict(load_tensors(payload))
    except (RuntimeError, ValueError) as error:
        raise PalominoError(
            f"classifier {path}: weights do not fit the described network ({error}); {retrain}"
        ) from None
    return TrainedClassifier(net.to(device).eval(), meta)
