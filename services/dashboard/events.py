"""Events for the browser: validated at the boundary, fanned out to every open stream, sent in batches.

An event is the JSON body of `palomino.events` — {"experiment", "kind", ...} with kind `state`,
`metrics` ({"record": one metrics.jsonl line}, or {"records": [...]}: the orchestrator sends what
it wrote together as one event, shown as one event a record), `topology` (the experiment summary) or `score` —
whether it came from RabbitMQ or from a run directory being written. The dashboard adds
`reload` (a run's metrics were rewritten: fetch its history again) and `resync` (this stream
fell behind and lost events: fetch again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from palomino.services.common.runfiles import EXPERIMENT_ID
from palomino.wire.frame import MAX_DEPTH, json_depth_ok

log = logging.getLogger(__name__)

MAX_EVENT_BYTES = 1 << 20
# The experiment list follows these; a stream opened for one experiment gets all of its kinds.
SUMMARY_KINDS = frozenset({"state", "topology", "score", "reload"})


class MalformedEvent(ValueError):
    """A body that is not an event this dashboard can show (the message says why)."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")
    cell: tuple[int, int]
    iteration: int = Field(ge=0)
    epoch: int = Field(0, ge=0)


_NAMESPACED = re.compile(r"\.ns-[A-Za-z0-9_-]{1,64}")


class _Event(BaseModel):
    model_config = ConfigDict(extra="allow")
    experiment: str = Field(pattern=EXPERIMENT_ID.pattern)
    kind: str = Field(pattern=r"^[a-z][a-z_]{0,31}$")


def _no_constant(name: str) -> None:
    """NaN and ±Infinity are not JSON: read as null (as the run directory writes them)."""
    return None


def parse_event(body: bytes, routing_key: str | None = None) -> dict[str, Any]:
    """The event in `body`, checked; MalformedEvent says what is wrong with it."""
    if len(body) > MAX_EVENT_BYTES:
        raise MalformedEvent(f"{len(body)} bytes (limit {MAX_EVENT_BYTES})")
    if not json_depth_ok(body):
        raise MalformedEvent(f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError, MemoryError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise MalformedEvent(f"not JSON: {type(error).__name__}: {str(error)[:200]}") from None
    if not isinstance(data, dict):
        raise MalformedEvent(f"a JSON {type(data).__name__}, not an object")
    try:
        event = _Event.model_validate(data)
        if event.kind == "metrics":
            records = data.get("records", [data.get("record")])
            if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
                raise MalformedEvent("a metrics event without its record (an object) or records (a list of them)")
            for record in records:
                _Record.model_validate(record)
    except ValidationError as error:
        first = error.errors()[0]
        raise MalformedEvent(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    # A namespaced stack's score results carry its namespace last (palomino.transport.score_queue).
    expected = f"exp.{event.experiment}.{event.kind}"
    if (
        routing_key is not None
        and routing_key != expected
        and not _NAMESPACED.fullmatch(routing_key.removeprefix(expected))
    ):
        raise MalformedEvent(
            f"routing key {routing_key!r} does not match experiment {event.experiment!r}, kind {event.kind!r}"
        )
    return data


def one_a_record(event: dict[str, Any]) -> list[dict[str, Any]]:
    """A metrics event of several records as one event each (the browser's form); others as they are."""
    if event["kind"] != "metrics" or "records" not in event:
        return [event]
    head = {k: v for k, v in event.items() if k != "records"}
    return [{**head, "record": record} for record in event["records"]]


def valid_record(record: Any) -> bool:
    """Whether a metrics.jsonl line has what the page keys records by (cell, iteration)."""
    try:
        _Record.model_validate(record)
    except ValidationError:
        return False
    return True


class Subscription:
    def __init__(self, experiment: str | None, buffer: int) -> None:
        self.experiment = experiment
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(buffer)
        self.lost = 0

    def wants(self, event: dict[str, Any]) -> bool:
        if self.experiment is None:
            return event["kind"] in SUMMARY_KINDS
        return event["experiment"] == self.experiment

    def offer(self, event: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            # A stalled browser: drop what it has not read and tell it to fetch the history again.
            self.lost += self.queue.qsize() + 1
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait({"experiment": self.experiment or "", "kind": "resync"})


class EventHub:
    """Fan-out from the feeds (RabbitMQ, run directories) to the browsers' streams. One event loop."""

    def __init__(self, buffer: int = 5000, batch: int = 1000, linger: float = 0.1) -> None:
        # `linger`: after the first event of a batch, wait this long for more, so that a 12×12 grid's
        # records travel as a few messages a second instead of one per cell.
        self.buffer, self.batch, self.linger = buffer, batch, linger
        self._subscriptions: set[Subscription] = set()
        self.published = 0

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)

    def publish(self, event: dict[str, Any]) -> None:
        self.published += 1
        for subscription in self._subscriptions:
            if subscription.wants(event):
                subscription.offer(event)

    @contextmanager
    def subscribe(self, experiment: str | None = None) -> Iterator[Subscription]:
        subscription = Subscription(experiment, self.buffer)
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.discard(subscription)

    async def batches(self, subscription: Subscription) -> AsyncIterator[list[dict[str, Any]]]:
        """Whatever has arrived since the last batch (at least one event): one SSE message per batch."""
        while True:
            events = [await subscription.queue.get()]
            if self.linger > 0:
                await asyncio.sleep(self.linger)
            while len(events) < self.batch and not subscription.queue.empty():
                events.append(subscription.queue.get_nowait())
            yield events
