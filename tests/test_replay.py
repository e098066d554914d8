"""Replays refused (palomino/transport/replay.py): a copy of a signed message is refused once its
original was taken, in bounded memory; against a real RabbitMQ (the session's own), a replayed
control message, checkpoint and snapshot are refused and logged while the service goes on."""

from __future__ import annotations

import logging
import secrets

import pytest
from conftest import wait_until_async
from helpers import publish_raw, tiny_snapshot

from palomino.errors import SnapshotError
from palomino.grid import Coord
from palomino.transport import replay
from palomino.transport.control_channel import (
    CONTROL_EXCHANGE,
    ControlChannel,
    cell_address,
    checkpoints_address,
    orchestrator_address,
)
from palomino.transport.rabbitmq import RabbitSnapshotBus, routing_key
from palomino.transport.replay import ReplayGuard
from palomino.transport.signing import ISSUED, SEQUENCE, MessageKey
from palomino.wire import encode_snapshot
from palomino.wire.control_messages import Checkpoint, Stop, encode_control

SECRET = secrets.token_hex(16)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_copy_is_refused_and_the_sender_goes_on() -> None:
    sender, receiver = MessageKey(SECRET), MessageKey(SECRET)
    first = sender.sign("cell.w1", b"stop")
    receiver.check("cell.w1", b"stop", first)
    with pytest.raises(SnapshotError, match="taken before: a replay"):
        receiver.check("cell.w1", b"stop", first)
    receiver.check("cell.w1", b"stop", sender.sign("cell.w1", b"stop"))  # the same body, sent again: a new number
    receiver.check("cell.w1", b"stop", first, redelivered=True)  # the broker's redelivery is no replay


def test_the_number_and_the_time_are_signed() -> None:
    sender, receiver = MessageKey(SECRET), MessageKey(SECRET)
    headers = sender.sign("cell.w1", b"body")
    for name, value in ((SEQUENCE, "99"), (ISSUED, "1.0")):
        with pytest.raises(SnapshotError, match="bad signature"):
            receiver.check("cell.w1", b"body", {**headers, name: value})
    with pytest.raises(SnapshotError, match="older version"):
        receiver.check("cell.w1", b"body", {k: v for k, v in headers.items() if k != SEQUENCE})


def test_a_restarted_sender_numbers_from_one_again_and_is_heard() -> None:
    receiver = MessageKey(SECRET)
    for _ in range(3):
        receiver.check("orchestrator", b"metrics", MessageKey(SECRET).sign("orchestrator", b"metrics"))


def test_numbers_out_of_order_are_taken_within_the_window_and_refused_behind_it() -> None:
    guard = ReplayGuard(3600, Clock())
    clock_now = Clock().now
    for number in (5, 3, 4, 1):
        guard.admit("s", number, clock_now)
    with pytest.raises(SnapshotError, match="taken before"):
        guard.admit("s", 3, clock_now)
    guard.admit("s", replay.WINDOW + 10, clock_now)
    with pytest.raises(SnapshotError, match="too old to tell from a replay"):
        guard.admit("s", 2, clock_now)  # never taken, but behind the window
    guard.admit("s", 11, clock_now)  # inside the window, not taken yet


def test_old_and_future_messages_are_refused_by_their_time() -> None:
    clock = Clock()
    guard = ReplayGuard(3600, clock)
    with pytest.raises(SnapshotError, match="PALOMINO_MESSAGE_MAX_AGE"):
        guard.admit("s", 1, clock.now - 3601)
    with pytest.raises(SnapshotError, match="in the future"):
        guard.admit("s", 1, clock.now + replay.SKEW + 1)
    guard.admit("s", 1, clock.now - 3599)


def test_memory_is_bounded_and_a_forgotten_senders_old_messages_stay_refused(monkeypatch) -> None:
    monkeypatch.setattr(replay, "SENDERS", 3)
    clock = Clock()
    guard = ReplayGuard(3600, clock)
    for k, sender in enumerate("abcd"):
        guard.admit(sender, 1, clock.now - 100 + k)
    assert len(guard) == 3  # a: forgotten, its newest message issued at now - 100
    with pytest.raises(SnapshotError, match="not heard since older ones were forgotten"):
        guard.admit("a", 1, clock.now - 100)  # a replay of a's message
    guard.admit("e", 1, clock.now)  # a new sender, newer than anything forgotten


def test_the_window_is_bits_not_a_set() -> None:
    guard = ReplayGuard(3600, Clock())
    for number in range(1, 20_000):
        guard.admit("s", number, Clock().now)
    stream = guard._streams["s"]
    assert stream.seen.bit_length() <= replay.WINDOW


@pytest.mark.integration
async def test_a_replayed_stop_is_refused_and_logged_and_the_cell_goes_on(broker_url: str, caplog) -> None:
    address = cell_address(f"test-{secrets.token_hex(4)}")
    got: list[str] = []

    async def handler(message, payload: bytes) -> None:
        got.append(message.reason)

    cell = await ControlChannel(broker_url, address, key=MessageKey(SECRET)).connect()
    try:
        await cell.listen(handler)
        captured = MessageKey(SECRET)
        body = encode_control(Stop(experiment="x", reason="captured"))
        headers = captured.sign(address, body)
        with caplog.at_level(logging.WARNING):
            await publish_raw(broker_url, CONTROL_EXCHANGE, address, body, headers)
            await publish_raw(broker_url, CONTROL_EXCHANGE, address, body, headers)  # the copy
            later = encode_control(Stop(experiment="x", reason="later"))
            await publish_raw(broker_url, CONTROL_EXCHANGE, address, later, captured.sign(address, later))
            await wait_until_async(lambda: len(got) == 2 and cell.rejected == 1)
        assert got == ["captured", "later"] and cell.rejected == 1
        assert "a replay" in caplog.text
    finally:
        await cell.close()


@pytest.mark.integration
async def test_a_replayed_checkpoint_is_refused_by_the_orchestrators_queue(broker_url: str) -> None:
    namespace = f"t{secrets.token_hex(4)}"
    address = orchestrator_address(namespace)
    got: list[int] = []

    async def handler(message, payload: bytes) -> None:
        got.append(message.iteration)

    orchestrator = await ControlChannel(broker_url, address, key=MessageKey(SECRET)).connect()
    try:
        await orchestrator.listen(handler)
        cell = MessageKey(SECRET)
        where = checkpoints_address(address)
        for iteration in (10, 20):
            checkpoint = Checkpoint(experiment="x", worker="w", coord=(0, 0), iteration=iteration, meta={})
            body = encode_control(checkpoint, b"state")
            headers = cell.sign(where, body)
            await publish_raw(broker_url, CONTROL_EXCHANGE, where, body, headers)
            await publish_raw(broker_url, CONTROL_EXCHANGE, where, body, headers)
        await wait_until_async(lambda: len(got) == 2 and orchestrator.rejected == 2)
        assert got == [10, 20] and orchestrator.rejected == 2
    finally:
        await orchestrator.channel.queue_delete(f"palomino.{address}")
        await orchestrator.channel.queue_delete(f"palomino.{checkpoints_address(address)}")
        await orchestrator.close()


@pytest.mark.integration
async def test_a_replayed_snapshot_is_refused_and_newer_ones_are_taken(broker_url: str) -> None:
    experiment = f"test-{secrets.token_hex(4)}"
    async with RabbitSnapshotBus(broker_url, experiment, key=MessageKey(SECRET)) as receiver:
        await receiver.bind([Coord(0, 1)], epoch=0)
        key, neighbour = routing_key(experiment, Coord(0, 1)), MessageKey(SECRET)
        first = encode_snapshot(tiny_snapshot(experiment, 1))
        headers = {"version": 1, **neighbour.sign(key, first)}
        await publish_raw(broker_url, "palomino.snapshots", key, first, headers)
        await publish_raw(broker_url, "palomino.snapshots", key, first, headers)
        second = encode_snapshot(tiny_snapshot(experiment, 2))
        await publish_raw(broker_url, "palomino.snapshots", key, second, {"version": 1, **neighbour.sign(key, second)})
        got = await receiver.wait(Coord(0, 1), 2, timeout=10)
        await wait_until_async(lambda: receiver.rejected == 1)
        assert got.iteration == 2 and receiver.rejected == 1
