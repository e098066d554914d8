"""Live events into the hub: from RabbitMQ's `palomino.events`, and from run directories as they are written.

The broker feed follows distributed runs (the orchestrator publishes every record it stores);
the runs feed follows anything that writes a run directory — `palomino train`, or an
orchestrator on the same filesystem. Both at once may deliver a record twice: the page keys
records by (cell, iteration), so a duplicate changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from palomino.services.common.runfiles import RunsFolder
from palomino.services.dashboard.events import EventHub, MalformedEvent, one_a_record, parse_event, valid_record
from palomino.transport.broker import DEAD_EXCHANGE, EVENTS_EXCHANGE, connect, declare_dead_letters
from palomino.transport.guard import Guard
from palomino.transport.urls import redact

log = logging.getLogger(__name__)


class BrokerFeed:
    """An exclusive queue bound to every experiment's events; malformed bodies are dead-lettered and logged."""

    def __init__(self, url: str, hub: EventHub, *, backlog: int = 10_000) -> None:
        self.url, self.hub, self.backlog = url, hub, backlog
        self.received = 0
        self._guard = Guard(log, shown=(MalformedEvent,))
        self._connection: AbstractRobustConnection | None = None

    async def start(self) -> None:
        self._connection = await connect(self.url)
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=500)
        events = await channel.declare_exchange(EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        await declare_dead_letters(channel)
        queue = await channel.declare_queue(
            f"palomino.dashboard.{secrets.token_hex(4)}",
            exclusive=True,
            # A dashboard that stalls keeps only the newest events instead of growing the broker.
            arguments={
                "x-dead-letter-exchange": DEAD_EXCHANGE,
                "x-max-length": self.backlog,
                "x-overflow": "drop-head",
            },
        )
        await queue.bind(events, routing_key="exp.#")
        await queue.consume(self._on_message)
        log.info("dashboard: following %s on %s", EVENTS_EXCHANGE, redact(self.url))

    @property
    def rejected(self) -> int:
        return self._guard.rejected

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        await self._guard(message, "an event (key {key})", self._parse, self._show)

    @staticmethod
    def _parse(message: AbstractIncomingMessage) -> dict[str, Any]:
        return parse_event(message.body, message.routing_key)

    async def _show(self, event: dict[str, Any]) -> None:
        self.received += 1
        for one in one_a_record(event):
            self.hub.publish(one)

    @property
    def connected(self) -> bool:
        return self._connection is not None and not self._connection.is_closed

    def status(self) -> dict[str, Any]:
        return {
            "url": redact(self.url),
            "connected": self.connected,
            "received": self.received,
            "rejected": self.rejected,
        }

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()


class RunsFeed:
    """Polls run directories: new metrics lines, new layouts and state changes become events.

    Runs already there at start begin at their end (their past is history, not news); runs
    that appear later are followed from their first line.
    """

    def __init__(self, folder: RunsFolder, hub: EventHub, period: float = 0.5) -> None:
        self.folder, self.hub, self.period = folder, hub, period
        self.emitted = 0
        self._seen: dict[str, tuple[int, int, str]] = {}  # experiment → (records, layouts, state) already told
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self._scan, True)
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                events = await asyncio.to_thread(self._scan, False)
            except OSError as error:  # a run directory removed mid-scan, a full disk: try again later
                log.warning("reading run directories: %s", error)
                continue
            for event in events:
                self.hub.publish(event)
            self.emitted += len(events)

    def _scan(self, first: bool) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for experiment in self.folder.ids():
            run = self.folder.get(experiment)
            if run is None:
                continue
            replaced = run.metrics.refresh()
            records, layouts, state = run.metrics.count, len(run.layouts()), run.state()
            told = self._seen.get(experiment)
            self._seen[experiment] = (records, layouts, state)
            if first:
                continue
            if told is None:
                told = (0, 0, "")
            if replaced:
                events.append({"experiment": experiment, "kind": "reload"})
            elif records > told[0]:
                new, _ = run.metrics.read(told[0], records - told[0])
                events.extend(
                    {"experiment": experiment, "kind": "metrics", "record": r} for r in new if valid_record(r)
                )
            if layouts > told[1]:
                events.append({"experiment": experiment, "kind": "topology", **run.summary()})
            if state != told[2]:
                events.append({"experiment": experiment, "kind": "state", "state": state, "reason": ""})
        return events

    def status(self) -> dict[str, Any]:
        return {"path": str(self.folder.path), "runs": len(self._seen), "emitted": self.emitted}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
