"""`palomino classifier train|import`: the small CNN behind the classifier and lipizzaner extractors."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from palomino.cli.main_app import stderr
from palomino.errors import ConfigError, describe_validation


def train(
    data: Literal["mnist", "fashion_mnist", "cifar10", "image_folder"] = typer.Option(
        ..., "--data", help="A labelled image dataset."
    ),
    out: Path = typer.Option(..., "--out", help="FILE.safetensors (metadata beside it in FILE.json)."),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Where the dataset's files are (default: $PALOMINO_DATA_DIR/NAME, else the user cache).",
    ),
    download: bool = typer.Option(False, "--download", help="Download MNIST / Fashion-MNIST / CIFAR-10 when absent."),
    epochs: int | None = typer.Option(
        None, "--epochs", min=1, help="Default: about 150,000 images' worth, 5 to 30 epochs."
    ),
    holdout: int = typer.Option(2000, "--holdout", min=1, help="Test images held out when only one split is present."),
    train_size: int = typer.Option(0, "--train-size", min=0, help="Train on this many images (0 = all)."),
    test_size: int = typer.Option(0, "--test-size", min=0, help="Test on this many images (0 = all)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the initial weights and the data split."),
    arch: Literal["cnn", "lipizzaner"] = typer.Option(
        "cnn", "--arch", help="cnn: Palomino's own; lipizzaner: Lipizzaner's MNIST CNN (its logits the features)."
    ),
) -> None:
    """Train the classifier, report its test accuracy, save it; prints the file last."""
    from pydantic import ValidationError

    from palomino.config import DataConfig

    if out.suffix != ".safetensors":
        raise ConfigError(f"--out {out}: the classifier file must end in .safetensors")
    try:
        config = DataConfig(name=data, dir=data_dir, download=download)
    except ValidationError as error:
        flags = {"name": f"--data {data}", "dir": "--data-dir"}
        raise ConfigError(describe_validation(error, lambda field: flags.get(field, field))) from None
    from palomino.scoring.classifier import save_classifier, train_classifier  # torch: after the usage errors

    def on_epoch(epoch: int, total: int, loss: float) -> None:
        stderr.print(f"epoch {epoch}/{total}: loss {loss:.4f}", highlight=False)

    trained = train_classifier(
        config,
        seed=seed,
        epochs=epochs,
        holdout=holdout,
        train_size=train_size,
        test_size=test_size,
        arch=arch,
        on_epoch=on_epoch,
    )
    save_classifier(trained, out)
    meta = trained.meta
    stderr.print(
        f"{meta['dataset']}: test accuracy {meta['accuracy']:.2%} on {meta['test_size']:,} images "
        f"(trained on {meta['train_size']:,}, {meta['epochs']} epochs, {meta['seconds']:.0f} s; {meta['split']})",
        highlight=False,
        soft_wrap=True,
    )
    print(out)


def import_weights(
    weights: Path = typer.Option(
        ..., "--weights", help="Lipizzaner's MNIST CNN weights: .safetensors, or a PyTorch state dict (.pt/.pkl)."
    ),
    data: Literal["mnist", "fashion_mnist"] = typer.Option(..., "--data", help="The dataset they were trained on."),
    out: Path = typer.Option(..., "--out", help="FILE.safetensors (metadata beside it in FILE.json)."),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Where the dataset's files are (default: $PALOMINO_DATA_DIR/NAME, else the user cache).",
    ),
    holdout: int = typer.Option(2000, "--holdout", min=1, help="Test images held out when only one split is present."),
    test_size: int = typer.Option(0, "--test-size", min=0, help="Test on this many images (0 = all)."),
) -> None:
    """Take Lipizzaner's MNIST CNN weights trained elsewhere (every tensor's shape checked), test them, save
    them as a classifier for --extractor lipizzaner; prints the file last."""
    from pydantic import ValidationError

    from palomino.config import DataConfig
    from palomino.scoring.classifier import import_classifier, save_classifier

    if out.suffix != ".safetensors":
        raise ConfigError(f"--out {out}: the classifier file must end in .safetensors")
    try:
        config = DataConfig(name=data, dir=data_dir)
    except ValidationError as error:
        flags = {"name": f"--data {data}", "dir": "--data-dir"}
        raise ConfigError(describe_validation(error, lambda field: flags.get(field, field))) from None
    imported = import_classifier(weights, config, holdout=holdout, test_size=test_size)
    save_classifier(imported, out)
    accuracy = imported.meta["accuracy"]
    stderr.print(
        f"{data}: test accuracy {accuracy:.2%} on {imported.meta['test_size']:,} images",
        highlight=False,
        soft_wrap=True,
    )
    if accuracy < 0.9:  # trained on its data, this network classifies 97–99 %: far below, wrong data or input range
        stderr.print(
            f"warning: {weights} classifies only {accuracy:.0%} of {data}'s test images: are they Lipizzaner's "
            f"{data} weights, trained on images in [-1, 1]?",
            highlight=False,
            soft_wrap=True,
        )
    print(out)
