"""Atomic, checksummed checkpoints: `iter-<n>.safetensors` + `iter-<n>.json`, last K kept.

The JSON sidecar is written last and carries the SHA-256 of the tensors file, so a
checkpoint exists only once both files are complete and agree. A corrupt or partial
checkpoint is skipped (with a warning) in favour of the previous one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from palomino.io import atomic_write

if TYPE_CHECKING:  # torch is imported lazily: the orchestrator stores checkpoints as bytes, torch-free
    import torch

log = logging.getLogger(__name__)
_NAME = re.compile(r"^iter-(\d+)\.json$")
FORMAT = 1


def _meta_digest(meta: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


@dataclass
class Checkpoint:
    iteration: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    path: Path
    payload: bytes = b""


def encode_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})


def write_checkpoint(
    folder: Path, iteration: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any], keep: int
) -> Path:
    return write_checkpoint_bytes(folder, iteration, encode_tensors(tensors), meta, keep)


def write_checkpoint_bytes(folder: Path, iteration: int, payload: bytes, meta: dict[str, Any], keep: int) -> Path:
    """`payload`: the tensors as safetensors bytes (as a cell sends them)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensor_path = folder / f"iter-{iteration}.safetensors"
    atomic_write(tensor_path, payload)
    sidecar = {
        "format": FORMAT,
        "iteration": iteration,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "meta_sha256": _meta_digest(meta),
        "bytes": len(payload),
        "meta": meta,
    }
    atomic_write(folder / f"iter-{iteration}.json", json.dumps(sidecar).encode())
    for old in list_iterations(folder)[keep:]:
        for suffix in (".json", ".safetensors"):
            (folder / f"iter-{old}{suffix}").unlink(missing_ok=True)
    return tensor_path


def list_iterations(folder: Path) -> list[int]:
    """Checkpoint iterations found in `folder`, newest first (validity not checked)."""
    if not folder.is_dir():
        return []
    found = (_NAME.match(p.name) for p in folder.iterdir())
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def read_checkpoint_bytes(folder: Path, iteration: int) -> tuple[bytes, dict[str, Any]]:
    """(safetensors bytes, meta) of one checkpoint, both checksum-verified; ValueError otherwise."""
    sidecar_path = folder / f"iter-{iteration}.json"
    try:
        sidecar = json.loads(sidecar_path.read_text())
        payload = (folder / f"iter-{iteration}.safetensors").read_bytes()
    except (OSError, ValueError) as error:
        raise ValueError(f"{sidecar_path}: unreadable ({error})") from None
    if not isinstance(sidecar, dict) or sidecar.get("format") != FORMAT:
        raise ValueError(f"{sidecar_path}: not a format-{FORMAT} checkpoint")
    if hashlib.sha256(payload).hexdigest() != sidecar.get("sha256"):
        raise ValueError(f"{sidecar_path}: tensors fail their SHA-256 checksum")
    if not isinstance(sidecar.get("meta"), dict) or _meta_digest(sidecar["meta"]) != sidecar.get("meta_sha256"):
        raise ValueError(f"{sidecar_path}: metadata missing or fails its SHA-256 checksum")
    return payload, sidecar["meta"]


def decode_tensors(payload: bytes, where: object = "checkpoint") -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(payload)
    except Exception as error:  # noqa: BLE001 — safetensors raises several types on corrupt input
        raise ValueError(f"{where}: tensors are not valid safetensors ({error})") from None


def read_checkpoint(folder: Path, iteration: int) -> Checkpoint:
    """Load and verify one checkpoint; raises ValueError saying what is wrong with it."""
    payload, meta = read_checkpoint_bytes(folder, iteration)
    path = folder / f"iter-{iteration}.json"
    return Checkpoint(iteration, decode_tensors(payload, path), meta, path)


def newest_valid(folder: Path, at_most: int | None = None, *, raw: bool = False) -> Checkpoint | None:
    """The newest checkpoint (≤ at_most, if given) that verifies; corrupt ones are skipped.

    `raw=True` keeps the tensors as safetensors bytes in `Checkpoint.payload` (no torch needed).
    """
    for iteration in list_iterations(folder):
        if at_most is not None and iteration > at_most:
            continue
        try:
            if raw:
                payload, meta = read_checkpoint_bytes(folder, iteration)
                return Checkpoint(iteration, {}, meta, folder / f"iter-{iteration}.json", payload)
            return read_checkpoint(folder, iteration)
        except ValueError as error:
            log.warning("skipping corrupt checkpoint: %s; trying the previous one", error)
    return None
