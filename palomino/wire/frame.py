"""Framing shared by every message with a binary payload: length-prefixed JSON header + payload.

    <8-byte little-endian header length> <JSON header> <payload>

The header carries the payload's size and SHA-256; `unpack` checks the size limit, the
lengths, the JSON and the checksum before anything in the body is trusted.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from palomino.errors import SnapshotError, describe_validation

T = TypeVar("T")

LENGTH = struct.Struct("<Q")
MAX_HEADER = 1024 * 1024
MAX_DEPTH = 64  # far above any real header (a config nests 4 deep); json recurses once per level

# A JSON string (possessive: no backtracking), a bracket, or a quote that opens no complete string.
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}]|"', re.S)


def json_depth_ok(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether `data` nests no deeper than `limit` (brackets inside strings do not count).
    Linear in len(data), and it stops at the first level too deep."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return True
    depth = 0
    for token in _TOKEN.finditer(data):
        char = token.group()
        if char in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return False
        elif char in (b"]", b"}"):
            depth -= 1
        elif char == b'"':
            return True  # an unterminated string: json.loads refuses it at once
    return True


def load_json(data: bytes | str, what: str, **options: Any) -> Any:
    """json.loads for bytes off the network: depth-bounded first, and every failure a SnapshotError."""
    raw = data.encode() if isinstance(data, str) else data
    if not json_depth_ok(raw):
        raise SnapshotError(f"{what} is invalid: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(raw, **options)
    except (ValueError, RecursionError, MemoryError) as error:  # not JSON (JSONDecodeError, UnicodeDecodeError)
        raise SnapshotError(f"{what} is invalid: not JSON ({type(error).__name__}: {str(error)[:200]})") from None


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
    header = load_json(body[LENGTH.size : LENGTH.size + length], f"{what} header")
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


def unpack_message(
    body: bytes, validate: Callable[[dict[str, Any]], T], *, max_bytes: int, what: str
) -> tuple[T, bytes]:
    """`unpack`, then the header (less the framing fields) through a pydantic validator."""
    raw, payload = unpack(body, max_bytes=max_bytes, what=what)
    raw.pop("checksum", None)
    raw.pop("payload_bytes", None)
    try:
        return validate(raw), payload
    except ValidationError as error:
        raise SnapshotError(f"{what} is invalid: {describe_validation(error)}") from None
