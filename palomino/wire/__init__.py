"""Versioned message schemas and the snapshot codec (JSON header + safetensors, no pickle)."""

from palomino.wire.snapshot import (
    DEFAULT_MAX_BYTES,
    IndividualMeta,
    Snapshot,
    SnapshotHeader,
    decode_snapshot,
    encode_snapshot,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "IndividualMeta",
    "Snapshot",
    "SnapshotHeader",
    "decode_snapshot",
    "encode_snapshot",
]
