"""The control plane over RabbitMQ: direct exchange `palomino.control`, and events on `palomino.events`.

Addresses are routing keys: `orchestrator`, or `cell.<worker>`. The orchestrator's queue
is durable (messages wait across its restart); a cell's is exclusive to its connection.
Checkpoints travel to the orchestrator by a durable queue of their own, `checkpoints`, that
refuses more past its cap (the cell's publish waits and retries: back-pressure) where the
control queue drops its oldest: a checkpoint is never thrown away to make room.
Malformed bodies are dead-lettered and logged; the listener keeps going.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from palomino.endpoints import CONNECT_DEADLINE
from palomino.transport.broker import (
    DEAD_EXCHANGE,
    EVENTS_EXCHANGE,
    NAMESPACED_EXPIRY_MS,
    InFlight,
    capped,
    connect,
    declare_dead_letters,
    declare_durable,
    publish_with_retry,
)
from palomino.transport.guard import Guard
from palomino.transport.signing import MessageKey, check_signature, sign_headers
from palomino.wire.control_messages import CONTROL_MAX_BYTES, ControlMessage, decode_control, encode_control

log = logging.getLogger(__name__)

CONTROL_EXCHANGE = "palomino.control"
ORCHESTRATOR = "orchestrator"
# What may wait for a stopped orchestrator: past it the oldest messages are dead-lettered.
ORCHESTRATOR_QUEUE_CAP = (100_000, 2 * 1024**3)
CHECKPOINTS = "checkpoints"
# What checkpoints may wait for the orchestrator: past it new ones are refused until it catches up.
CHECKPOINT_QUEUE_CAP = (100_000, 2 * 1024**3)
SIDE_CHANNELS = 32  # a channel answers one call at a time: a recovery's lookups (hundreds) share these


def orchestrator_address(namespace: str = "") -> str:
    """The orchestrator's routing key (and queue `palomino.<address>`) in a namespace."""
    return f"{ORCHESTRATOR}.{namespace}" if namespace else ORCHESTRATOR


def checkpoints_address(orchestrator: str) -> str:
    """Where cells send checkpoints for the orchestrator at `orchestrator` (a queue of their own)."""
    return CHECKPOINTS + orchestrator.removeprefix(ORCHESTRATOR)


Handler = Callable[[ControlMessage, bytes], Awaitable[None]]


def cell_address(worker: str) -> str:
    return f"cell.{worker}"


class ControlChannel:
    def __init__(
        self,
        url: str,
        address: str,
        *,
        publish_timeout: float = 120.0,
        cap: tuple[int, int] = ORCHESTRATOR_QUEUE_CAP,
        checkpoint_cap: tuple[int, int] = CHECKPOINT_QUEUE_CAP,
        key: MessageKey | None = None,
        also: list[str] | tuple[str, ...] = (),
        connect_deadline: float = CONNECT_DEADLINE,
    ) -> None:
        self.connect_deadline = connect_deadline
        self.also = list(also)  # further addresses this queue takes (a multi-cell worker's other slots)
        self.url, self.address, self.publish_timeout, self.cap, self.key = url, address, publish_timeout, cap, key
        self.checkpoint_cap = checkpoint_cap
        self.in_flight = InFlight()
        self._guard = Guard(log)
        self._connection: AbstractRobustConnection | None = None
        self.channel: AbstractChannel
        self._exchange: AbstractExchange
        self._events: AbstractExchange
        self._queue: AbstractQueue
        self._checkpoints: AbstractQueue | None = None  # the orchestrator's only
        self._side: list[AbstractChannel] = []
        self._turn = 0
        self._opening = asyncio.Lock()

    async def side_channel(self) -> AbstractChannel:
        """One of a few more channels on this connection, in turn, for broker calls made many at a
        time (last-value lookups and deletes of a recovery or an experiment's end)."""
        assert self._connection is not None
        turn = self._turn = (self._turn + 1) % SIDE_CHANNELS
        async with self._opening:  # callers come many at once: each slot opened once
            while len(self._side) <= turn:
                self._side.append(await self._connection.channel())
            if self._side[turn].is_closed:  # an error closed it: a new one in its place
                self._side[turn] = await self._connection.channel()
            return self._side[turn]

    @property
    def connection(self) -> AbstractRobustConnection:
        """This channel's connection, connected: a worker process's snapshot bus and score queue open
        channels on it rather than connections of their own (one handshake a process, not three)."""
        if self._connection is None:
            raise RuntimeError("the control channel is not connected")
        return self._connection

    @property
    def rejected(self) -> int:
        """Bodies dead-lettered as malformed so far."""
        return self._guard.rejected

    async def connect(self) -> ControlChannel:
        self._connection = await connect(self.url, deadline=self.connect_deadline)
        channel = self.channel = await self._connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=32)
        self._exchange = await channel.declare_exchange(CONTROL_EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
        self._events = await channel.declare_exchange(EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        await declare_dead_letters(channel)
        name = f"palomino.{self.address}"
        if self.address.split(".")[0] == ORCHESTRATOR:  # durable, bounded: messages wait across its restart
            namespaced = {"x-expires": NAMESPACED_EXPIRY_MS} if self.address != ORCHESTRATOR else {}
            arguments = capped(*self.cap) | namespaced
            self._queue = await declare_durable(self._connection, channel, name, arguments)
            address = checkpoints_address(self.address)
            arguments = capped(*self.checkpoint_cap, overflow="reject-publish") | namespaced
            self._checkpoints = await declare_durable(self._connection, channel, f"palomino.{address}", arguments)
            await self._checkpoints.bind(self._exchange, routing_key=address)
        else:  # a cell's: exclusive to its connection
            self._queue = await channel.declare_queue(
                name, exclusive=True, arguments={"x-dead-letter-exchange": DEAD_EXCHANGE}
            )
        for address in [self.address, *self.also]:
            await self._queue.bind(self._exchange, routing_key=address)
        return self

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()

    async def listen(self, handler: Handler) -> None:
        """Deliver every valid message to `handler`; ack after it returns (so a crash redelivers)."""

        def decode(message: AbstractIncomingMessage) -> tuple[ControlMessage, bytes]:
            check_signature(self.key, message)
            return decode_control(message.body, max_bytes=CONTROL_MAX_BYTES)

        async def handle(decoded: tuple[ControlMessage, bytes]) -> None:
            await handler(*decoded)

        def checkpoint(message: AbstractIncomingMessage) -> tuple[ControlMessage, bytes]:
            decoded = decode(message)
            if decoded[0].kind != "checkpoint":
                raise ValueError(f"a {decoded[0].kind} message in the checkpoints queue (only checkpoints go there)")
            return decoded

        def consumer(what: str, decoder: Callable[[AbstractIncomingMessage], tuple[ControlMessage, bytes]]) -> Any:
            async def on_message(message: AbstractIncomingMessage) -> None:
                with self.in_flight:
                    await self._guard(message, what, decoder, handle, label=lambda decoded: decoded[0].kind)

            return on_message

        await self._queue.consume(consumer(f"a control message to {self.address}", decode))
        if self._checkpoints is not None:
            await self._checkpoints.consume(consumer(f"a checkpoint to {self.address}", checkpoint))

    async def send(self, to: str, message: ControlMessage, payload: bytes = b"", timeout: float | None = None) -> None:
        """Persistent and confirmed; retried for `timeout` s (publish_timeout unless given) while the
        broker is away or the queue refuses more."""
        body = encode_control(message, payload)
        # Persistent: what waits in the orchestrator's durable queue survives a broker restart.
        envelope = aio_pika.Message(
            body,
            type=message.kind,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers=sign_headers(self.key, to, body),
        )
        await publish_with_retry(self._exchange, envelope, to, self.url, timeout or self.publish_timeout)

    async def event(self, experiment: str, kind: str, body: dict[str, Any]) -> None:
        """A JSON event on `palomino.events`, key `exp.<exp>.<kind>` (dashboards follow these)."""
        data = json.dumps({"experiment": experiment, "kind": kind, **body}, allow_nan=False, default=str).encode()
        message = aio_pika.Message(data, content_type="application/json", type=kind)
        await publish_with_retry(self._events, message, f"exp.{experiment}.{kind}", self.url, self.publish_timeout)
