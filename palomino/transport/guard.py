"""Every consumer's guard: decode → handle → ack; a body that does not decode → reject → dead-letter.

A body that fails to decode (a bad signature, a malformed or oversized body, one for another
experiment) is counted, logged with its reason and rejected without requeue, so RabbitMQ
dead-letters it; a handler that raises on a valid body is logged with its traceback and the
body dead-lettered too (never redelivered in a loop). The consumer keeps going either way.

FastStream would give this guard for free, but it removes less than it adds: the robust
reconnect, the capped and last-value queues, the signed headers and the score queue's
ack-after-confirm would all have to be rebuilt around its own broker, subscriber and ack model.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aio_pika.abc import AbstractIncomingMessage

from palomino.errors import SnapshotError

log = logging.getLogger(__name__)

T = TypeVar("T")


def describe_rejection(error: BaseException, shown: tuple[type[BaseException], ...] = (SnapshotError,)) -> str:
    """A rejected body's reason for the log: the decoder's own message for `shown` errors (they are
    written for it), else the exception's type and the start of its text."""
    if isinstance(error, shown):
        return str(error)
    return f"the decoder raised {type(error).__name__}: {str(error)[:200]}"


class Guard:
    """One consumer's guard, and how many bodies it dead-lettered as malformed (`rejected`)."""

    def __init__(
        self, logger: logging.Logger = log, *, shown: tuple[type[BaseException], ...] = (SnapshotError,)
    ) -> None:
        self.log, self.shown = logger, shown  # the consumer's own logger: its lines keep their origin
        self.rejected = 0

    async def __call__(
        self,
        message: AbstractIncomingMessage,
        what: str,
        decode: Callable[[AbstractIncomingMessage], T],
        handle: Callable[[T], Awaitable[object]],
        *,
        label: Callable[[T], str] | None = None,
        ack: bool = True,
    ) -> None:
        """Decode `message` and hand the result to `handle`, then ack.

        `what`: the body in the rejection's log line (`{key}` is its routing key); `label`: the
        decoded body in a handler failure's line. `ack=False`: `handle` settles the message itself
        (the score queue acks a job only once its result is confirmed)."""
        try:
            decoded = decode(message)
        except Exception as error:  # noqa: BLE001 — whatever the body does (RecursionError, MemoryError): reject it
            self.rejected += 1
            self.log.warning(
                "dead-lettering %s: %s",
                what.replace("{key}", message.routing_key or ""),
                describe_rejection(error, self.shown),
            )
            await message.reject(requeue=False)
            return
        try:
            await handle(decoded)
        except Exception:  # a handler bug must not kill the consumer nor loop on the body: log, dead-letter, go on
            name = label(decoded) if label is not None else what.replace("{key}", message.routing_key or "")
            self.log.exception("handling %s failed; dead-lettering it", name)
            if not message.processed:
                await message.reject(requeue=False)
            return
        if ack:
            await message.ack()
