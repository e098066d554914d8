"""The broker's plumbing that every RabbitMQ client here shares (the snapshot bus, the control
channel, the score queue, the dashboard's feeds): connecting through a storm, channels on a worker's
one connection, bounded durable queues, dead letters, confirmed publishes retried across a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit, urlunsplit

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue, AbstractRobustConnection
from aiormq.exceptions import AMQPError, ChannelPreconditionFailed, ProbableAuthenticationError

from palomino.endpoints import BROKER_URL, CONNECT_DEADLINE
from palomino.errors import TransportError
from palomino.transport.urls import redact

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_CAP = 0.2, 10.0  # seconds: the first pause's bound, and the largest
TRANSIENT = (TimeoutError, OSError)  # refused, timed out, unreachable, name not resolved yet (AMQP's are OSErrors)
DEAD_EXCHANGE = "palomino.dead"
DEAD_QUEUE = "palomino.dead-letters"
EVENTS_EXCHANGE = "palomino.events"
NAMESPACED_EXPIRY_MS = 24 * 3600 * 1000  # a namespace's durable queues go a day after their last user
# AMQP heartbeat, seconds, where the URL names none (`?heartbeat=N` wins). RabbitMQ's own 60 s
# leaves a client behind a half-open link (a NAT or firewall that forgot the flow) deaf for about
# three minutes before aiormq notices ((60 + 1) × 3 s); at 15 s it is under a minute, and the
# broker drops a client silent for 30 s, longer than any worker's liveness TTL allows it to live.
HEARTBEAT = 15


def with_heartbeat(url: str) -> str:
    """`url` with Palomino's heartbeat, unless it names one."""
    parts = urlsplit(url)
    if "heartbeat" in parse_qs(parts.query):
        return url
    return urlunsplit(parts._replace(query="&".join(q for q in (parts.query, f"heartbeat={HEARTBEAT}") if q)))


class InFlight:
    """When each message now being handled began: a handler that never returns shows here (and
    the service's /healthz fails) instead of silently holding the consumer's prefetch window."""

    def __init__(self) -> None:
        self._started: list[float] = []

    def __enter__(self) -> None:
        self._started.append(time.monotonic())

    def __exit__(self, *exc: object) -> None:
        self._started.pop(0)

    def stalled_for(self) -> float:
        """Seconds the oldest message in hand has been handled (0 when none is)."""
        return time.monotonic() - self._started[0] if self._started else 0.0


async def connect(url: str, timeout: float = 10.0, deadline: float = CONNECT_DEADLINE) -> AbstractRobustConnection:
    """A robust connection, or a TransportError that names the (redacted) URL and the cause.

    A broker that times out or refuses (starting, or a thousand workers connecting at once) is
    tried again after a pause drawn from [0, min(10 s, 0.2 s × 2^try)] (exponential backoff with
    full jitter: the storm spreads out rather than returning in step), until `deadline` seconds
    have passed (PALOMINO_CONNECT_DEADLINE); a bad URL or bad credentials fail at once."""
    log.debug("connecting to RabbitMQ at %s", redact(url))
    url = with_heartbeat(url)
    started, tries = time.monotonic(), 0
    while True:
        tries += 1
        try:
            # A plain connection first: cancelled (SIGTERM while the broker does not answer), it leaves
            # nothing behind, where a robust one would go on reconnecting and hold the process alive.
            probe = await aio_pika.connect(url, timeout=timeout)
            await probe.close()
            return await aio_pika.connect_robust(url, timeout=timeout)
        except (TimeoutError, OSError, AMQPError, ValueError) as error:
            cause = str(error) or type(error).__name__
            left = deadline - (time.monotonic() - started)
            if not isinstance(error, TRANSIENT) or isinstance(error, ProbableAuthenticationError) or left <= 0:
                raise TransportError(
                    f"cannot connect to RabbitMQ at {redact(url)}: {cause}"
                    + (f" ({tries} tries in {time.monotonic() - started:.0f} s)" if tries > 1 else "")
                    + f" (check --broker / PALOMINO_BROKER_URL, e.g. {BROKER_URL})"
                ) from None
            if tries == 1:
                log.warning("RabbitMQ at %s: %s; trying again for up to %.0f s", redact(url), cause, left)
            await asyncio.sleep(min(left, random.uniform(0, min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (tries - 1)))))


@contextlib.contextmanager
def broker_errors(url: str, doing: str) -> Iterator[None]:
    """The broker's errors while `doing` as a TransportError: the worker's failure, not the run's."""
    try:
        yield
    except (TimeoutError, AMQPError, ConnectionError, RuntimeError) as error:
        raise TransportError(f"cannot {doing} on RabbitMQ at {redact(url)}: {error or type(error).__name__}") from None


async def release(
    connection: AbstractRobustConnection, own: bool, channel: AbstractChannel, *queues: AbstractQueue
) -> None:
    """What a client opened: its own connection, closed (its exclusive queues go with it); on a
    shared one (a worker process's), its channel, and `queues`, which would outlive it, deleted."""
    if own:
        await connection.close()
    else:
        await close_channel(channel, *queues)


async def close_channel(channel: AbstractChannel, *queues: AbstractQueue) -> None:
    """Delete `queues` and close `channel`, leaving the connection (shared) open; what fails because
    the connection is already gone is gone with it."""
    try:
        for queue in queues:
            await queue.delete(if_unused=False, if_empty=False)
    except (TimeoutError, AMQPError, ConnectionError, RuntimeError) as error:
        log.debug("queue not deleted on close (%s)", error)
    if not channel.is_closed:
        try:
            await channel.close()
        except (TimeoutError, AMQPError, ConnectionError, RuntimeError) as error:
            log.debug("channel not closed cleanly (%s)", error)


def capped(max_length: int, max_bytes: int, overflow: str = "drop-head") -> dict[str, object]:
    """Queue arguments that bound a durable queue: past the cap the oldest messages are dead-lettered
    (`drop-head`), or new ones refused to their publisher (`reject-publish`)."""
    return {
        "x-dead-letter-exchange": DEAD_EXCHANGE,
        "x-max-length": max_length,
        "x-max-length-bytes": max_bytes,
        "x-overflow": overflow,
    }


async def declare_durable(
    connection: AbstractRobustConnection, channel: AbstractChannel, name: str, arguments: dict[str, object]
) -> AbstractQueue:
    """A durable queue with `arguments`; one that an older Palomino declared with other arguments is
    used as it is (RabbitMQ never changes a queue's arguments), with a warning that says how to cap it."""
    probe = await connection.channel()
    try:
        await probe.declare_queue(name, durable=True, arguments=arguments, robust=False)
        compatible = True
    except ChannelPreconditionFailed:
        compatible = False
        log.warning("queue %s exists with other arguments (an older Palomino): used as it is, without its caps; "
                    "delete it while nothing waits in it (rabbitmqctl delete_queue %s) to cap it", name, name)  # fmt: skip
    finally:
        if not probe.is_closed:
            await probe.close()
    if compatible:
        return await channel.declare_queue(name, durable=True, arguments=arguments)
    return await channel.declare_queue(name, passive=True)


async def declare_dead_letters(channel: AbstractChannel) -> None:
    """`palomino.dead` → `palomino.dead-letters`: where every rejected body goes (bounded)."""
    dead = await channel.declare_exchange(DEAD_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    dead_queue = await channel.declare_queue(DEAD_QUEUE, durable=True, arguments={"x-max-length": 1000})
    await dead_queue.bind(dead)


async def publish_with_retry(
    exchange: AbstractExchange, message: aio_pika.Message, key: str, url: str, timeout: float
) -> None:
    """Publish (confirmed); across a broker restart the robust connection comes back, so retry until `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await exchange.publish(message, routing_key=key)
            return
        except (TimeoutError, AMQPError, ConnectionError, RuntimeError) as error:
            if asyncio.get_running_loop().time() > deadline:
                raise TransportError(f"cannot publish to RabbitMQ at {redact(url)}: {error}") from None
            log.warning("publish failed (%s); retrying", error or type(error).__name__)
            await asyncio.sleep(0.5)
