"""A cell snapshot: what a cell publishes each iteration and its neighbours train against.

Bytes on the wire: a frame (see frame.py) whose payload is safetensors. Decoding checks
the frame, then the header's schema, then the tensors, before a single one is trusted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
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


class DeferredTensors(Mapping[str, "torch.Tensor"]):
    """A snapshot's tensors, copied on first use: a tile's neighbour reads a cell's individuals
    in place and an in-process bus passes the snapshot on, so most are never read. Safe only
    where what `make` reads is never written after the snapshot (a population's members are
    replaced, not trained in place; networks with moving buffers snapshot eagerly)."""

    def __init__(self, make: Callable[[], dict[str, torch.Tensor]]) -> None:
        self._make: Callable[[], dict[str, torch.Tensor]] | None = make
        self._tensors: dict[str, torch.Tensor] | None = None
        self._lock = threading.Lock()  # a tile's threads may read one snapshot at once: one copy

    def _made(self) -> dict[str, torch.Tensor]:
        with self._lock:
            if self._tensors is None:
                assert self._make is not None
                self._tensors, self._make = self._make(), None
            return self._tensors

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._made()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())


@dataclass
class Snapshot:
    header: SnapshotHeader
    # Keys: "generator.net.<param>", "generator.opt.<i>.<name>", likewise "discriminator.…".
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)

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
