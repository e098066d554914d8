"""A cell snapshot: what a cell publishes each iteration and its neighbours train against.

Bytes on the wire: 8-byte little-endian header length, the JSON header, then a
safetensors payload whose SHA-256 and size the header carries. Decoding checks all
of it before a single tensor is trusted.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from palomino.errors import SnapshotError

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_LENGTH = struct.Struct("<Q")
_MAX_HEADER = 1024 * 1024


class IndividualMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")
    learning_rate: float = Field(ge=0)
    fitness: float
    loss: str


class SnapshotHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    experiment: str
    cell: tuple[int, int]
    epoch: int = Field(0, ge=0)
    iteration: int = Field(ge=-1)
    generator: IndividualMeta
    discriminator: IndividualMeta
    mixture: dict[str, float] = Field(default_factory=dict, description="'r-c' → weight")
    score: float | None = None
    checksum: str = ""
    payload_bytes: int = 0


@dataclass
class Snapshot:
    header: SnapshotHeader
    # Keys: "generator.net.<param>", "generator.opt.<i>.<name>", likewise "discriminator.…".
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def iteration(self) -> int:
        return self.header.iteration


def encode_snapshot(snapshot: Snapshot) -> bytes:
    payload = save_tensors({k: v.detach().contiguous().cpu() for k, v in snapshot.tensors.items()})
    header = snapshot.header.model_copy(
        update={"checksum": hashlib.sha256(payload).hexdigest(), "payload_bytes": len(payload)}
    )
    head = header.model_dump_json().encode()
    return _LENGTH.pack(len(head)) + head + payload


def decode_snapshot(body: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Snapshot:
    if len(body) > max_bytes:
        raise SnapshotError(f"snapshot of {len(body)} bytes exceeds the limit of {max_bytes} bytes")
    if len(body) < _LENGTH.size:
        raise SnapshotError("snapshot body is truncated (no header length)")
    (length,) = _LENGTH.unpack_from(body)
    if length > min(_MAX_HEADER, len(body) - _LENGTH.size):
        raise SnapshotError(f"snapshot header length {length} is impossible for a {len(body)}-byte body")
    try:
        header = SnapshotHeader.model_validate(json.loads(body[_LENGTH.size : _LENGTH.size + length]))
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "<root>"
        raise SnapshotError(f"snapshot header is invalid: {field}: {first['msg']}") from None
    except ValueError as error:  # not JSON (json.JSONDecodeError, UnicodeDecodeError)
        raise SnapshotError(f"snapshot header is invalid: not JSON ({error})") from None
    payload = body[_LENGTH.size + length :]
    if len(payload) != header.payload_bytes:
        raise SnapshotError(f"snapshot payload is {len(payload)} bytes, header says {header.payload_bytes}")
    if hashlib.sha256(payload).hexdigest() != header.checksum:
        raise SnapshotError("snapshot payload fails its SHA-256 checksum")
    try:
        tensors = load_tensors(payload)
    except (SafetensorError, ValueError) as error:
        raise SnapshotError(f"snapshot payload is not valid safetensors: {error}") from None
    return Snapshot(header=header, tensors=tensors)
