"""The RabbitMQ SnapshotBus and Redis Liveness adapters against a real broker and Redis (the session's own)."""

from __future__ import annotations

import asyncio
import secrets
import struct
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import raw_publish, wait_until_async

from palomino.engine.loop import gather_neighbours
from palomino.errors import TransportError
from palomino.grid import Coord, Topology
from palomino.transport import InMemorySnapshotBus
from palomino.transport.rabbitmq import LAST_VALUE_ARGUMENTS, RabbitSnapshotBus, last_value_queue, routing_key
from palomino.transport.redis_liveness import RedisLiveness
from palomino.wire import IndividualMeta, Snapshot, SnapshotHeader, encode_snapshot


def snapshot(experiment: str, cell: tuple[int, int], iteration: int, size: int = 4) -> Snapshot:
    meta = IndividualMeta(learning_rate=0.001, fitness=0.5, loss="minimax")
    header = SnapshotHeader(experiment=experiment, cell=cell, iteration=iteration, generator=meta, discriminator=meta)
    return Snapshot(header, {"generator.net.w": torch.arange(size, dtype=torch.float32) + iteration})


@pytest.fixture
def experiment() -> str:
    return f"test-{secrets.token_hex(4)}"


@pytest.mark.integration
async def test_a_published_snapshot_reaches_the_neighbour_that_binds_it(experiment: str, broker_url: str) -> None:
    async with (
        RabbitSnapshotBus(broker_url, experiment) as sender,
        RabbitSnapshotBus(broker_url, experiment) as receiver,
    ):
        await receiver.bind([Coord(0, 1)], epoch=0)
        await sender.publish(snapshot(experiment, (0, 1), 3))
        got = await receiver.wait(Coord(0, 1), 3, timeout=10)
        assert got.iteration == 3 and torch.equal(got.tensors["generator.net.w"], torch.arange(4.0) + 3)
        assert (await receiver.newest(Coord(0, 1))).iteration == 3
        assert await receiver.newest(Coord(1, 1)) is None


@pytest.mark.integration
async def test_bad_messages_are_dead_lettered_and_training_goes_on(experiment: str, broker_url: str) -> None:
    async with RabbitSnapshotBus(broker_url, experiment, max_bytes=4096) as receiver:
        await receiver.bind([Coord(0, 1)], epoch=0)
        key = routing_key(experiment, Coord(0, 1))
        good = encode_snapshot(snapshot(experiment, (0, 1), 1))
        await raw_publish(b"garbage, not a snapshot", key)
        await raw_publish(good[: len(good) // 2], key)  # truncated
        await raw_publish(encode_snapshot(snapshot(experiment, (0, 1), 2, size=4096)), key)  # oversized
        await raw_publish(encode_snapshot(snapshot("someone-else", (0, 1), 2)), key)  # wrong experiment
        await raw_publish(struct.pack("<Q", 10**9) + good[8:], key)  # impossible header length
        await raw_publish(good, key)
        got = await receiver.wait(Coord(0, 1), 1, timeout=10)
        assert got.iteration == 1
        assert receiver.rejected == 5


@pytest.mark.integration
async def test_a_validator_rejects_snapshots_that_do_not_fit(experiment: str, broker_url: str) -> None:
    def fits(s: Snapshot) -> None:
        if s.tensors["generator.net.w"].shape != (4,):
            raise ValueError("generator.net.w: wrong shape")

    async with (
        RabbitSnapshotBus(broker_url, experiment, validator=fits) as receiver,
        RabbitSnapshotBus(broker_url, experiment) as sender,
    ):
        await receiver.bind([Coord(1, 0)], epoch=0)
        await sender.publish(snapshot(experiment, (1, 0), 1, size=5))
        await sender.publish(snapshot(experiment, (1, 0), 2, size=4))
        assert (await receiver.wait(Coord(1, 0), 2, timeout=10)).iteration == 2
        assert receiver.rejected == 1


@pytest.mark.integration
async def test_rebinding_follows_the_new_neighbours_only(experiment: str, broker_url: str) -> None:
    async with (
        RabbitSnapshotBus(broker_url, experiment) as sender,
        RabbitSnapshotBus(broker_url, experiment) as receiver,
    ):
        await receiver.bind([Coord(0, 1)], epoch=0)
        await receiver.bind([Coord(1, 1)], epoch=1)
        await sender.publish(snapshot(experiment, (0, 1), 5))
        await sender.publish(snapshot(experiment, (1, 1), 6))
        # 5 went out before 6 on one channel: had it been routed here, it would have come first.
        assert (await receiver.wait(Coord(1, 1), 6, timeout=10)).iteration == 6
        assert await receiver.newest(Coord(0, 1)) is None


@pytest.mark.integration
async def test_a_neighbour_bound_late_starts_from_its_newest_published_snapshot(
    experiment: str, broker_url: str
) -> None:
    """A replacement whose neighbours have finished: they never publish again, and it waited
    neighbour_timeout for each (the chaos soak's four-minute stall)."""
    async with RabbitSnapshotBus(broker_url, experiment) as finished:
        await finished.publish(snapshot(experiment, (0, 1), 6))
        await finished.publish(snapshot(experiment, (0, 1), 7))
        await raw_publish(b"garbage", routing_key(experiment, Coord(2, 2)))  # the newest of 2-2: unusable
        async with RabbitSnapshotBus(broker_url, experiment) as late:
            await late.bind([Coord(0, 1), Coord(1, 1), Coord(2, 2)], epoch=1)
            held = await late.newest(Coord(0, 1))
            assert held is not None and held.iteration == 7
            assert torch.equal(held.tensors["generator.net.w"], torch.arange(4.0) + 7)
            assert await late.newest(Coord(1, 1)) is None and await late.newest(Coord(2, 2)) is None
            await finished.publish(snapshot(experiment, (0, 1), 8))  # and it follows on from there
            assert (await late.wait(Coord(0, 1), 8, timeout=10)).iteration == 8


@pytest.mark.integration
async def test_a_neighbour_binding_while_another_reads_the_newest_still_finds_it(
    experiment: str, broker_url: str
) -> None:
    """A last-value queue's one message is hidden while another reader holds it (between its get and
    its requeue): a cell binding then found none and, in a synchronous run, trained against its
    neighbour's next snapshot (the flaky distributed-equals-embedded test)."""
    import aio_pika

    async with RabbitSnapshotBus(broker_url, experiment) as publisher:
        await publisher.publish(snapshot(experiment, (0, 1), 7))
        connection = await aio_pika.connect(broker_url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(
                last_value_queue(experiment, Coord(0, 1)), durable=False, arguments=LAST_VALUE_ARGUMENTS
            )
            held = await queue.get(no_ack=False)  # another neighbour's catch-up, slow to hand it back

            async def hand_back() -> None:
                await asyncio.sleep(0.2)
                await held.nack(requeue=True)

            async with RabbitSnapshotBus(broker_url, experiment) as late:
                await asyncio.gather(late.bind([Coord(0, 1)], epoch=0), hand_back())
                found = await late.newest(Coord(0, 1))
                assert found is not None and found.iteration == 7


@pytest.mark.parametrize("synchronous", [False, True])
async def test_silent_neighbours_cost_one_timeout_together(synchronous: bool, caplog: pytest.LogCaptureFixture) -> None:
    topology = Topology(3, 3, "von_neumann")
    cell = SimpleNamespace(iteration=5, coord=Coord(1, 1), topology=topology)
    neighbours = topology.neighbours(cell.coord)
    bus = InMemorySnapshotBus()
    await bus.publish(snapshot("x", tuple(neighbours[-1]), 4))  # one has spoken, after three silent ones
    silent: set[Coord] = set()
    started = time.monotonic()
    found = await gather_neighbours(cell, bus, synchronous, timeout=0.5, silent=silent)
    assert time.monotonic() - started < 1.0  # one at a time each waited 0.5 s: 1.5 s
    assert list(found) == [neighbours[-1]] and silent == set(neighbours[:-1])
    # Each silent one is named, against the gather's timeout (the later ones had less than all of it).
    said = [r.getMessage() for r in caplog.records if "no snapshot from neighbour" in r.getMessage()]
    assert len(said) == 3 and all("within the 0.5 s neighbour timeout" in line for line in said), said


async def test_a_bad_broker_url_is_a_clear_error() -> None:
    with pytest.raises(TransportError, match=r"cannot connect to RabbitMQ at amqp://guest:\*\*\*@127.0.0.1:1/"):
        await RabbitSnapshotBus("amqp://guest:secret@127.0.0.1:1/", "x", connect_deadline=0).connect()


@pytest.mark.integration
async def test_heartbeats_expire_unless_refreshed(redis_url: str) -> None:
    liveness = RedisLiveness(redis_url, key=f"palomino:test:{secrets.token_hex(4)}:alive")
    try:
        await liveness.heartbeat("a", ttl=0.4)
        await liveness.heartbeat_many(["b", "c/1"], ttl=5)
        assert await liveness.alive() == {"a", "b", "c/1"}
        await liveness.heartbeat_many(["c/1"], ttl=0.4)  # the newest beat decides, even a shorter one

        async def only_b() -> bool:
            return await liveness.alive() == {"b"}

        await wait_until_async(only_b, timeout=5)  # well inside b's TTL
        await liveness.heartbeat("a", ttl=5)  # back after expiring: alive again
        assert await liveness.alive() == {"a", "b"}
    finally:
        await liveness.close()


async def test_unreachable_redis_is_an_error_not_an_empty_set() -> None:
    liveness = RedisLiveness("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(TransportError, match="cannot reach Redis at redis://127.0.0.1:1/0"):
            await liveness.alive()
    finally:
        await liveness.close()


def nested_body(levels: int = 5000) -> bytes:
    from palomino.wire.frame import LENGTH

    head = b'{"kind": "metrics", "x": ' + b"[" * levels + b"]" * levels + b"}"
    return LENGTH.pack(len(head)) + head


@pytest.mark.integration
async def test_nested_json_on_the_control_queue_is_rejected_and_the_consumer_goes_on(broker_url: str) -> None:
    # 200 such bodies used to leave 32 unacknowledged (the prefetch window) and stop the queue for good.
    from palomino.transport.control_channel import CONTROL_EXCHANGE, ControlChannel, orchestrator_address
    from palomino.wire.control_messages import Register

    address = orchestrator_address(f"test-{secrets.token_hex(4)}")
    got: list[object] = []

    async def handler(message: object, payload: bytes) -> None:
        got.append(message)

    channel = await ControlChannel(broker_url, address).connect()
    try:
        await channel.listen(handler)
        await raw_publish([nested_body()] * 200, address, exchange=CONTROL_EXCHANGE)
        await channel.send(address, Register(worker="w-after", host="h", pid=1))
        await wait_until_async(lambda: got and channel.rejected == 200)
        assert [m.worker for m in got] == ["w-after"] and channel.rejected == 200
        assert channel.in_flight.stalled_for() == 0.0
    finally:
        await channel.channel.queue_delete(f"palomino.{address}")
        await channel.close()


@pytest.mark.integration
async def test_nested_json_on_the_snapshot_exchange_is_rejected(experiment: str, broker_url: str) -> None:
    async with RabbitSnapshotBus(broker_url, experiment) as receiver:
        await receiver.bind([Coord(0, 1)], epoch=0)
        key = routing_key(experiment, Coord(0, 1))
        await raw_publish([nested_body()] * 50 + [encode_snapshot(snapshot(experiment, (0, 1), 1))], key)
        got = await receiver.wait(Coord(0, 1), 1, timeout=10)
        assert got.iteration == 1 and receiver.rejected == 50


@pytest.mark.integration
async def test_the_orchestrators_queue_is_capped_and_the_oldest_go_to_the_dead_letters(broker_url: str) -> None:
    from palomino.transport.control_channel import ControlChannel, orchestrator_address
    from palomino.wire.control_messages import Register

    address = orchestrator_address(f"test-{secrets.token_hex(4)}")
    channel = await ControlChannel(broker_url, address, cap=(5, 1024**2)).connect()
    got: list[str] = []

    async def handler(message, payload: bytes) -> None:
        got.append(message.worker)

    try:
        for i in range(10):  # nobody consumes yet: an orchestrator that is down
            await channel.send(address, Register(worker=f"w{i}", host="h", pid=i))
        await channel.listen(handler)
        await wait_until_async(lambda: len(got) >= 5)
        # Bounded: the newest five waited (uncapped, the first five to come would be w0 to w4).
        assert got == [f"w{i}" for i in range(5, 10)]
    finally:
        await channel.channel.queue_delete(f"palomino.{address}")
        await channel.close()


@pytest.mark.integration
async def test_checkpoints_wait_for_room_in_their_queue_instead_of_pushing_older_ones_out(broker_url: str) -> None:
    from palomino.transport.control_channel import (
        ControlChannel,
        cell_address,
        checkpoints_address,
        orchestrator_address,
    )
    from palomino.wire.control_messages import Checkpoint, Register

    token = secrets.token_hex(4)
    address = orchestrator_address(f"test-{token}")
    to = checkpoints_address(address)
    orchestrator = await ControlChannel(broker_url, address, checkpoint_cap=(3, 1024**2)).connect()
    cell = await ControlChannel(broker_url, cell_address(f"w-{token}"), publish_timeout=30).connect()
    got: list[int] = []

    async def handler(message, payload: bytes) -> None:
        got.append(message.iteration)

    def checkpoint(iteration: int) -> Checkpoint:
        return Checkpoint(experiment="e-1", worker="w", coord=(0, 0), iteration=iteration, meta={})

    try:
        for i in range(3):  # nobody consumes yet: the queue fills
            await cell.send(to, checkpoint(i), b"x" * 1000)
        late = asyncio.create_task(cell.send(to, checkpoint(3), b"x" * 1000))
        await asyncio.sleep(2)
        assert not late.done()  # refused, so the cell waits (a drop-head queue would have dropped 0)
        await orchestrator.listen(handler)
        await asyncio.wait_for(late, 30)
        await wait_until_async(lambda: len(got) >= 4)
        assert got == [0, 1, 2, 3]
        await cell.send(to, Register(worker="w", host="h", pid=1))  # only checkpoints go there
        await wait_until_async(lambda: orchestrator.rejected == 1)
        assert got == [0, 1, 2, 3]
    finally:
        for queue in (address, to):
            await orchestrator.channel.queue_delete(f"palomino.{queue}")
        await orchestrator.close()
        await cell.close()


@pytest.mark.integration
async def test_a_queue_an_older_palomino_declared_without_caps_is_still_used(
    caplog: pytest.LogCaptureFixture, broker_url: str
) -> None:
    import aio_pika

    from palomino.transport.broker import DEAD_EXCHANGE
    from palomino.transport.control_channel import ControlChannel, orchestrator_address
    from palomino.wire.control_messages import Register

    address = orchestrator_address(f"test-{secrets.token_hex(4)}")
    connection = await aio_pika.connect(broker_url)
    async with connection:
        old = await connection.channel()
        await old.declare_queue(
            f"palomino.{address}", durable=True, arguments={"x-dead-letter-exchange": DEAD_EXCHANGE}
        )
    got: list[str] = []

    async def handler(message, payload: bytes) -> None:
        got.append(message.worker)

    channel = await ControlChannel(broker_url, address).connect()
    try:
        await channel.listen(handler)
        await channel.send(address, Register(worker="still-works", host="h", pid=1))
        await wait_until_async(lambda: got)
        assert got == ["still-works"] and "exists with other arguments" in caplog.text
    finally:
        await channel.channel.queue_delete(f"palomino.{address}")
        await channel.close()


@pytest.mark.integration
async def test_score_results_stay_in_their_namespace(broker_url: str) -> None:
    # The results queue bound exp.#.score: every stack's orchestrator got every other stack's scores.
    from palomino.transport.score_queue import ScoreQueue
    from palomino.wire.score_messages import ScoreResult

    tag = secrets.token_hex(4)
    queues = {ns: await ScoreQueue(broker_url, ns).connect() for ns in (f"a{tag}", f"b{tag}", "")}
    got: dict[str, list[str]] = {ns: [] for ns in queues}
    names = {ns: f"palomino.test.results.{ns or 'plain'}{tag}" for ns in queues}
    try:
        for ns, queue in queues.items():

            async def keep(result: ScoreResult, ns: str = ns) -> None:
                got[ns].append(result.job)

            await queue.follow_results(names[ns], keep)
        # Publishes are confirmed, so each was in every queue it was routed to before the next round
        # went out: once a queue has its "end" result, anything that leaked into it has come too.
        for job in ("job", "end"):
            for ns, queue in queues.items():  # an experiment id with dots, and the same id in each stack
                await queue.publish_result(
                    ScoreResult(job=f"{job}-{ns or 'plain'}", experiment=f"x.score.{tag}", target="best")
                )
        await wait_until_async(lambda: all(f"end-{ns or 'plain'}" in got[ns] for ns in queues))
        assert got == {ns: [f"job-{ns or 'plain'}", f"end-{ns or 'plain'}"] for ns in queues}
    finally:
        for ns, queue in queues.items():
            await queue._channel.queue_delete(names[ns])
            if ns:
                await queue._channel.queue_delete(queue.name)
            await queue.close()


def test_the_dashboard_takes_a_namespaced_score_event_and_no_other_key() -> None:
    from palomino.services.dashboard.events import MalformedEvent, parse_event

    body = b'{"kind": "score", "experiment": "x.1", "job": "j", "target": "best"}'
    assert parse_event(body, "exp.x.1.score")["job"] == "j"
    assert parse_event(body, "exp.x.1.score.ns-team_a")["job"] == "j"
    for key in ("exp.x.1.score.other", "exp.x.1.score.ns-a.b", "exp.y.score.ns-a"):
        with pytest.raises(MalformedEvent, match="routing key"):
            parse_event(body, key)


@pytest.mark.integration
async def test_side_channels_asked_for_many_at_once_are_a_few_open_ones(broker_url: str) -> None:
    # A recovery asks for one per lost cell at once; the list was rebuilt under a caller's feet.
    import asyncio

    from palomino.transport.control_channel import SIDE_CHANNELS, ControlChannel, cell_address

    channel = await ControlChannel(broker_url, cell_address(f"test-{secrets.token_hex(4)}")).connect()
    try:
        got = await asyncio.gather(*(channel.side_channel() for _ in range(5 * SIDE_CHANNELS)))
        assert len({id(c) for c in got}) == SIDE_CHANNELS and not any(c.is_closed for c in got)
        await got[0].close()  # closed (as an error would): replaced when its turn comes
        again = await asyncio.gather(*(channel.side_channel() for _ in range(SIDE_CHANNELS)))
        assert not any(c.is_closed for c in again)
    finally:
        await channel.close()


@pytest.mark.integration
async def test_buses_sharing_a_workers_connection_delete_their_queue_on_close(experiment: str, broker_url: str) -> None:
    """Issue 52: one connection a worker process. A block's bus opens a channel on it; its exclusive
    queue would outlive the block (and take its neighbours' snapshots for as long as the worker
    lives) unless the bus deletes it."""
    from aiormq.exceptions import ChannelNotFoundEntity

    from palomino.transport.broker import connect
    from palomino.transport.score_queue import ScoreQueue

    shared = await connect(broker_url)
    try:
        first = await RabbitSnapshotBus(broker_url, experiment, connection=shared).connect()
        await first.bind([Coord(0, 1)], epoch=0)
        queue = first._queue.name
        scoring = await ScoreQueue(broker_url, f"t{experiment[-8:]}", connection=shared).connect()
        await scoring.close()
        await first.close()
        assert not shared.is_closed
        probe = await shared.channel()
        with pytest.raises(ChannelNotFoundEntity):
            await probe.declare_queue(queue, passive=True)
        async with RabbitSnapshotBus(broker_url, experiment) as sender:
            second = await RabbitSnapshotBus(broker_url, experiment, connection=shared).connect()
            await second.bind([Coord(0, 1)], epoch=1)
            await sender.publish(snapshot(experiment, (0, 1), 2))
            assert (await second.wait(Coord(0, 1), 2, timeout=10)).iteration == 2
            await second.close()
    finally:
        await shared.close()


@pytest.mark.integration
async def test_a_coordinates_old_owner_is_fenced_off_by_the_epoch_its_snapshots_carry(
    experiment: str, broker_url: str
) -> None:
    """Issue 50: a worker frozen past its TTL wakes up and publishes for a coordinate a spare now
    holds (at a newer epoch): its snapshots are dropped, whatever their iteration, and counted."""
    async with (
        RabbitSnapshotBus(broker_url, experiment) as old_owner,
        RabbitSnapshotBus(broker_url, experiment) as spare,
        RabbitSnapshotBus(broker_url, experiment) as neighbour,
    ):
        await neighbour.bind([Coord(0, 1)], epoch=0)
        await old_owner.publish(snapshot(experiment, (0, 1), 7))
        assert (await neighbour.wait(Coord(0, 1), 7, timeout=10)).header.epoch == 0
        replacement = snapshot(experiment, (0, 1), 5)
        replacement.header.epoch = 1  # restored from an older checkpoint, in the epoch of the handover
        await spare.publish(replacement)
        await wait_until_async(lambda: neighbour._store.newest(Coord(0, 1)).header.epoch == 1, 10)
        await old_owner.publish(snapshot(experiment, (0, 1), 8))  # awake again, a step further
        await wait_until_async(lambda: neighbour.stale == 1, 10)
        newest = await neighbour.newest(Coord(0, 1))
        assert (newest.header.epoch, newest.iteration) == (1, 5)


async def test_a_synchronous_cell_says_when_it_trains_against_a_neighbours_later_snapshot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its neighbour's exact iteration went unheard (the catch-up race above): the run goes on,
    and the log says it will not repeat bit for bit."""
    topology = Topology(3, 3, "von_neumann")
    cell = SimpleNamespace(iteration=5, coord=Coord(1, 1), topology=topology)
    bus = InMemorySnapshotBus()
    for coord in topology.neighbours(cell.coord):
        await bus.publish(snapshot("x", tuple(coord), 4 if coord != Coord(0, 1) else 5))
    found = await gather_neighbours(cell, bus, True, timeout=1.0)
    assert found[Coord(0, 1)].iteration == 5
    assert [r.getMessage() for r in caplog.records if "not held" in r.getMessage()] == [
        "cell 1-1: neighbour 0-1's snapshot of iteration 4 is not held (missed or pushed out); "
        "training against its iteration 5, so this synchronous run will not repeat bit for bit"
    ]
