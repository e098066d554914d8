"""The small CNN that scores image GANs offline: its penultimate layer feeds FID/KID, its logits IS and TVD.

Two architectures (`arch`): `cnn`, Palomino's own (the default), and `lipizzaner`, Lipizzaner's MNIST
CNN (palomino.scoring.lipizzaner_protocol), whose 10 logits are its features, so FIDs sit beside Lipizzaner's
published ones. Trained by `palomino classifier train` on the training split and tested on the test
split; where only the test split exists (the offline MNIST copy) it trains on a seeded part of it and
is tested on the rest (`holdout`, 2,000 of 10,000 by default). `palomino classifier import` takes
weights trained elsewhere (Lipizzaner's own classifier) instead. Saved as FILE.safetensors (weights)
plus FILE.json (dataset, classes, image shape, architecture, accuracy, split, SHA-256 of the weights).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from torch import nn

from palomino.config import DataConfig
from palomino.data import Dataset, load_dataset
from palomino.errors import ConfigError, DatasetError, PalominoError
from palomino.io import atomic_write
from palomino.runs.checkpoints import encode_tensors
from palomino.scoring.lipizzaner_protocol import ARCH as LIPIZZANER
from palomino.scoring.lipizzaner_protocol import IMAGE_SHAPE as LIPIZZANER_SHAPE
from palomino.scoring.lipizzaner_protocol import LipizzanerNet

log = logging.getLogger(__name__)
FORMAT = 1
KIND = "palomino-classifier"
ARCHITECTURES = ("cnn", LIPIZZANER)


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


def build_net(architecture: Mapping[str, Any], image_shape: tuple[int, ...], classes: int) -> nn.Module:
    """The untrained network an `architecture` description names (no "name": `cnn`, the files before `lipizzaner`)."""
    name = architecture.get("name", "cnn")
    if name == LIPIZZANER:
        return LipizzanerNet(image_shape[0], classes)
    if name == "cnn":
        return ClassifierNet(image_shape[0], classes, tuple(architecture["widths"]), architecture["features"])
    raise ValueError(f"unknown classifier architecture {name!r}; known: {', '.join(ARCHITECTURES)}")


def architecture_of(arch: str) -> dict[str, Any]:
    if arch == LIPIZZANER:
        return {"name": LIPIZZANER, "features": "logits"}
    if arch == "cnn":
        return {"name": "cnn", "widths": [32, 64, 128], "features": 128}
    raise ConfigError(f"--arch {arch}: unknown; use one of {', '.join(ARCHITECTURES)}")


@dataclass
class TrainedClassifier:
    net: nn.Module  # ClassifierNet or LipizzanerNet: features_and_logits(images in [0, 1]), num_features
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def arch(self) -> str:
        return str(self.meta.get("architecture", {}).get("name", "cnn"))

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
        only.rows(order[holdout:]),
        only.rows(order[:holdout]),
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
    net: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    generator: torch.Generator,
    on_epoch: Callable[[int, int, float], None] | None,
) -> nn.Module:
    """AdamW with a one-cycle schedule on randomly shifted `images` (in [0, 1]); returns the net in eval mode."""
    optimizer = torch.optim.AdamW(net.parameters(), lr=learning_rate, weight_decay=5e-4)
    steps = epochs * math.ceil(len(images) / batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=learning_rate, total_steps=steps)
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(images), generator=generator)
        total = 0.0
        for i in range(0, len(images), batch_size):
            index = order[i : i + batch_size]
            loss = F.cross_entropy(net(_shift(images[index], 2, generator)), labels[index])
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
    arch: str = "cnn",
    on_epoch: Callable[[int, int, float], None] | None = None,
) -> TrainedClassifier:
    """Train the CNN on `data` (a DataConfig of an image dataset with labels); seeded, CPU.

    `arch`: `cnn` or `lipizzaner` (Lipizzaner's MNIST CNN: other images are first adapted to 1 × 28 × 28).
    `train_size` / `test_size` keep a seeded subset (0 = all); `on_epoch(epoch, epochs, loss)` reports progress.
    """
    start = time.perf_counter()
    architecture = architecture_of(arch)
    split = classifier_split(data, holdout, seed)
    train, test = split.train, split.test
    if train.kind != "image" or train.labels is None:
        raise ConfigError(f"--data {data.name}: the classifier needs labelled images")
    generator = torch.Generator().manual_seed(seed)
    for size, name in ((train_size, "train"), (test_size, "test")):
        if size < 0:
            raise ConfigError(f"--{name}-size {size}: must be ≥ 0 (0 = all)")
    if train_size:
        train = train.rows(torch.randperm(len(train), generator=generator)[:train_size])
    if test_size:
        test = test.rows(torch.randperm(len(test), generator=generator)[:test_size])
    classes = int(max(train.labels.max(), test.labels.max())) + 1
    class_names = train.class_names or tuple(str(c) for c in range(classes))
    epochs = epochs or default_epochs(len(train))

    shape = LIPIZZANER_SHAPE if arch == LIPIZZANER else train.sample_shape
    with torch.random.fork_rng(devices=[]):  # seeded initial weights and dropout, the caller's generator untouched
        torch.manual_seed(seed)
        net = _fit(
            build_net(architecture, shape, len(class_names)),
            adapt_images(train.to_data_space(train.samples), shape),
            train.labels,
            epochs,
            batch_size,
            learning_rate,
            generator,
            on_epoch,
        )
    meta = {
        "format": FORMAT,
        "kind": KIND,
        "dataset": train.name,
        "classes": list(class_names),
        "image_shape": list(shape),
        "architecture": architecture,
        "accuracy": accuracy(net, adapt_images(test.to_data_space(test.samples), shape), test.labels),
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


def describe(architecture: Mapping[str, Any]) -> str:
    name = architecture.get("name", "cnn")
    if name == LIPIZZANER:
        return "Lipizzaner's MNIST CNN"
    return f"the {name} classifier its JSON describes"


def check_weights(
    net: nn.Module, tensors: Mapping[str, torch.Tensor], source: Path, what: str
) -> dict[str, torch.Tensor]:
    """`tensors` as `net`'s state dict (floats cast to its dtype), or a PalominoError naming `source`
    and the first tensor that is missing, of the wrong shape or not `net`'s at all."""
    expected = net.state_dict()
    for name, want in expected.items():
        got = tensors.get(name)
        if got is None:
            held = ", ".join(sorted(tensors)) or "no tensors"
            raise PalominoError(
                f"{source}: no tensor {name} of shape {tuple(want.shape)}, which {what} needs (the file holds {held})"
            )
        if tuple(got.shape) != tuple(want.shape) or got.is_floating_point() != want.is_floating_point():
            raise PalominoError(
                f"{source}: tensor {name} is {got.dtype} of shape {tuple(got.shape)}, but {what} needs "
                f"{want.dtype} of shape {tuple(want.shape)}"
            )
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise PalominoError(f"{source}: tensor {extra[0]} is not one of {what}'s ({', '.join(expected)})")
    return {name: tensors[name].to(want.dtype) for name, want in expected.items()}


def load_classifier(path: Path, device: str = "cpu") -> TrainedClassifier:
    """Load and verify a classifier saved by `save_classifier` (checksum, architecture, every tensor's shape)."""
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
    try:
        net = build_net(architecture, tuple(meta["image_shape"]), len(meta["classes"]))
        tensors = load_tensors(payload)
    except (KeyError, TypeError, ValueError, SafetensorError) as error:
        raise PalominoError(f"classifier {path}: does not describe a network ({error}); {retrain}") from None
    net.load_state_dict(check_weights(net, tensors, path, describe(architecture)))
    return TrainedClassifier(net.to(device).eval(), meta)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file, or of a PyTorch state dict (.pt, .pth, .pkl) read with
    torch.load(weights_only=True): nothing is ever unpickled beyond tensors and plain containers."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            return load_tensors(path.read_bytes())
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise PalominoError(f"--weights {path}: no such file") from None
    except Exception as error:  # noqa: BLE001 — safetensors', torch's and the unpickler's own errors
        raise PalominoError(f"--weights {path}: not a safetensors file or a PyTorch state dict ({error})") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PalominoError(f"--weights {path}: not a state dict (a mapping of names to tensors)")
    return dict(state)


def import_classifier(
    weights: Path, data: DataConfig, *, holdout: int = 2000, test_size: int = 0, seed: int = 0
) -> TrainedClassifier:
    """Lipizzaner's MNIST CNN with weights trained elsewhere (Lipizzaner's own classifier, as safetensors
    or a PyTorch state dict), every tensor's shape checked, and its accuracy measured on `data`'s whole
    test split (nothing here trained on it; without one, on `holdout` images of the training split as
    `train_classifier` splits it): a wrong dataset or input range shows there."""
    start = time.perf_counter()
    weights = Path(weights)
    tensors = read_weights(weights)
    test = _try_split(data, "test", seed) or classifier_split(data, holdout, seed).test
    if test.kind != "image" or test.labels is None:
        raise ConfigError(f"--data {data.name}: the classifier needs labelled images")
    if test_size:
        test = test.rows(torch.randperm(len(test), generator=torch.Generator().manual_seed(seed))[:test_size])
    classes = test.class_names or tuple(str(c) for c in range(int(test.labels.max()) + 1))
    architecture = architecture_of(LIPIZZANER)
    net = build_net(architecture, LIPIZZANER_SHAPE, len(classes))
    net.load_state_dict(check_weights(net, tensors, weights, describe(architecture)))
    meta = {
        "format": FORMAT,
        "kind": KIND,
        "dataset": test.name,
        "classes": list(classes),
        "image_shape": list(LIPIZZANER_SHAPE),
        "architecture": architecture,
        "accuracy": accuracy(net, adapt_images(test.to_data_space(test.samples), LIPIZZANER_SHAPE), test.labels),
        "train_size": None,
        "test_size": len(test),
        "split": f"imported from {weights.name} (trained elsewhere); tested on {len(test)} test images",
        # The file's name, not its path: the JSON travels (and a path would name the importer's machine).
        "imported_from": {"file": weights.name, "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()},
        "epochs": None,
        "seed": seed,
        "seconds": round(time.perf_counter() - start, 1),
        "torch": torch.__version__,
    }
    return TrainedClassifier(net.eval(), meta)
