"""The `lipizzaner` classifier: Lipizzaner's MNIST CNN (palomino.scoring.lipizzaner_protocol) — its layers'
shapes and input range, training on real MNIST digits, save → load giving identical features,
weights from a user's file (safetensors or a PyTorch state dict) checked tensor by tensor, and
`palomino classifier train --arch lipizzaner` / `classifier import` / `palomino score --extractor lipizzaner`
end to end on a small subset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import last_line, palomino, tiny, write_yaml
from safetensors.torch import load_file, save_file

from palomino.config import DataConfig
from palomino.errors import PalominoError
from palomino.scoring.classifier import (
    TrainedClassifier,
    import_classifier,
    load_classifier,
    save_classifier,
    train_classifier,
)
from palomino.scoring.extractors import build_extractor
from palomino.scoring.lipizzaner_protocol import LipizzanerNet

SHAPES = {  # Lipizzaner's MNIST CNN, tensor by tensor
    "conv1.weight": (10, 1, 5, 5),
    "conv1.bias": (10,),
    "conv2.weight": (20, 10, 5, 5),
    "conv2.bias": (20,),
    "fc1.weight": (50, 320),
    "fc1.bias": (50,),
    "fc2.weight": (10, 50),
    "fc2.bias": (10,),
}


@pytest.fixture(scope="module")
def mnist(mnist_dir: Path) -> DataConfig:
    return DataConfig(name="mnist", dir=mnist_dir, split="test")


@pytest.fixture(scope="module")
def trained(mnist: DataConfig) -> TrainedClassifier:
    """Lipizzaner's CNN trained on 2,000 real digits for 3 epochs (seconds)."""
    return train_classifier(mnist, arch="lipizzaner", train_size=2000, test_size=500, epochs=3)


def test_the_layers_have_lipizzaners_shapes_and_names() -> None:
    net = LipizzanerNet().eval()
    assert {name: tuple(t.shape) for name, t in net.state_dict().items()} == SHAPES
    seen: dict[str, tuple[int, ...]] = {}
    for name in ("conv1", "conv2", "fc1", "fc2"):
        getattr(net, name).register_forward_hook(lambda _m, _i, out, name=name: seen.update({name: tuple(out.shape)}))
    features, logits = net.features_and_logits(torch.rand(3, 1, 28, 28))
    assert seen == {"conv1": (3, 10, 24, 24), "conv2": (3, 20, 8, 8), "fc1": (3, 50), "fc2": (3, 10)}
    assert torch.equal(features, logits) and net.num_features == 10  # the 10 logits are the features


def test_images_in_0_1_reach_the_layers_in_minus_1_1() -> None:
    """What Palomino's extractors hand over ([0, 1]) is what Lipizzaner fed its classifier ([−1, 1])."""
    torch.manual_seed(0)
    net = LipizzanerNet().eval()
    images = torch.rand(4, 1, 28, 28)
    x = images * 2 - 1
    x = F.relu(F.max_pool2d(F.conv2d(x, net.conv1.weight, net.conv1.bias), 2))
    x = F.relu(F.max_pool2d(F.conv2d(x, net.conv2.weight, net.conv2.bias), 2))
    x = F.relu(F.linear(x.view(-1, 320), net.fc1.weight, net.fc1.bias))
    assert torch.allclose(net(images), F.linear(x, net.fc2.weight, net.fc2.bias), atol=1e-6)


def test_it_learns_digits_well_above_chance(trained: TrainedClassifier) -> None:
    meta = trained.meta
    assert meta["accuracy"] > 0.6, meta  # chance is 0.1; about 0.8 after 3 epochs of 2,000 digits
    assert meta["architecture"] == {"name": "lipizzaner", "features": "logits"} and trained.arch == "lipizzaner"
    assert meta["image_shape"] == [1, 28, 28] and meta["train_size"] == 2000 and meta["test_size"] == 500


def test_save_then_load_gives_identical_features(trained: TrainedClassifier, tmp_path: Path) -> None:
    path = save_classifier(trained, tmp_path / "lipizzaner.safetensors")
    assert json.loads(path.with_suffix(".json").read_text())["architecture"]["name"] == "lipizzaner"
    images = torch.rand(32, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    expected = trained.net.eval().features_and_logits(images)
    assert torch.equal(load_classifier(path).net.features_and_logits(images)[0], expected[0])
    for name in ("lipizzaner", "classifier"):  # either name takes a lipizzaner file; the file says what it is
        extractor = build_extractor(name, classifier=path)
        features, logits = extractor.extract(images)
        assert torch.equal(features, expected[0]) and torch.equal(logits, expected[1])
        assert extractor.num_features == 10 and extractor.identity.startswith("lipizzaner-")
        assert extractor.name == "lipizzaner" and extractor.dataset == "mnist"


def test_the_cnn_default_is_refused_as_lipizzaner(tmp_path: Path, mnist: DataConfig) -> None:
    cnn = train_classifier(mnist, train_size=200, test_size=100, epochs=1)
    assert cnn.meta["architecture"]["name"] == "cnn"  # the default stays Palomino's own CNN
    path = save_classifier(cnn, tmp_path / "cnn.safetensors")
    with pytest.raises(PalominoError, match=r"cnn\.safetensors is a cnn classifier.*--arch lipizzaner"):
        build_extractor("lipizzaner", classifier=path)


def test_weights_from_a_users_file_load_as_they_are(
    trained: TrainedClassifier, mnist: DataConfig, tmp_path: Path
) -> None:
    """Lipizzaner's names are the file's names: a state dict saved by Lipizzaner's code, converted or not."""
    state = {k: v.clone() for k, v in trained.net.state_dict().items()}
    save_file(state, tmp_path / "theirs.safetensors")
    torch.save(state, tmp_path / "theirs.pt")
    images = torch.rand(16, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    accuracies = set()
    for name in ("theirs.safetensors", "theirs.pt"):
        imported = import_classifier(tmp_path / name, mnist, test_size=500)
        assert torch.equal(imported.net(images), trained.net(images))
        assert imported.meta["imported_from"]["file"] == name and imported.meta["train_size"] is None
        accuracies.add(imported.meta["accuracy"])
    assert len(accuracies) == 1 and accuracies.pop() > 0.6  # measured on real test digits, as trained ones are


def test_wrong_shapes_are_refused_naming_the_file_and_the_tensor(
    trained: TrainedClassifier, mnist: DataConfig, tmp_path: Path
) -> None:
    state = {k: v.clone() for k, v in trained.net.state_dict().items()}
    wrong = tmp_path / "wrong.safetensors"
    save_file({**state, "fc1.weight": torch.zeros(50, 300)}, wrong)
    with pytest.raises(
        PalominoError,
        match=rf"{wrong}: tensor fc1\.weight is torch\.float32 of shape \(50, 300\), but Lipizzaner's MNIST CNN needs "
        r"torch\.float32 of shape \(50, 320\)",
    ):
        import_classifier(wrong, mnist, test_size=10)
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in state.items() if k != "conv2.bias"}, missing)
    with pytest.raises(PalominoError, match=rf"{missing}: no tensor conv2\.bias of shape \(20,\)"):
        import_classifier(missing, mnist, test_size=10)
    extra = tmp_path / "extra.safetensors"
    save_file({**state, "fc3.weight": torch.zeros(10, 10)}, extra)
    with pytest.raises(PalominoError, match=rf"{extra}: tensor fc3\.weight is not one of Lipizzaner's MNIST CNN's"):
        import_classifier(extra, mnist, test_size=10)
    (tmp_path / "pickle.pt").write_bytes(b"not a state dict")
    with pytest.raises(PalominoError, match="not a safetensors file or a PyTorch state dict"):
        import_classifier(tmp_path / "pickle.pt", mnist, test_size=10)

    # A saved classifier whose weights were replaced (the checksum updated with them) is refused the same way.
    path = save_classifier(trained, tmp_path / "saved.safetensors")
    save_file({**state, "conv1.weight": torch.zeros(10, 1, 3, 3)}, path)
    meta = json.loads(path.with_suffix(".json").read_text())
    import hashlib

    meta["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(
        PalominoError, match=rf"{path}: tensor conv1\.weight .* shape \(10, 1, 3, 3\), but .* \(10, 1, 5, 5\)"
    ):
        load_classifier(path)


def test_the_command_line_trains_imports_and_scores_with_lipizzaners_cnn(mnist_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "lipizzaner.safetensors"
    done = palomino(
        "classifier", "train", "--arch", "lipizzaner", "--data", "mnist", "--data-dir", mnist_dir, "--out", out,
        "--train-size", "1500", "--test-size", "500", "--epochs", "2", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert last_line(done.stdout) == str(out) and "test accuracy" in done.stderr
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["architecture"]["name"] == "lipizzaner" and meta["accuracy"] > 0.5 and meta["train_size"] == 1500

    # Its weights as a user's file, imported; with one tensor of the wrong shape, refused by name (exit 1).
    theirs = tmp_path / "theirs.safetensors"
    save_file(load_file(out), theirs)
    imported = tmp_path / "imported.safetensors"
    args = ("classifier", "import", "--data", "mnist", "--data-dir", mnist_dir, "--test-size", "300")
    done = palomino(*args, "--weights", theirs, "--out", imported, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert last_line(done.stdout) == str(imported) and "test accuracy" in done.stderr
    save_file({**load_file(out), "fc2.weight": torch.zeros(10, 40)}, theirs)
    done = palomino(*args, "--weights", theirs, "--out", tmp_path / "bad.safetensors", cwd=tmp_path)
    assert done.returncode == 1 and f"{theirs}: tensor fc2.weight" in done.stderr and "(10, 50)" in done.stderr

    config = write_yaml(
        tmp_path / "mnist.yaml",
        tiny(
            name="mnist-tiny",
            grid={"rows": 1, "cols": 1},
            training={"iterations": 1, "batches_per_iteration": 2, "checkpoint_every": 0, "sample_every": 0},
            data={"name": "mnist", "dir": str(mnist_dir), "split": "test", "size": 500},
            network={"name": "mlp", "hidden": 16, "latent_dim": 8},
        ),
    )
    trained = palomino("train", config, "--out", tmp_path / "runs", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = Path(last_line(trained.stdout))
    scoring = ("score", run, "--samples", "300", "--real-samples", "500", "--cache-dir", tmp_path / "cache")
    done = palomino(*scoring, "--extractor", "lipizzaner", "--classifier", out, "--workers", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((run / "scores.json").read_text())
    assert report["extractor"].startswith("lipizzaner-") and report["options"]["extractor"] == "lipizzaner"
    metrics = report["best"]["metrics"]
    assert metrics["fid"]["value"] > 0 and 0 <= metrics["tvd"]["value"] <= 1
    # memorization: against the run's 500 training digits, calibrated by others of the test split
    assert metrics["memorization"]["training_images"] == 500 and metrics["memorization"]["held_out_images"] == 2000
    assert metrics["memorization"]["value"] > 1  # one iteration of a tiny GAN makes noise, not copies
    assert "memorization ratio" in done.stdout and "FID" in done.stdout

    # Palomino's own CNN is no Lipizzaner classifier: a configuration error (exit 2) naming the flag to use.
    cnn = save_classifier(
        train_classifier(DataConfig(name="mnist", dir=mnist_dir), train_size=200, test_size=100, epochs=1),
        tmp_path / "cnn.safetensors",
    )
    done = palomino(*scoring, "--extractor", "lipizzaner", "--classifier", cnn, cwd=tmp_path)
    assert done.returncode == 2 and "is a cnn classifier" in done.stderr and "--arch lipizzaner" in done.stderr
