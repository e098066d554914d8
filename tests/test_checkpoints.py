"""Checkpoints: atomic, checksummed, last K kept; a corrupt newest one falls back to the previous."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from palomino.runs.checkpoints import list_iterations, newest_valid, read_checkpoint, write_checkpoint

LOGGER = "palomino.runs.checkpoints"


def state(iteration: int) -> tuple[dict[str, torch.Tensor], dict]:
    g = torch.Generator().manual_seed(iteration)
    tensors = {
        "generator.0.net.weight": torch.randn(8, 4, generator=g),
        "generator.0.opt.0.step": torch.tensor(float(iteration)),
        "data.order": torch.randperm(50, generator=g),
        "rng.torch": torch.randint(0, 255, (32,), dtype=torch.uint8, generator=g),
        "view": torch.randn(4, 4, generator=g).t(),  # non-contiguous input
    }
    meta = {
        "iteration": iteration,
        "cursor": 7 * iteration,
        "rng": {"state": 2**100 + iteration},
        "mixture": {"0-0": 1.0},
    }
    return tensors, meta


def write(folder: Path, iterations: list[int], keep: int = 100) -> None:
    for iteration in iterations:
        write_checkpoint(folder, iteration, *state(iteration), keep=keep)


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def test_round_trip(tmp_path: Path) -> None:
    tensors, meta = state(5)
    path = write_checkpoint(tmp_path / "ck", 5, tensors, meta, keep=3)
    assert path == tmp_path / "ck" / "iter-5.safetensors"
    assert (tmp_path / "ck" / "iter-5.json").is_file()
    checkpoint = read_checkpoint(tmp_path / "ck", 5)
    assert checkpoint.iteration == 5
    assert checkpoint.meta == meta  # big ints (numpy bit-generator state) survive JSON
    assert checkpoint.tensors.keys() == tensors.keys()
    for key, value in tensors.items():
        assert checkpoint.tensors[key].dtype == value.dtype
        assert torch.equal(checkpoint.tensors[key], value), key


def test_no_temporary_files_left(tmp_path: Path) -> None:
    write(tmp_path, [1, 2])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "iter-1.json", "iter-1.safetensors", "iter-2.json", "iter-2.safetensors"
    ]  # fmt: skip


def test_sidecar_carries_the_checksum(tmp_path: Path) -> None:
    import hashlib

    write(tmp_path, [3])
    sidecar = json.loads((tmp_path / "iter-3.json").read_text())
    payload = (tmp_path / "iter-3.safetensors").read_bytes()
    assert sidecar["sha256"] == hashlib.sha256(payload).hexdigest()
    assert sidecar["iteration"] == 3 and sidecar["bytes"] == len(payload)


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_last_k_kept(tmp_path: Path, keep: int) -> None:
    write(tmp_path, [2, 4, 6, 8, 10], keep=keep)
    expected = [10, 8, 6][:keep]
    assert list_iterations(tmp_path) == expected
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(f"iter-{i}{s}" for i in expected for s in (".json", ".safetensors"))


def test_list_iterations_is_numeric_newest_first(tmp_path: Path) -> None:
    write(tmp_path, [9, 10, 100, 2])
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "iter-x.json").write_text("{}")
    assert list_iterations(tmp_path) == [100, 10, 9, 2]
    assert list_iterations(tmp_path / "missing") == []


def test_newest_valid_is_the_newest(tmp_path: Path) -> None:
    write(tmp_path, [1, 2, 3])
    assert newest_valid(tmp_path).iteration == 3
    assert newest_valid(tmp_path / "missing") is None


def test_at_most(tmp_path: Path) -> None:
    write(tmp_path, [2, 4, 6])
    assert newest_valid(tmp_path, at_most=6).iteration == 6
    assert newest_valid(tmp_path, at_most=5).iteration == 4
    assert newest_valid(tmp_path, at_most=4).iteration == 4
    assert newest_valid(tmp_path, at_most=2).iteration == 2
    assert newest_valid(tmp_path, at_most=1) is None
    assert newest_valid(tmp_path, at_most=0) is None


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_flipped_tensor_bytes_fall_back_to_the_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    write(tmp_path, [1, 2, 3])
    path = tmp_path / "iter-3.safetensors"
    size = path.stat().st_size
    flip_byte(path, {"first": 0, "middle": size // 2, "last": size - 1}[where])
    with pytest.raises(ValueError, match="checksum"):
        read_checkpoint(tmp_path, 3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        checkpoint = newest_valid(tmp_path)
    assert checkpoint is not None and checkpoint.iteration == 2
    assert torch.equal(checkpoint.tensors["generator.0.net.weight"], state(2)[0]["generator.0.net.weight"])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "iter-3" in warnings[0].getMessage() and "corrupt" in warnings[0].getMessage()


@pytest.mark.parametrize("keep_bytes", [0, 1, 20, -1])
def test_truncated_sidecar_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture, keep_bytes: int) -> None:
    write(tmp_path, [1, 2, 3])
    sidecar = tmp_path / "iter-3.json"
    text = sidecar.read_bytes()
    sidecar.write_bytes(text[:keep_bytes] if keep_bytes >= 0 else text[: len(text) // 2])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        checkpoint = newest_valid(tmp_path)
    assert checkpoint is not None and checkpoint.iteration == 2
    assert any("iter-3" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_truncated_tensors_fall_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, [1, 2])
    path = tmp_path / "iter-2.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert newest_valid(tmp_path).iteration == 1
    assert caplog.records


def test_missing_tensor_file_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, [1, 2])
    (tmp_path / "iter-2.safetensors").unlink()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert newest_valid(tmp_path).iteration == 1
    assert any("iter-2" in r.getMessage() for r in caplog.records)


def test_tensors_without_sidecar_are_not_a_checkpoint(tmp_path: Path) -> None:
    # A writer killed between the two files leaves tensors without their sidecar.
    write(tmp_path, [1, 2])
    (tmp_path / "iter-2.json").unlink()
    assert list_iterations(tmp_path) == [1]
    assert newest_valid(tmp_path).iteration == 1


def test_wrong_format_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, [1, 2])
    sidecar = tmp_path / "iter-2.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "format": 99}))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert newest_valid(tmp_path).iteration == 1


def test_every_checkpoint_corrupt_gives_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, [1, 2, 3])
    for i in (1, 2, 3):
        flip_byte(tmp_path / f"iter-{i}.safetensors", 50)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert newest_valid(tmp_path) is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 3


def test_corrupt_and_at_most_combine(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, [2, 4, 6])
    flip_byte(tmp_path / "iter-4.safetensors", 10)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert newest_valid(tmp_path, at_most=5).iteration == 2
        assert newest_valid(tmp_path).iteration == 6


def test_sidecar_with_a_flipped_key_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, [1, 2])
    sidecar = tmp_path / "iter-2.json"
    text = sidecar.read_bytes()
    position = text.index(b'"meta"') + 2  # the 'e' of "meta"
    flip = bytearray(text)
    flip[position] ^= 0x01  # 'e' → 'd': still valid JSON
    sidecar.write_bytes(bytes(flip))
    json.loads(sidecar.read_text())  # the corruption is not a JSON syntax error
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        checkpoint = newest_valid(tmp_path)
    assert checkpoint is not None and checkpoint.iteration == 1
