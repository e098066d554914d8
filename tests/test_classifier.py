"""The scoring classifier: its split of a copy of MNIST with only the test split, saving and loading
(checksummed), the image adaptation the extractors rely on, and refusing a classifier of another dataset.

Training to > 95 % on MNIST's test split is in tests/test_scoring.py (one training serves those tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from palomino.config import DataConfig
from palomino.errors import ConfigError, PalominoError
from palomino.scoring import ScoringContext, ScoringOptions
from palomino.scoring.classifier import (
    ClassifierNet,
    TrainedClassifier,
    adapt_images,
    classifier_split,
    load_classifier,
    save_classifier,
)
from palomino.scoring.extractors import build_extractor


def only_the_test_split(mnist_dir: Path, folder: Path) -> Path:
    """`folder` with links to MNIST's test split only (t10k-*), whatever else `mnist_dir` holds."""
    folder.mkdir()
    for source in mnist_dir.glob("t10k-*-ubyte*"):
        (folder / source.name).symlink_to(source.resolve())
    return folder


def untrained(dataset: str = "mnist", shape: tuple[int, int, int] = (1, 28, 28)) -> TrainedClassifier:
    torch.manual_seed(0)
    meta = {
        "format": 1,
        "kind": "palomino-classifier",
        "dataset": dataset,
        "classes": [str(c) for c in range(10)],
        "image_shape": list(shape),
        "architecture": {"widths": [32, 64, 128], "features": 128},
        "accuracy": 0.1,
    }
    return TrainedClassifier(ClassifierNet(shape[0], 10).eval(), meta)


def test_only_the_test_split_here_gives_8000_for_training_and_2000_for_testing(mnist_dir: Path, tmp_path: Path) -> None:
    t10k = only_the_test_split(mnist_dir, tmp_path / "mnist")
    split = classifier_split(DataConfig(name="mnist", dir=t10k), holdout=2000, seed=0)
    assert (len(split.train), len(split.test)) == (8000, 2000)
    assert "only the test split is here" in split.description

    def images(dataset) -> set[bytes]:
        return {row.numpy().tobytes() for row in dataset.samples.flatten(1)}

    assert not images(split.train) & images(split.test)  # disjoint
    assert torch.bincount(split.test.labels, minlength=10).min() > 150  # a random draw: every digit is tested
    again = classifier_split(DataConfig(name="mnist", dir=t10k), holdout=2000, seed=0)
    assert torch.equal(again.test.labels, split.test.labels)  # seeded
    with pytest.raises(ConfigError, match="--holdout 10000: must be between 1 and 9999"):
        classifier_split(DataConfig(name="mnist", dir=t10k), holdout=10_000)


def test_fashion_mnist_has_both_splits_and_uses_the_standard_one(fashion_mnist_dir: Path) -> None:
    split = classifier_split(DataConfig(name="fashion_mnist", dir=fashion_mnist_dir))
    assert (len(split.train), len(split.test)) == (
        60_000,
        10_000,
    ) and split.description == "standard train / test split"


def test_saved_classifier_loads_to_the_same_predictions_and_refuses_tampering(tmp_path: Path) -> None:
    trained = untrained()
    path = save_classifier(trained, tmp_path / "c.safetensors")
    meta = json.loads((tmp_path / "c.json").read_text())
    assert len(meta["sha256"]) == 64 and meta["dataset"] == "mnist"
    images = torch.rand(16, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    loaded = load_classifier(path)
    assert torch.equal(loaded.net(images), trained.net(images))

    payload = bytearray(path.read_bytes())
    payload[-5] ^= 0xFF
    path.write_bytes(bytes(payload))
    with pytest.raises(PalominoError, match="do not match the SHA-256"):
        load_classifier(path)
    (tmp_path / "c.json").unlink()
    with pytest.raises(PalominoError, match=r"c\.json is missing; train one: palomino classifier train"):
        load_classifier(path)
    with pytest.raises(ConfigError, match="must end in .safetensors"):
        save_classifier(trained, tmp_path / "c.pt")


def test_images_of_any_size_and_channels_are_adapted_to_the_classifier() -> None:
    colour = torch.rand(4, 3, 64, 64)
    grey = adapt_images(colour, (1, 28, 28))
    assert grey.shape == (4, 1, 28, 28) and float(grey.min()) >= 0 and float(grey.max()) <= 1
    assert adapt_images(torch.rand(2, 1, 32, 32), (3, 32, 32)).shape == (2, 3, 32, 32)
    same = torch.rand(2, 1, 28, 28)
    assert torch.equal(adapt_images(same, (1, 28, 28)), same)
    with pytest.raises(ValueError, match="expected images"):
        adapt_images(torch.rand(28, 28), (1, 28, 28))


def test_extractor_gives_features_and_logits_for_any_image_size(tmp_path: Path) -> None:
    path = save_classifier(untrained(), tmp_path / "c.safetensors")
    extractor = build_extractor("classifier", classifier=path)
    features, logits = extractor.extract(torch.rand(5, 3, 32, 32))
    assert features.shape == (5, extractor.num_features) and logits.shape == (5, 10)
    assert extractor.identity == f"classifier-{json.loads((tmp_path / 'c.json').read_text())['sha256'][:16]}"


def test_a_classifier_of_another_dataset_is_refused_with_the_command_to_train_the_right_one(
    tmp_path: Path, mnist_dir: Path
) -> None:
    path = save_classifier(untrained("fashion_mnist"), tmp_path / "fashion.safetensors")
    options = ScoringOptions(classifier=path, cache_dir=tmp_path, metrics=["fid"])
    with pytest.raises(
        ConfigError,
        match=rf"trained on fashion_mnist, but the data is mnist.*palomino classifier train --data mnist --data-dir {mnist_dir}",
    ):
        ScoringContext.prepare(DataConfig(name="mnist", dir=mnist_dir, split="test", size=100), options)
