"""Framing shared by every message with a binary payload: length-prefixed JSON header + payload.

    <8-byte little-endian header length> <JSON header> <payload>

The header carries the payload's size and SHA-256; `unpack` checks the size limit, the
lengths, the JSON and the checksum before anything in the body is trusted.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Callable, TypeVar

from pydantic import ValidationError

from palomino.errors import SnapshotError, describe_validation

T = TypeVar("T")

LENGTH = struct.Struct("<Q")
MAX_HEADER = 1024 * 1024


def pack(header: dict[str, Any], payload: bytes = b"") -> bytes:
    header = {**header, "checksum": hashlib.sha256(payload).hexdigest(), "payload_bytes": len(payload)}
    head = json.dumps(header, allow_nan=False).encode()
    return LENGTH.pack(len(head)) + head + payload


def unpack(body: bytes, *, max_bytes: int, what: str = "message") -> tuple[dict[str, Any], bytes]:
    if len(body) > max_bytes:
        raise SnapshotError(f"{what} of {len(body)} bytes exceeds the limit of {max_bytes} bytes")
    if len(body) < LENGTH.size:
        raise SnapshotError(f"{what} body is truncated (no header length)")
    (length,) = LENGTH.unpack_from(body)
    if length > min(MAX_HEADER, len(body) - LENGTH.size):
        raise SnapshotError(f"{what} header length {length} is impossible for a {len(body)}-byte body")
    try:
        header = json.loads(body[LENGTH.size : LENGTH.size + length])
    except ValueError as error:  # not JSON (json.JSONDecodeError, UnicodeDecodeError)
        raise SnapshotError(f"{what} header is invalid: not JSON ({error})") from None
    if not isinstance(header, dict):
        raise SnapshotError(f"{what} header is invalid: not a JSON object")
    for field, kind in (("payload_bytes", int), ("checksum", str)):
        if not isinstance(header.get(field), kind):
            raise SnapshotError(f"{what} header is invalid: {field}: missing or not a {kind.__name__}")
    payload = body[LENGTH.size + length :]
    if len(payload) != header.get("payload_bytes"):
        raise SnapshotError(f"{what} payload is {len(payload)} bytes, header says {header.get('payload_bytes')}")
    if hashlib.sha256(payload).hexdigest() != header.get("checksum"):
        raise SnapshotError(f"{what} payload fails its SHA-256 checksum")
    return header, payload


def unpack_message(body: bytes, validate: Callable[[dict[str, Any]], T], *, max_bytes: int, what: str) -> tuple[T, bytes]:
    """`unpack`, then the header (less the framing fields) through a pydantic validator."""
    raw, payload = unpack(body, max_bytes=max_bytes, what=what)
    raw.pop("checksum", None)
    raw.pop("payload_bytes", None)
    try:
        return validate(raw), payload
    except ValidationError as error:
        raise SnapshotError(f"{what} is invalid: {describe_validation(error)}") from None
