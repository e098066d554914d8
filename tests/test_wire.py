"""The snapshot codec: a lossless round trip, and every malformed body refused with a clear SnapshotError."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from palomino.errors import PalominoError, SnapshotError
from palomino.wire import DEFAULT_MAX_BYTES, IndividualMeta, Snapshot, SnapshotHeader, decode_snapshot, encode_snapshot

LENGTH = struct.Struct("<Q")


def make_snapshot(iteration: int = 3) -> Snapshot:
    g = torch.Generator().manual_seed(0)
    header = SnapshotHeader(
        experiment="exp-1",
        cell=(1, 2),
        epoch=4,
        iteration=iteration,
        generator=IndividualMeta(learning_rate=2e-4, fitness=-0.75, loss="nonsaturating"),
        discriminator=IndividualMeta(learning_rate=1e-4, fitness=1.25, loss="wgan_gp"),
        mixture={"1-2": 0.5, "0-2": 0.25, "1-0": 0.25},
        score=0.0123,
    )
    tensors = {
        "generator.net.net.0.weight": torch.randn(16, 8, generator=g),
        "generator.net.net.0.bias": torch.randn(16, generator=g),
        "generator.opt.0.step": torch.tensor(12.0),
        "discriminator.net.net.0.weight": torch.randn(4, 4, generator=g).t(),  # non-contiguous
        "discriminator.opt.0.exp_avg": torch.randn(3, 5, generator=g, dtype=torch.float64),
        "discriminator.bn.num_batches_tracked": torch.tensor(7, dtype=torch.int64),
        "half": torch.randn(6, generator=g).to(torch.bfloat16),
        "special": torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45]),
    }
    return Snapshot(header, tensors)


def split(body: bytes) -> tuple[dict, bytes]:
    (length,) = LENGTH.unpack_from(body)
    return json.loads(body[LENGTH.size : LENGTH.size + length]), body[LENGTH.size + length :]


def join(header: dict | bytes, payload: bytes) -> bytes:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return LENGTH.pack(len(head)) + head + payload


def test_round_trip_is_bit_identical() -> None:
    snapshot = make_snapshot()
    decoded = decode_snapshot(encode_snapshot(snapshot))
    assert decoded.tensors.keys() == snapshot.tensors.keys()
    for key, original in snapshot.tensors.items():
        got = decoded.tensors[key]
        assert got.dtype == original.dtype and got.shape == original.shape, key
        # Bit-identical, NaN and signed zeros included.
        assert (
            got.reshape(-1).view(torch.uint8).tolist() == original.contiguous().reshape(-1).view(torch.uint8).tolist()
        ), key
    expected_header = snapshot.header.model_dump(exclude={"checksum", "payload_bytes"})
    assert decoded.header.model_dump(exclude={"checksum", "payload_bytes"}) == expected_header
    assert decoded.header.payload_bytes > 0 and len(decoded.header.checksum) == 64
    assert decoded.iteration == 3


def test_encoding_is_deterministic_and_does_not_change_the_input() -> None:
    snapshot = make_snapshot()
    before = snapshot.header.model_copy()
    assert encode_snapshot(snapshot) == encode_snapshot(make_snapshot())
    assert snapshot.header == before  # checksum and size go into a copy


def test_re_encoding_a_decoded_snapshot_gives_the_same_bytes() -> None:
    body = encode_snapshot(make_snapshot())
    assert encode_snapshot(decode_snapshot(body)) == body


def test_empty_snapshot_round_trips() -> None:
    snapshot = make_snapshot(iteration=-1)
    snapshot.tensors = {}
    decoded = decode_snapshot(encode_snapshot(snapshot))
    assert decoded.tensors == {} and decoded.iteration == -1


def test_snapshot_error_is_a_palomino_error() -> None:
    assert issubclass(SnapshotError, PalominoError)


# --- malformed bodies ---------------------------------------------------------------------------


def test_flipped_payload_byte_fails_the_checksum() -> None:
    body = bytearray(encode_snapshot(make_snapshot()))
    for position in (len(body) - 1, len(body) - 200, len(body) - 2000):
        corrupt = bytearray(body)
        corrupt[position] ^= 0x01
        with pytest.raises(SnapshotError, match="checksum"):
            decode_snapshot(bytes(corrupt))


@pytest.mark.parametrize("cut", [1, 100, 1000])
def test_truncated_payload(cut: int) -> None:
    body = encode_snapshot(make_snapshot())
    with pytest.raises(SnapshotError, match=r"payload is \d+ bytes, header says \d+"):
        decode_snapshot(body[:-cut])


def test_extra_trailing_bytes() -> None:
    with pytest.raises(SnapshotError, match="header says"):
        decode_snapshot(encode_snapshot(make_snapshot()) + b"\x00")


@pytest.mark.parametrize("body", [b"", b"\x01", b"1234567"])
def test_body_shorter_than_the_length_prefix(body: bytes) -> None:
    with pytest.raises(SnapshotError, match="truncated"):
        decode_snapshot(body)


def test_truncated_inside_the_header() -> None:
    body = encode_snapshot(make_snapshot())
    header, _ = split(body)
    cut = body[: LENGTH.size + len(json.dumps(header)) // 2]
    with pytest.raises(SnapshotError, match="impossible"):
        decode_snapshot(cut)


def test_absurd_header_length() -> None:
    with pytest.raises(SnapshotError, match="impossible"):
        decode_snapshot(LENGTH.pack(2**60) + b"{}")


def test_oversized_body_is_refused_before_parsing() -> None:
    body = encode_snapshot(make_snapshot())
    with pytest.raises(SnapshotError, match=f"{len(body)} bytes exceeds the limit of {len(body) - 1} bytes"):
        decode_snapshot(body, max_bytes=len(body) - 1)
    assert decode_snapshot(body, max_bytes=len(body)).iteration == 3  # the limit itself is allowed
    # Oversized garbage is refused for its size, before anything in it is trusted.
    with pytest.raises(SnapshotError, match="exceeds the limit"):
        decode_snapshot(b"\xff" * 2048, max_bytes=1024)
    assert DEFAULT_MAX_BYTES >= 1024 * 1024


@pytest.mark.parametrize(
    "head",
    [b"not json at all", b"\xff\xfe\x00garbage", b'{"experiment": "x"', b"[1, 2, 3]", b"null", b"{}"],
    ids=["text", "binary", "unterminated", "list", "null", "empty-object"],
)
def test_garbage_header(head: bytes) -> None:
    _, payload = split(encode_snapshot(make_snapshot()))
    with pytest.raises(SnapshotError, match="header is invalid"):
        decode_snapshot(join(head, payload))


def test_unknown_header_field_is_refused() -> None:
    header, payload = split(encode_snapshot(make_snapshot()))
    header["surprise"] = 1
    with pytest.raises(SnapshotError, match="header is invalid"):
        decode_snapshot(join(header, payload))


def test_wrong_version_is_refused() -> None:
    header, payload = split(encode_snapshot(make_snapshot()))
    header["version"] = 2
    with pytest.raises(SnapshotError, match="header is invalid"):
        decode_snapshot(join(header, payload))


@pytest.mark.parametrize(("field", "value"), [("version", 2), ("iteration", -5), ("cell", "0-1")])
def test_invalid_header_message_names_the_field(field: str, value: object) -> None:
    header, payload = split(encode_snapshot(make_snapshot()))
    header[field] = value
    with pytest.raises(SnapshotError) as caught:
        decode_snapshot(join(header, payload))
    assert field in str(caught.value), str(caught.value)


def test_valid_header_over_a_payload_that_is_not_safetensors() -> None:
    header, _ = split(encode_snapshot(make_snapshot()))
    payload = b"\x10\x00\x00\x00\x00\x00\x00\x00{not safetensors"
    import hashlib

    header.update(checksum=hashlib.sha256(payload).hexdigest(), payload_bytes=len(payload))
    with pytest.raises(SnapshotError, match="not valid safetensors"):
        decode_snapshot(join(header, payload))


def test_messages_are_one_line() -> None:
    body = encode_snapshot(make_snapshot())
    header, payload = split(body)
    bad = [body[:-5], b"", join(b"junk", payload), join({**header, "version": 3}, payload)]
    for item in bad:
        with pytest.raises(SnapshotError) as caught:
            decode_snapshot(item)
        assert "\n" not in str(caught.value)


def deeply_nested(levels: int) -> bytes:
    return b'{"a": ' * levels + b"1" + b"}" * levels


@pytest.mark.parametrize("levels", [65, 5000, 100_000])
def test_json_nested_too_deep_is_refused_before_parsing(levels: int) -> None:
    # Thousands of levels made json raise RecursionError past every except clause (issue 13 §4).
    from palomino.wire.control_messages import decode_control
    from palomino.wire.frame import LENGTH
    from palomino.wire.score_messages import decode_result

    head = deeply_nested(levels)
    body = LENGTH.pack(len(head)) + head
    for decode in (decode_snapshot, decode_control):
        with pytest.raises(SnapshotError, match="nested deeper than 64"):
            decode(body)
    with pytest.raises(SnapshotError, match="nested deeper than 64"):
        decode_result(head)


def test_depth_counts_brackets_in_json_not_in_strings() -> None:
    from palomino.wire.frame import json_depth_ok

    assert json_depth_ok(deeply_nested(64)) and not json_depth_ok(deeply_nested(65))
    assert json_depth_ok(b'{"path": "' + b"[" * 500 + b'"}')  # brackets in a string are text
    assert json_depth_ok(b'["\\"' + b"[" * 500 + b'"]')  # an escaped quote does not end the string
    assert not json_depth_ok(
        b'["' + b"]" * 500 + b'", ' + b"[" * 100 + b"]" * 100 + b"]"
    )  # closers in a string do not hide depth
    assert json_depth_ok(b'"\\"' * 100_000)  # unterminated, with escapes: linear, and json refuses it


def test_urls_are_redacted_in_text_and_log_records() -> None:
    import logging

    from palomino.transport.urls import RedactingFilter, redact, redact_text

    assert redact("amqp://u:pw@host:5672/v") == "amqp://u:***@host:5672/v"
    assert redact("amqp://u:pw@host:notaport/") == "amqp://u:***@host:notaport/"
    assert redact_text("connect to amqp://guest:s3cret@h/ and redis://:r3dis@h:6379/0 failed") == (
        "connect to amqp://guest:***@h/ and redis://:***@h:6379/0 failed"
    )
    record = logging.LogRecord(
        "aio_pika", logging.WARNING, __file__, 1, 'Connection attempt to "%s" failed', ("amqp://guest:s3cret@h/",), None
    )
    RedactingFilter().filter(record)
    assert "s3cret" not in record.getMessage() and "amqp://guest:***@h/" in record.getMessage()
