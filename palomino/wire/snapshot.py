"""A cell snapshot: what a cell publishes each iteration and its neighbours train against.

Bytes on the wire: a frame (see frame.py) whose payload is safetensors. Decoding checks
the frame, then the header's schema, then the tensors, before a single one is trusted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from palomino.errors import SnapshotError, describe_validation
from palomino.wire import frame

if TYPE_CHECKING:  # torch loads only where tensors are (de)coded: torch-free services import this module
    import torch

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


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
    from safetensors.torch import save as save_tensors

    payload = save_tensors({k: v.detach().contiguous().cpu() for k, v in snapshot.tensors.items()})
    return frame.pack(snapshot.header.model_dump(mode="json", exclude={"checksum", "payload_bytes"}), payload)


def decode_snapshot(body: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Snapshot:
    raw, payload = frame.unpack(body, max_bytes=max_bytes, what="snapshot")
    try:
        header = SnapshotHeader.model_validate(raw)
    except ValidationError as error:
        raise SnapshotError(f"snapshot header is invalid: {describe_validation(error)}") from None
    from safetensors import SafetensorError
    from safetensors.torch import load as load_tensors

    try:
        tensors = load_tensors(payload)
    except (SafetensorError, ValueError) as error:
        raise SnapshotError(f"snapshot payload is not valid safetensors: {error}") from None
    return Snapshot(header=header, tensors=tensors)
