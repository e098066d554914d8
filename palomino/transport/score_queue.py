"""The score work queue `palomino.score` and the results on `palomino.events` (key `exp.<exp>.score`;
in a namespace `exp.<exp>.score.ns-<namespace>`, so a stack's results queue holds its own only).

Competing consumers with prefetch 1: a job is acked only after its result is confirmed by the
broker, so a scorer killed mid-job leaves it unacked and RabbitMQ hands it to another scorer.
Malformed jobs are dead-lettered and logged; the consumer keeps going.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

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
    EVENTS_EXCHANGE,
    NAMESPACED_EXPIRY_MS,
    InFlight,
    broker_errors,
    capped,
    connect,
    declare_dead_letters,
    declare_durable,
    publish_with_retry,
    release,
)
from palomino.transport.guard import Guard
from palomino.transport.signing import MessageKey, check_signature, sign_headers
from palomino.wire.score_messages import (
    SCORE_JOB_MAX_BYTES,
    ScoreJob,
    ScoreResult,
    decode_job,
    decode_result,
    encode_job,
)

log = logging.getLogger(__name__)

SCORE_QUEUE = "palomino.score"
RESULTS_QUEUE = "palomino.score-results"  # the orchestrator's: results wait there across its restart
# Jobs carry mixtures (MBs each): past the cap new jobs are refused (the orchestrator logs it);
# results are small: past theirs the oldest are dead-lettered.
JOBS_CAP = (10_000, 8 * 1024**3)
RESULTS_CAP = (100_000, 1024**3)


def score_queue_name(namespace: str = "", base: str = SCORE_QUEUE) -> str:
    return f"{base}.{namespace}" if namespace else base


JobHandler = Callable[[ScoreJob, bytes], Awaitable[ScoreResult]]
ResultHandler = Callable[[ScoreResult], Awaitable[None]]


def result_key(experiment: str, namespace: str = "") -> str:
    """The routing key of a score result. Experiment ids may hold dots, so the namespace goes last,
    as a word no key without one ends with: `exp.#.score` never matches a namespaced key and
    `exp.#.score.ns-a` never matches another namespace's."""
    return f"exp.{experiment}.score" + (f".ns-{namespace}" if namespace else "")


def _job_label(decoded: tuple[ScoreJob, bytes]) -> str:
    return f"score job {decoded[0].job}"


def _result_label(result: ScoreResult) -> str:
    return f"score result {result.job}"


class ScoreQueue:
    def __init__(
        self,
        url: str,
        namespace: str = "",
        *,
        publish_timeout: float = 120.0,
        max_bytes: int = SCORE_JOB_MAX_BYTES,
        key: MessageKey | None = None,
        connect_deadline: float = CONNECT_DEADLINE,
        connection: AbstractRobustConnection | None = None,
    ) -> None:
        self.connect_deadline = connect_deadline
        self._shared = connection  # a worker process's one connection: this queue opens a channel on it
        self.url, self.publish_timeout, self.max_bytes, self.key = url, publish_timeout, max_bytes, key
        self.namespace = namespace
        self.name = score_queue_name(namespace)
        self._expiry: dict[str, object] = {"x-expires": NAMESPACED_EXPIRY_MS} if namespace else {}
        self.in_flight = InFlight()  # results being stored (a scorer's own jobs run for minutes)
        self._guard = Guard(log)
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel
        self._queue: AbstractQueue
        self._default: AbstractExchange
        self._events: AbstractExchange

    @property
    def rejected(self) -> int:
        """Jobs and results dead-lettered as malformed so far."""
        return self._guard.rejected

    async def connect(self) -> ScoreQueue:
        self._connection = self._shared or await connect(self.url, deadline=self.connect_deadline)
        with broker_errors(self.url, "open the score queue"):
            return await self._declare()

    async def _declare(self) -> ScoreQueue:
        self._channel = await self._connection.channel(publisher_confirms=True)
        await self._channel.set_qos(prefetch_count=1)  # one job at a time: the others stay for other scorers
        await declare_dead_letters(self._channel)
        self._queue = await declare_durable(
            self._connection, self._channel, self.name, {**capped(*JOBS_CAP, "reject-publish"), **self._expiry}
        )
        self._default = self._channel.default_exchange
        self._events = await self._channel.declare_exchange(EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        return self

    async def close(self) -> None:
        if self._connection is not None:
            await release(self._connection, self._shared is None, self._channel)

    async def enqueue(self, job: ScoreJob, payload: bytes) -> None:
        body = encode_job(job, payload)
        headers = sign_headers(self.key, self.name, body)
        message = aio_pika.Message(body, type=job.kind, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, headers=headers)
        await publish_with_retry(self._default, message, self.name, self.url, self.publish_timeout)

    async def publish_result(self, result: ScoreResult) -> None:
        body = result.model_dump_json().encode()
        key = result_key(result.experiment, self.namespace)
        message = aio_pika.Message(
            body,
            content_type="application/json",
            type="score",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers=sign_headers(self.key, key, body),
        )
        await publish_with_retry(self._events, message, key, self.url, self.publish_timeout)

    async def consume(self, handler: JobHandler) -> None:
        """Run `handler` on each valid job, publish what it returns, then ack."""

        def decode(message: AbstractIncomingMessage) -> tuple[ScoreJob, bytes]:
            check_signature(self.key, message)
            return decode_job(message.body, max_bytes=self.max_bytes)

        async def on_message(message: AbstractIncomingMessage) -> None:
            async def score(decoded: tuple[ScoreJob, bytes]) -> None:
                job, payload = decoded
                result = await handler(job, payload)  # raises: a bug in scoring, dead-lettered (never looped on)
                try:
                    await self.publish_result(result)
                    await message.ack()
                except Exception as error:  # noqa: BLE001 — never leave it unacked: with prefetch 1 this scorer would starve
                    log.warning("result of job %s not published (%s); the job goes back to the queue", job.job, error)
                    # The channel may be gone too: then RabbitMQ requeues the job itself.
                    with contextlib.suppress(Exception):
                        await message.nack(requeue=True)

            await self._guard(message, "a score job", decode, score, label=_job_label, ack=False)

        await self._queue.consume(on_message)

    async def follow_results(self, queue_name: str, handler: ResultHandler, experiments: str = "#") -> None:
        """Deliver `score` events to `handler` through the durable queue `queue_name` (results wait there)."""
        queue = await declare_durable(
            self._connection, self._channel, queue_name, {**capped(*RESULTS_CAP), **self._expiry}
        )
        await queue.bind(self._events, routing_key=result_key(experiments, self.namespace))

        def decode(message: AbstractIncomingMessage) -> ScoreResult:
            check_signature(self.key, message)
            return decode_result(message.body)

        async def on_message(message: AbstractIncomingMessage) -> None:
            with self.in_flight:
                await self._guard(message, "a score result", decode, handler, label=_result_label)

        await queue.consume(on_message, no_ack=False)
