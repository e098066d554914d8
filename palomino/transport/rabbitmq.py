"""SnapshotBus over RabbitMQ (aio-pika): topic exchange `palomino.snapshots`, keys `exp.<exp>.cell.<r>.<c>`.

A cell consumes from its own queue bound to exactly its neighbours' keys, with manual
acks and a bounded prefetch. Bodies that fail to decode, belong to another experiment or
fail the caller's validator are rejected without requeue, so RabbitMQ dead-letters them
to `palomino.dead` → queue `palomino.dead-letters`; the consumer logs them and goes on.
The connection is robust: after a broker restart it reconnects and re-declares its
exchange, queue, bindings and consumer; publishes are retried until then.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Iterable

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from aiormq.exceptions import AMQPError

from palomino.endpoints import CONNECT_DEADLINE
from palomino.errors import SnapshotError
from palomino.grid import Coord
from palomino.transport.broker import (
    DEAD_EXCHANGE,
    broker_errors,
    connect,
    declare_dead_letters,
    publish_with_retry,
    release,
)
from palomino.transport.guard import Guard, describe_rejection
from palomino.transport.signing import MessageKey, check_signature, sign_headers
from palomino.transport.store import SnapshotStore
from palomino.wire import DEFAULT_MAX_BYTES, Snapshot, decode_snapshot, encode_snapshot

log = logging.getLogger(__name__)

EXCHANGE = "palomino.snapshots"
CONTENT_TYPE = "application/vnd.palomino.snapshot+safetensors"


def routing_key(experiment: str, coord: Coord) -> str:
    return f"exp.{experiment}.cell.{coord[0]}.{coord[1]}"


def last_value_queue(experiment: str, coord: Coord) -> str:
    """A queue holding only the newest snapshot a coordinate published: what a replacement restores from."""
    return f"palomino.last.{experiment}.{coord[0]}.{coord[1]}"


LAST_VALUE_ARGUMENTS = {"x-max-length": 1, "x-expires": 24 * 3600 * 1000}  # drop-head: the newest stays
# A last-value queue's one message is hidden from every other reader while one holds it (between
# its get and its requeue; longer when that reader's event loop is busy training): a neighbour that
# bound then found the queue empty and, in a synchronous run, trained against the neighbour's next
# snapshot instead (the flaky distributed-equals-embedded test); a recovery restored from an older
# checkpoint. An empty look is taken again after these pauses, seconds.
LOOK_AGAIN = (0.05, 0.1, 0.2, 0.4)
LAST_VALUE_REFRESH = 60.0  # seconds; publishes do not count as use for x-expires, a re-declare does (and
# brings the queue back after a broker restart)


async def declare_last_value(
    channel: AbstractChannel, exchange: AbstractExchange, experiment: str, coord: Coord
) -> AbstractQueue:
    # robust=False: re-declared every LAST_VALUE_REFRESH, it must not pile up in the channel's restore list.
    queue = await channel.declare_queue(
        last_value_queue(experiment, coord), durable=False, arguments=LAST_VALUE_ARGUMENTS, robust=False
    )
    await queue.bind(exchange, routing_key(experiment, coord))
    return queue


async def newest_published(
    channel: AbstractChannel,
    experiment: str,
    coord: Coord,
    key: MessageKey | None = None,
    enough: Callable[[], bool] | None = None,
) -> bytes | None:
    """The body of the newest snapshot `coord` published (left in place), or None (torch-free).
    With `key`, one not signed with it counts as none (it would be handed on to a spare). Found
    empty, the queue is looked at again after LOOK_AGAIN's pauses (another reader may hold its one
    message), unless `enough()` says the caller no longer needs it.

    One broker call a look where nothing waits, two where a snapshot does: a channel answers one
    call at a time, and a recovery makes this call for every lost cell. A queue this creates is
    bound by the coordinate's next publisher (`RabbitSnapshotBus.publish`)."""
    for pause in (0.0, *LOOK_AGAIN):
        if pause:
            await asyncio.sleep(pause)
            if enough is not None and enough():
                return None
        queue = await channel.declare_queue(
            last_value_queue(experiment, coord), durable=False, arguments=LAST_VALUE_ARGUMENTS, robust=False
        )
        if queue.declaration_result.message_count:
            message = await queue.get(no_ack=False, fail=False)
            if message is not None:
                break
    else:
        return None
    body = message.body
    await message.nack(requeue=True)
    try:
        check_signature(key, message)
    except SnapshotError as error:
        log.warning("the newest snapshot of %s in %s is not used: %s", coord, experiment, error)
        return None
    return body


async def forget_published(channel: AbstractChannel, experiment: str, coord: Coord) -> None:
    """Drop what `coord` published: a new occupant must never restore its predecessor's individuals."""
    await channel.queue_delete(last_value_queue(experiment, coord))


class RabbitSnapshotBus:
    def __init__(
        self,
        url: str,
        experiment: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        prefetch: int = 8,
        validator: Callable[[Snapshot], None] | None = None,
        publish_timeout: float = 120.0,
        key: MessageKey | None = None,
        connect_deadline: float = CONNECT_DEADLINE,
        connection: AbstractRobustConnection | None = None,
    ) -> None:
        self.url, self.experiment, self.max_bytes, self.key = url, experiment, max_bytes, key
        self.connect_deadline = connect_deadline
        self._shared = connection  # a worker process's one connection: this bus opens a channel on it
        self.prefetch, self.validator, self.publish_timeout = prefetch, validator, publish_timeout
        self._store = SnapshotStore()
        self._bound: set[Coord] = set()
        self._last_value: dict[Coord, float] = {}  # coordinate → when its last-value queue was declared
        self._epochs: dict[Coord, int] = {}  # coordinate → the newest epoch it was published at
        self.stale = 0  # snapshots from a coordinate's old owner, dropped
        self._guard = Guard(log)
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel
        self._exchange: AbstractExchange
        self._queue: AbstractQueue

    @property
    def rejected(self) -> int:
        """Bodies dead-lettered so far (for tests and metrics)."""
        return self._guard.rejected

    async def connect(self) -> RabbitSnapshotBus:
        self._connection = self._shared or await connect(self.url, deadline=self.connect_deadline)
        with broker_errors(self.url, "open the snapshot bus"):
            return await self._declare()

    async def _declare(self) -> RabbitSnapshotBus:
        channel = self._channel = await self._connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=self.prefetch)
        self._exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        await declare_dead_letters(channel)
        self._queue = await channel.declare_queue(
            f"palomino.cell.{self.experiment}.{secrets.token_hex(4)}",
            exclusive=True,
            arguments={"x-dead-letter-exchange": DEAD_EXCHANGE, "x-max-length": 256},
        )
        await self._queue.consume(self._on_message)
        return self

    async def close(self) -> None:
        # On a shared connection the exclusive queue would outlive this bus, taking (and
        # dead-lettering) the neighbours' snapshots for as long as the worker lives: deleted.
        if self._connection is not None:
            await release(self._connection, self._shared is None, self._channel, self._queue)

    async def __aenter__(self) -> RabbitSnapshotBus:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def bind(self, neighbours: Iterable[Coord], epoch: int) -> None:
        wanted = {Coord(*c) for c in neighbours}
        for coord in self._bound - wanted:
            await self._queue.unbind(self._exchange, routing_key(self.experiment, coord))
            self._store.forget(coord)
        added = wanted - self._bound
        for coord in added:
            await self._queue.bind(self._exchange, routing_key(self.experiment, coord))
        self._bound = wanted
        await asyncio.gather(*(self._catch_up(coord) for coord in sorted(added)))  # their pauses overlap

    async def _catch_up(self, coord: Coord) -> None:
        """Start from the newest snapshot `coord` has published, not from its next one: a cell
        that joins late (a replacement, a relayout) may have neighbours that already finished and
        will never publish again. An empty queue is looked at again until a live snapshot of
        `coord` comes (published after the binding, so at least as new)."""
        try:
            body = await newest_published(
                self._channel,
                self.experiment,
                coord,
                key=self.key,
                enough=lambda: self._store.newest(coord) is not None,
            )
            if body is not None:
                snapshot, held = self._decode_body(body), self._store.newest(coord)
                if held is None or held.iteration < snapshot.iteration:  # live ones may have come first
                    await self._keep(snapshot)
        except SnapshotError as error:
            log.warning("the newest snapshot of %s is not used: %s", coord, error)
        except (TimeoutError, AMQPError, ConnectionError, RuntimeError) as error:  # its next one will come
            log.warning("the newest snapshot of %s not read (%s); waiting for its next", coord, error)

    async def publish(self, snapshot: Snapshot) -> None:
        body = encode_snapshot(snapshot)
        if len(body) > self.max_bytes:
            raise SnapshotError(f"snapshot of {len(body)} bytes exceeds the limit of {self.max_bytes} bytes")
        coord = Coord(*snapshot.header.cell)
        key = routing_key(self.experiment, coord)
        headers = {"version": 1, **(sign_headers(self.key, key, body) or {})}
        message = aio_pika.Message(body, content_type=CONTENT_TYPE, type="snapshot", headers=headers)
        now = asyncio.get_running_loop().time()
        if now - self._last_value.get(coord, -LAST_VALUE_REFRESH) >= LAST_VALUE_REFRESH:
            try:
                await declare_last_value(self._channel, self._exchange, self.experiment, coord)
                self._last_value[coord] = now
            except (TimeoutError, AMQPError, ConnectionError, RuntimeError) as error:
                log.warning("last-value queue of %s not declared (%s); retrying at the next publish", coord, error)
        await publish_with_retry(self._exchange, message, key, self.url, self.publish_timeout)

    async def newest(self, coord: Coord) -> Snapshot | None:
        return self._store.newest(coord)

    async def wait(self, coord: Coord, iteration: int, timeout: float | None = None) -> Snapshot:
        return await self._store.wait(coord, iteration, timeout)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        await self._guard(message, "a message on {key}", self._decode, self._keep)

    def _decode(self, message: AbstractIncomingMessage) -> Snapshot:
        check_signature(self.key, message)
        return self._decode_body(message.body)

    def _decode_body(self, body: bytes) -> Snapshot:
        try:
            snapshot = decode_snapshot(body, max_bytes=self.max_bytes)
        except SnapshotError:
            raise
        except Exception as error:  # noqa: BLE001 — whatever the body does (RecursionError, MemoryError)
            raise SnapshotError(describe_rejection(error)) from None
        if snapshot.header.experiment != self.experiment:
            raise SnapshotError(f"snapshot of experiment {snapshot.header.experiment!r}, expected {self.experiment!r}")
        if self.validator is not None and Coord(*snapshot.header.cell) in self._bound:
            try:
                self.validator(snapshot)
            except ValueError as error:
                raise SnapshotError(f"snapshot does not fit this cell: {error}") from None
        return snapshot

    async def _keep(self, snapshot: Snapshot) -> None:
        coord = Coord(*snapshot.header.cell)
        if coord not in self._bound:  # from a binding just removed: stale, not malformed
            return
        # Fencing: a coordinate handed to a spare is published at a newer epoch; what its old owner
        # (frozen or cut off past its TTL, then back) still publishes at an older one is dropped.
        if snapshot.header.epoch < self._epochs.get(coord, 0):
            self.stale += 1
            log.debug("snapshot of %s at epoch %d after one at %d: its old owner's, dropped",
                      coord, snapshot.header.epoch, self._epochs[coord])  # fmt: skip
            return
        self._epochs[coord] = snapshot.header.epoch
        await self._store.put(snapshot)
