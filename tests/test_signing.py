"""Signed messages (palomino/transport/signing.py) against a real RabbitMQ (the session's own): with a
message key, a stack's services take only what a holder of that key sent to that address."""

from __future__ import annotations

import secrets

import pytest
from conftest import wait_until_async
from helpers import publish_raw, tiny_snapshot

from palomino.errors import SnapshotError
from palomino.grid import Coord
from palomino.transport.control_channel import CONTROL_EXCHANGE, ControlChannel, cell_address
from palomino.transport.rabbitmq import RabbitSnapshotBus, routing_key
from palomino.transport.signing import HEADER, MessageKey
from palomino.wire import decode_snapshot, encode_snapshot
from palomino.wire.control_messages import Stop, encode_control

KEY = MessageKey(secrets.token_hex(16))


def test_a_signature_binds_the_key_the_body_and_the_address() -> None:
    headers = KEY.sign("cell.w1", b"body")
    KEY.check("cell.w1", b"body", headers)
    for address, body, key in (
        ("cell.w2", b"body", KEY),
        ("cell.w1", b"bodx", KEY),
        ("cell.w1", b"body", MessageKey("k" * 32)),
    ):
        with pytest.raises(SnapshotError, match="bad signature"):
            key.check(address, body, headers)
    with pytest.raises(SnapshotError, match="unsigned"):
        KEY.check("cell.w1", b"body", {})


@pytest.mark.integration
async def test_a_forged_stop_is_rejected_and_the_signed_one_is_taken(broker_url: str) -> None:
    # A holder of the broker's password could stop any cell's training with one Stop.
    worker = f"test-{secrets.token_hex(4)}"
    address = cell_address(worker)
    got: list[str] = []

    async def handler(message, payload: bytes) -> None:
        got.append(message.experiment)

    cell = await ControlChannel(broker_url, address, key=KEY).connect()
    sender = await ControlChannel(broker_url, f"cell.sender-{worker}", key=KEY).connect()
    try:
        await cell.listen(handler)
        body = encode_control(Stop(experiment="forged"))
        await publish_raw(broker_url, CONTROL_EXCHANGE, address, body)  # unsigned
        await publish_raw(broker_url, CONTROL_EXCHANGE, address, body, {HEADER: "0" * 64})  # a made-up signature
        await publish_raw(
            broker_url, CONTROL_EXCHANGE, address, body, KEY.sign("cell.someone-else", body)
        )  # signed for another address
        await sender.send(address, Stop(experiment="real"))
        await wait_until_async(lambda: got and cell.rejected == 3)
        assert got == ["real"] and cell.rejected == 3
    finally:
        await cell.close()
        await sender.close()


@pytest.mark.integration
async def test_an_unsigned_snapshot_is_rejected_where_snapshots_are_signed(broker_url: str) -> None:
    experiment = f"test-{secrets.token_hex(4)}"
    async with (
        RabbitSnapshotBus(broker_url, experiment, key=KEY) as receiver,
        RabbitSnapshotBus(broker_url, experiment, key=KEY) as sender,
    ):
        await receiver.bind([Coord(0, 1)], epoch=0)
        key = routing_key(experiment, Coord(0, 1))
        unsigned = encode_snapshot(tiny_snapshot(experiment, 5))  # and newer
        await publish_raw(broker_url, "palomino.snapshots", key, unsigned)
        await sender.publish(tiny_snapshot(experiment, 1))
        got = await receiver.wait(Coord(0, 1), 1, timeout=10)
        await wait_until_async(lambda: receiver.rejected == 1)
        assert got.iteration == 1 and receiver.rejected == 1
        assert (await receiver.newest(Coord(0, 1))).iteration == 1


@pytest.mark.integration
async def test_the_newest_published_snapshot_counts_only_when_signed(broker_url: str) -> None:
    # The orchestrator hands it to a spare: a forged one must not be restored.
    from palomino.transport.rabbitmq import forget_published, newest_published

    experiment = f"test-{secrets.token_hex(4)}"
    async with RabbitSnapshotBus(broker_url, experiment, key=KEY) as sender:

        async def newest(key: MessageKey | None = KEY) -> int | None:
            body = await newest_published(sender._channel, experiment, Coord(0, 1), key)
            return None if body is None else decode_snapshot(body).header.iteration

        await sender.publish(tiny_snapshot(experiment, 1))
        await wait_until_async(newest)
        assert await newest() == 1
        forged = encode_snapshot(tiny_snapshot(experiment, 2))
        await publish_raw(broker_url, "palomino.snapshots", routing_key(experiment, Coord(0, 1)), forged)

        async def forged_is_newest() -> bool:  # no key: not checked
            return await newest(None) == 2

        await wait_until_async(forged_is_newest)
        assert await newest() is None
        await forget_published(sender._channel, experiment, Coord(0, 1))


@pytest.mark.integration
async def test_a_forged_score_result_is_rejected(broker_url: str) -> None:
    from palomino.transport.score_queue import ScoreQueue, result_key
    from palomino.wire.score_messages import ScoreResult

    namespace = f"t{secrets.token_hex(4)}"
    queue = await ScoreQueue(broker_url, namespace, key=KEY).connect()
    name = f"palomino.test.signed-results.{namespace}"
    got: list[str] = []

    async def keep(result: ScoreResult) -> None:
        got.append(result.job)

    try:
        await queue.follow_results(name, keep)
        forged = ScoreResult(job="forged", experiment="x", target="best", ensemble={"weights": [1.0]})
        await publish_raw(broker_url, "palomino.events", result_key("x", namespace), forged.model_dump_json().encode())
        await queue.publish_result(ScoreResult(job="real", experiment="x", target="best"))
        await wait_until_async(lambda: got and queue.rejected == 1)
        assert got == ["real"] and queue.rejected == 1
    finally:
        await queue._channel.queue_delete(name)
        await queue._channel.queue_delete(queue.name)
        await queue.close()
