"""Connects that survive a storm (issue 52): a broker that drops the first connects (a thousand
workers arriving at once, a broker still starting) is tried again with backoff until it answers,
against a real RabbitMQ (the session's own) behind a TCP proxy the test controls."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

import pytest

from palomino.errors import TransportError
from palomino.transport.broker import connect


class DroppingProxy:
    """Forwards TCP to the broker, except the first `drop` connections, closed on arrival."""

    def __init__(self, broker_url: str, drop: int) -> None:
        parts = urlsplit(broker_url)
        self.target, self.parts, self.drop = (parts.hostname, parts.port or 5672), parts, drop
        self.dropped = self.forwarded = 0
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> DroppingProxy:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        netloc = self.parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{port}"
        self.url = urlunsplit(self.parts._replace(netloc=netloc))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.dropped < self.drop:
            self.dropped += 1
            writer.close()
            return
        self.forwarded += 1
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        for task in (pipe(reader, upstream_writer), pipe(upstream_reader, writer)):
            scheduled = asyncio.create_task(task)
            self._tasks.add(scheduled)
            scheduled.add_done_callback(self._tasks.discard)


@pytest.mark.integration
async def test_connects_dropped_by_the_broker_are_tried_again_until_it_answers(broker_url: str) -> None:
    async with DroppingProxy(broker_url, drop=3) as proxy:
        connection = await connect(proxy.url, deadline=60)
        try:
            channel = await connection.channel()
            await channel.close()
        finally:
            await connection.close()
    assert proxy.dropped == 3 and proxy.forwarded >= 1


@pytest.mark.integration
async def test_a_storm_of_connects_all_get_through(broker_url: str) -> None:
    """64 workers at once against a broker that drops the first 64 connects: every one connects."""
    async with DroppingProxy(broker_url, drop=64) as proxy:
        connections = await asyncio.gather(*(connect(proxy.url, deadline=60) for _ in range(64)))
        try:
            assert all(not c.is_closed for c in connections)
        finally:
            await asyncio.gather(*(c.close() for c in connections))
    assert proxy.dropped == 64


@pytest.mark.integration
async def test_past_its_deadline_a_connect_gives_up_and_says_how_long_it_tried(broker_url: str) -> None:
    async with DroppingProxy(broker_url, drop=10**6) as proxy:
        with pytest.raises(TransportError, match=r"cannot connect to RabbitMQ at amqp://.*\(\d+ tries in \d+ s\)"):
            await connect(proxy.url, deadline=1.0)
    assert proxy.dropped >= 2


@pytest.mark.integration
async def test_bad_credentials_are_not_tried_again(broker_url: str) -> None:
    parts = urlsplit(broker_url)
    wrong = urlunsplit(parts._replace(netloc=f"nobody:wrong@{parts.hostname}:{parts.port or 5672}"))
    with pytest.raises(TransportError, match="cannot connect to RabbitMQ") as raised:
        await connect(wrong, deadline=60)
    assert "tries in" not in str(raised.value)
