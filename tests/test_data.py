"""palomino.data: every source on tiny files written here; never the network."""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import struct
import tarfile
import warnings
from pathlib import Path
from types import SimpleNamespace
from urllib.error import URLError

import numpy as np
import pytest
import torch
from PIL import Image

from palomino.data import DATASET_NAMES, Dataset, cifar, fetch, idx, load_dataset, read_idx
from palomino.errors import DatasetError


def cfg(name: str, dir: Path | None = None, **kw: object) -> SimpleNamespace:
    base = dict(split="train", size=0, image_size=None, channels=None, download=False)
    return SimpleNamespace(name=name, dir=dir, **{**base, **kw})


def write_idx(path: Path, array: np.ndarray) -> Path:
    code = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C}[array.dtype]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(body) if path.suffix == ".gz" else body)
    return path


def write_mnist(directory: Path, split: str, n: int, gz: bool = True, seed: int = 0) -> tuple:
    prefix = {"train": "train", "test": "t10k"}[split]
    ext = ".gz" if gz else ""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 4, 4), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / f"{prefix}-images-idx3-ubyte{ext}", images)
    write_idx(directory / f"{prefix}-labels-idx1-ubyte{ext}", labels)
    return images, labels


# --- IDX ----------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path: Path, gz: bool) -> None:
    images, labels = write_mnist(tmp_path, "train", 12, gz=gz)
    images[0, 0, :2] = [0, 255]
    write_idx(tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else "")), images)
    ds = load_dataset(cfg("mnist", tmp_path))
    assert ds.kind == "image" and ds.sample_shape == (1, 4, 4) and len(ds) == 12
    assert ds.samples.dtype == torch.float32 and ds.labels.dtype == torch.int64
    assert ds.samples[0, 0, 0, 0] == -1 and ds.samples[0, 0, 0, 1] == 1
    expected = torch.from_numpy(images.astype(np.float32)) / 127.5 - 1
    assert torch.allclose(ds.samples[:, 0], expected)
    assert ds.labels.tolist() == labels.tolist()
    assert ds.class_names == tuple("0123456789")


def test_idx_dotted_names(tmp_path: Path) -> None:
    # Some mirrors (Kaggle) name the files train-images.idx3-ubyte.
    write_idx(tmp_path / "train-images.idx3-ubyte", np.zeros((3, 2, 2), np.uint8))
    write_idx(tmp_path / "train-labels.idx1-ubyte", np.zeros(3, np.uint8))
    assert len(load_dataset(cfg("fashion_mnist", tmp_path))) == 3


def test_read_idx_generic_dtype(tmp_path: Path) -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3) - 3
    assert (read_idx(write_idx(tmp_path / "a.idx", a)) == a).all()


def test_corrupt_idx_names_file(tmp_path: Path) -> None:
    write_mnist(tmp_path, "train", 5, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-3])  # truncated body
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.*truncated"):
        load_dataset(cfg("mnist", tmp_path))
    path.write_bytes(b"\x12\x34\x08\x03" + bytes(100))  # bad magic
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.*magic"):
        load_dataset(cfg("mnist", tmp_path))


def test_truncated_gzip_names_file(tmp_path: Path) -> None:
    write_mnist(tmp_path, "test", 50)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DatasetError, match="t10k-images-idx3-ubyte.gz"):
        load_dataset(cfg("mnist", tmp_path, split="test"))


def test_label_count_mismatch(tmp_path: Path) -> None:
    write_mnist(tmp_path, "train", 5)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(4, np.uint8))
    with pytest.raises(DatasetError, match="4 labels|\\(4,\\) labels"):
        load_dataset(cfg("mnist", tmp_path))


def test_missing_files_message(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as e:
        load_dataset(cfg("mnist", tmp_path / "nowhere"))
    msg = str(e.value)
    assert str(tmp_path / "nowhere" / "train-images-idx3-ubyte.gz") in msg
    assert str(tmp_path / "nowhere" / "train-labels-idx1-ubyte.gz") in msg
    assert "data.download" in msg and "data.split" not in msg


def test_missing_split_points_to_other(tmp_path: Path) -> None:
    write_mnist(tmp_path, "test", 5)
    only_test = r"(?i)only the test split \(t10k-\*\).*data\.split=test"
    with pytest.raises(DatasetError, match=only_test):
        load_dataset(cfg("mnist", tmp_path))


def test_split_selection(tmp_path: Path) -> None:
    write_mnist(tmp_path, "train", 7)
    write_mnist(tmp_path, "test", 3, gz=False)
    assert len(load_dataset(cfg("mnist", tmp_path, split="train"))) == 7
    assert len(load_dataset(cfg("mnist", tmp_path, split="test"))) == 3
    with pytest.raises(DatasetError, match="split"):
        load_dataset(cfg("mnist", tmp_path, split="valid"))


def test_size_subset_is_seeded(tmp_path: Path) -> None:
    write_mnist(tmp_path, "train", 60)
    full = load_dataset(cfg("mnist", tmp_path))
    a = load_dataset(cfg("mnist", tmp_path, size=10), seed=1)
    b = load_dataset(cfg("mnist", tmp_path, size=10), seed=1)
    c = load_dataset(cfg("mnist", tmp_path, size=10), seed=2)
    assert len(a) == 10 and torch.equal(a.samples, b.samples) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.samples, c.samples)
    # Every kept sample is a real one, with its own label.
    for x, y in zip(a.samples, a.labels):
        i = int((full.samples == x).flatten(1).all(1).nonzero()[0])
        assert full.labels[i] == y
    with pytest.raises(DatasetError, match="only 60"):
        load_dataset(cfg("mnist", tmp_path, size=61))


def test_download_failure_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, timeout: float) -> None:
        raise URLError("no network in tests")

    monkeypatch.setattr(fetch, "urlopen", offline)
    with pytest.raises(DatasetError, match="download failed.*no network") as e:
        load_dataset(cfg("fashion_mnist", tmp_path, split="test", download=True))
    assert str(tmp_path / "t10k-labels-idx1-ubyte.gz") in str(e.value)


def test_download_verifies_md5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = tmp_path / "served"
    write_mnist(served, "test", 4)
    monkeypatch.setattr(
        fetch, "urlopen", lambda url, timeout: io.BytesIO((served / url.rsplit("/", 1)[1]).read_bytes())
    )
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        md5 = hashlib.md5((served / name).read_bytes()).hexdigest()
        monkeypatch.setitem(idx.SOURCES["mnist"].md5, name, md5)
    ds = load_dataset(cfg("mnist", tmp_path / "dl", split="test", download=True))
    assert len(ds) == 4
    # A wrong checksum leaves nothing behind and reports the mismatch.
    monkeypatch.setitem(idx.SOURCES["mnist"].md5, "t10k-images-idx3-ubyte.gz", "0" * 32)
    with pytest.raises(DatasetError, match="md5"):
        load_dataset(cfg("mnist", tmp_path / "dl2", split="test", download=True))
    assert not (tmp_path / "dl2").exists()


def serve(monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes]) -> None:
    """urlopen answers with `files` by name; any other name is a network error."""

    def opened(url: str, timeout: float) -> io.BytesIO:
        name = url.rsplit("/", 1)[1]
        if name not in files:
            raise URLError(f"{name}: connection reset")
        return io.BytesIO(files[name])

    monkeypatch.setattr(fetch, "urlopen", opened)


def test_a_failed_download_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = tmp_path / "served"
    write_mnist(served, "test", 4)
    images = (served / "t10k-images-idx3-ubyte.gz").read_bytes()
    monkeypatch.setitem(idx.SOURCES["mnist"].md5, "t10k-images-idx3-ubyte.gz", hashlib.md5(images).hexdigest())
    serve(monkeypatch, {"t10k-images-idx3-ubyte.gz": images})  # the images come, the labels fail
    # A folder the download would have made: gone again, parents and all.
    target = tmp_path / "new" / "nested" / "mnist"
    with pytest.raises(DatasetError, match="download failed.*connection reset"):
        load_dataset(cfg("mnist", target, split="test", download=True))
    assert not (tmp_path / "new").exists()
    # A folder that was there: only what the download added goes (no images without their labels).
    kept = tmp_path / "kept"
    write_mnist(kept, "train", 3)
    before = sorted(p.name for p in kept.iterdir())
    with pytest.raises(DatasetError, match="download failed"):
        load_dataset(cfg("mnist", kept, split="test", download=True))
    assert sorted(p.name for p in kept.iterdir()) == before


def test_a_failed_cifar_download_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staged = tmp_path / "staged" / "cifar-10-batches-bin"
    write_cifar(staged / "readme.html", [])  # unpacks, but holds no batch
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(staged, arcname="cifar-10-batches-bin")
    serve(monkeypatch, {"cifar-10-binary.tar.gz": buffer.getvalue()})
    monkeypatch.setattr(cifar, "MD5", hashlib.md5(buffer.getvalue()).hexdigest())
    with pytest.raises(DatasetError, match="did not hold cifar-10-batches-bin/test_batch.bin"):
        load_dataset(cfg("cifar10", tmp_path / "dl", split="test", download=True))
    assert not (tmp_path / "dl").exists()


def test_downloading_is_off_unless_asked_and_the_error_says_how_to_get_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from palomino.config import DataConfig

    assert DataConfig().download is False
    monkeypatch.setattr(fetch, "urlopen", lambda url, timeout: pytest.fail(f"downloaded {url}"))
    monkeypatch.setenv("PALOMINO_DATA_DIR", str(tmp_path / "data"))
    for name in ("mnist", "cifar10"):
        with pytest.raises(DatasetError) as e:
            load_dataset(DataConfig(name=name, split="test"))
        message = str(e.value)
        assert "downloading is off (data.download=false)" in message
        assert "data.dir" in message and "$PALOMINO_DATA_DIR/" + name in message and "data.download=true" in message
        assert str(tmp_path / "data" / name) in message  # where the files go
    assert not (tmp_path / "data").exists()


def test_the_data_folder_is_data_dir_else_the_variable_else_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PALOMINO_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert fetch.data_dir("mnist") == tmp_path / "cache" / "palomino" / "mnist"
    monkeypatch.setenv("PALOMINO_DATA_DIR", str(tmp_path / "data"))
    assert fetch.data_dir("mnist") == tmp_path / "data" / "mnist"
    assert fetch.data_dir("mnist", tmp_path / "mine") == tmp_path / "mine"
    # The loaders follow it: with data.dir unset, the files come from $PALOMINO_DATA_DIR/<name>.
    write_mnist(tmp_path / "data" / "mnist", "test", 6)
    assert len(load_dataset(cfg("mnist", None, split="test"))) == 6


def test_real_mnist_test_split(mnist_dir: Path) -> None:
    ds = load_dataset(cfg("mnist", mnist_dir, split="test"))
    assert len(ds) == 10_000 and ds.sample_shape == (1, 28, 28)
    assert ds.samples.min() == -1 and ds.samples.max() == 1
    assert sorted(ds.labels.unique().tolist()) == list(range(10))
    img = ds.to_data_space(ds.samples[:2])
    assert img.min() >= 0 and img.max() <= 1


def test_debian_fashion_mnist(fashion_mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty data folder (no PALOMINO_DATA_DIR, an empty cache): found in /usr/share only.
    monkeypatch.delenv("PALOMINO_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ds = load_dataset(cfg("fashion_mnist", None, split="test"))
    assert len(ds) == 10_000 and ds.sample_shape == (1, 28, 28)
    assert ds.class_names[9] == "Ankle boot"


# --- CIFAR-10 -----------------------------------------------------------------------------


def write_cifar(path: Path, labels: list[int]) -> None:
    records = np.zeros((len(labels), 3073), np.uint8)
    records[:, 0] = labels
    records[:, 1 : 1 + 1024] = 255  # red channel full, green and blue empty
    path.parent.mkdir(parents=True, exist_ok=True)
    records.tofile(path)


def test_cifar_binary(tmp_path: Path) -> None:
    d = tmp_path / "cifar-10-batches-bin"
    for i in range(1, 6):
        write_cifar(d / f"data_batch_{i}.bin", [i, i + 1])
    write_cifar(d / "test_batch.bin", [9, 0, 3])
    train = load_dataset(cfg("cifar10", tmp_path))
    assert len(train) == 10 and train.sample_shape == (3, 32, 32)
    assert train.labels.tolist() == [1, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    assert (train.samples[:, 0] == 1).all() and (train.samples[:, 1:] == -1).all()
    assert train.class_names[0] == "airplane"
    test = load_dataset(cfg("cifar10", d, split="test"))  # the batch folder itself works too
    assert test.labels.tolist() == [9, 0, 3]


def test_cifar_corrupt_and_missing(tmp_path: Path) -> None:
    d = tmp_path / "cifar-10-batches-bin"
    write_cifar(d / "test_batch.bin", [1])
    (d / "test_batch.bin").write_bytes((d / "test_batch.bin").read_bytes()[:-1])
    with pytest.raises(DatasetError, match="test_batch.bin.*3073"):
        load_dataset(cfg("cifar10", tmp_path, split="test"))
    with pytest.raises(DatasetError, match="data_batch_5.bin"):
        load_dataset(cfg("cifar10", tmp_path))


def test_cifar_refuses_pickled_version(tmp_path: Path) -> None:
    py = tmp_path / "cifar-10-batches-py"
    py.mkdir()
    (py / "data_batch_1").write_bytes(b"\x80\x04 not loaded")
    with pytest.raises(DatasetError, match="pickled.*binary version"):
        load_dataset(cfg("cifar10", tmp_path))


# --- image folder -------------------------------------------------------------------------


def make_folder(root: Path) -> None:
    (root / "dogs").mkdir(parents=True)
    (root / "cats").mkdir()
    # 40x20 landscape: black margins that the centre crop must drop, a white 20x20 middle.
    wide = np.zeros((20, 40, 3), np.uint8)
    wide[:, 10:30] = 255
    Image.fromarray(wide).save(root / "cats" / "wide.png")
    Image.new("RGB", (16, 16), (255, 0, 0)).save(root / "dogs" / "red.JPG", quality=100)
    Image.new("L", (9, 9), 0).save(root / "dogs" / "black.jpeg")
    (root / "dogs" / "notes.txt").write_text("not an image")


def test_image_folder_grayscale(tmp_path: Path) -> None:
    make_folder(tmp_path)
    ds = load_dataset(cfg("image_folder", tmp_path, image_size=8, channels=1))
    assert ds.sample_shape == (1, 8, 8) and len(ds) == 3
    assert ds.class_names == ("cats", "dogs") and ds.labels.tolist() == [0, 1, 1]
    assert ds.samples[0].min() > 0.5  # centre crop dropped the black margins (a squash keeps them)
    assert torch.allclose(ds.samples[1], -torch.ones(1, 8, 8), atol=0.02)  # black.jpeg
    assert ds.samples.min() >= -1 and ds.samples.max() <= 1


def test_image_folder_rgb_defaults(tmp_path: Path) -> None:
    make_folder(tmp_path)
    ds = load_dataset(cfg("image_folder", tmp_path, channels=3))
    assert ds.sample_shape == (3, 64, 64)
    red = ds.samples[2]  # dogs/red.JPG sorts after dogs/black.jpeg
    assert red[0].mean() > 0.9 and red[1:].mean() < -0.9
    assert load_dataset(cfg("image_folder", tmp_path)).sample_shape == (1, 64, 64)


def test_image_folder_flat_and_unreadable(tmp_path: Path) -> None:
    for i in range(4):
        Image.new("L", (5, 7), i * 60).save(tmp_path / f"{i}.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG garbage")
    with pytest.warns(UserWarning, match="broken.png"):
        ds = load_dataset(cfg("image_folder", tmp_path, image_size=4))
    assert len(ds) == 4 and ds.labels.tolist() == [0] * 4 and ds.class_names == (tmp_path.name,)
    # A subset skips unreadable files and fills up from the rest of the shuffled order.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sub = load_dataset(cfg("image_folder", tmp_path, image_size=4, size=4), seed=5)
    assert sorted(sub.samples[:, 0, 0, 0].tolist()) == sorted(ds.samples[:, 0, 0, 0].tolist())


def test_image_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="data.dir"):
        load_dataset(cfg("image_folder", None))
    with pytest.raises(DatasetError, match="missing"):
        load_dataset(cfg("image_folder", tmp_path / "missing"))
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(DatasetError, match=str(tmp_path / "empty")):
        load_dataset(cfg("image_folder", tmp_path / "empty"))


# --- toys ---------------------------------------------------------------------------------


def test_gaussian_ring() -> None:
    ds = load_dataset(cfg("gaussian_ring"), seed=0)
    assert ds.kind == "points" and ds.sample_shape == (2,) and len(ds) == 10_000
    assert ds.modes.shape == (8, 2) and ds.mode_std == 0.02
    assert torch.allclose(ds.modes.norm(dim=1), torch.full((8,), 2.0))
    angles = torch.atan2(ds.modes[:, 1], ds.modes[:, 0]).remainder(2 * math.pi)
    assert torch.allclose(angles.sort().values, torch.arange(8) * math.pi / 4, atol=1e-5)


def test_gaussian_grid() -> None:
    ds = load_dataset(cfg("gaussian_grid", size=5000), seed=0)
    assert len(ds) == 5000 and ds.modes.shape == (25, 2) and ds.mode_std == 0.05
    assert {tuple(m) for m in ds.modes.tolist()} == {
        (x, y) for x in (-4.0, -2.0, 0.0, 2.0, 4.0) for y in (-4.0, -2.0, 0.0, 2.0, 4.0)
    }
    assert ds.labels.bincount().tolist() == [200] * 25  # equal mixture


@pytest.mark.parametrize("name", ["gaussian_ring", "gaussian_grid"])
def test_toy_std_and_labels(name: str) -> None:
    ds = load_dataset(cfg(name), seed=3)
    offsets = ds.samples - ds.modes[ds.labels]
    assert abs(offsets.std().item() - ds.mode_std) < 0.05 * ds.mode_std
    assert offsets.abs().max() < 6 * ds.mode_std  # every point sits at its own mode
    assert torch.equal(ds.to_data_space(ds.samples), ds.samples)


def test_toys_are_seeded() -> None:
    a, b = load_dataset(cfg("gaussian_ring"), 7), load_dataset(cfg("gaussian_ring"), 7)
    c = load_dataset(cfg("gaussian_ring"), 8)
    assert torch.equal(a.samples, b.samples) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.samples, c.samples)


# --- the entry point ----------------------------------------------------------------------


def test_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(DatasetError) as e:
        load_dataset(cfg("imagenet"))
    assert all(n in str(e.value) for n in DATASET_NAMES)


def test_dataset_api() -> None:
    ds = Dataset("x", torch.zeros(2, 1, 3, 3), None, "image")
    assert len(ds) == 2 and ds.sample_shape == (1, 3, 3) and ds.modes is None
    assert ds.to_data_space(torch.tensor([-2.0, -1.0, 0.0, 1.0, 3.0])).tolist() == [0, 0, 0.5, 1, 1]
    with pytest.raises(ValueError):
        Dataset("x", torch.zeros(2, 2, dtype=torch.float64), None, "points")


def test_cifar_download_unpacks_binary_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staged = tmp_path / "staged" / "cifar-10-batches-bin"
    for name, labels in [("test_batch.bin", [4, 2]), ("readme.html", [])]:
        write_cifar(staged / name, labels)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(staged, arcname="cifar-10-batches-bin")
    archive = buffer.getvalue()
    monkeypatch.setattr(fetch, "urlopen", lambda url, timeout: io.BytesIO(archive))
    monkeypatch.setattr(cifar, "MD5", hashlib.md5(archive).hexdigest())
    ds = load_dataset(cfg("cifar10", tmp_path / "dl", split="test", download=True))
    assert ds.labels.tolist() == [4, 2]
    assert sorted(p.name for p in (tmp_path / "dl").rglob("*")) == [
        "cifar-10-batches-bin",
        "readme.html",
        "test_batch.bin",
    ]  # the archive itself is removed once unpacked
