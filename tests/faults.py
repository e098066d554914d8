"""Faults beyond kills (issue 50), on processes and links a test or benchmark started itself:

- `Link`: a TCP forwarder in front of a server (RabbitMQ, Redis), one a client process, whose
  traffic can be partitioned — `cut()` holds every byte both ways while the sockets stay open (a
  switch or a firewall losing packets: TCP retransmits, so nothing arrives and nothing is lost;
  neither side learns of it until its own timeouts fire) and new connections get no answer;
  `heal()` lets traffic through again, what was held first.
- `delay(seconds)`: every byte arrives that much later, both ways, in order (a long or congested
  path); `throttle(bytes_per_second)`: each direction carries at most that many (a slow link).
- `half_open()`: the server side of every current connection is closed — the server sees its
  client go — while the client's socket stays open and whatever it sends vanishes, answered by
  nothing (a NAT or firewall that forgot the flow, a peer that rebooted): only the client's own
  heartbeat or timeout can tell it. New connections go through as usual.
- `pause(pid)` / `resume(pid)`: SIGSTOP / SIGCONT of a process and its descendants (a kernel that
  froze it, a GC, a VM migration): it wakes up believing no time has passed.

Standard library only, like servers.py, so that benchmarks/chaos.py can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from pathlib import Path


class Link:
    """127.0.0.1:<port> → `target`, in a thread of its own; `cut()` partitions, `heal()` mends."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.partitioned = False
        self.connections = 0  # carried through to the server, in all
        self.held = 0  # connections that arrived while cut (answered once healed, if still there)
        self.latency = 0.0  # seconds added to every byte, each way
        self.rate = 0.0  # bytes a second, each way; 0: unbounded
        self._upstreams: dict[asyncio.StreamWriter, asyncio.StreamWriter] = {}  # server side → client side
        self._blackholed: set[asyncio.StreamWriter] = set()  # client sides whose server side is gone
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()  # set while healed; the link's own loop waits on it
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, name=f"link-{target[1]}", daemon=True)

    def start(self) -> Link:
        self._thread.start()
        self._ready.wait(10)
        return self

    def url(self, url: str) -> str:
        """`url` (amqp://… or redis://…) pointed at this link instead of the server."""
        scheme, rest = url.split("://", 1)
        credentials, _, location = rest.rpartition("@")
        path = location.split("/", 1)[1] if "/" in location else ""
        return f"{scheme}://{credentials + '@' if credentials else ''}127.0.0.1:{self.port}/{path}"

    def cut(self) -> None:
        self.partitioned = True
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        self.partitioned = False
        self._loop.call_soon_threadsafe(self._open.set)

    def delay(self, seconds: float) -> None:
        self.latency = seconds

    def throttle(self, bytes_per_second: float) -> None:
        self.rate = bytes_per_second

    def half_open(self) -> int:
        """Close the server side of every current connection, keep the client side silently open;
        returns how many."""

        closed = []

        def close() -> None:
            for upstream, client in list(self._upstreams.items()):
                self._blackholed.add(client)
                upstream.close()
                closed.append(client)
            done.set()

        done = threading.Event()
        self._loop.call_soon_threadsafe(close)
        done.wait(10)
        return len(closed)

    def stop(self) -> None:
        def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_later(0.1, self._loop.stop)

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(close)
            self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            self._open.set()
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(listen())
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open.is_set():  # no route: nothing answers until the link heals (or the client gives up)
            self.held += 1
            await self._open.wait()
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:  # the server is down (killed by the same soak): as it would be without us
            writer.close()
            return
        self.connections += 1
        self._upstreams[upstream_writer] = writer
        try:
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
        finally:
            self._upstreams.pop(upstream_writer, None)
            self._blackholed.discard(writer)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Bytes from source to sink, each `latency` s after it was read, at most `rate` a second.
        A reader and a sender, so that latency delays bytes without slowing them down."""
        chunks: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def read() -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await source.read(65536):
                    chunks.put_nowait((self._loop.time(), data))
            chunks.put_nowait(None)

        async def send() -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while (chunk := await chunks.get()) is not None:
                    read_at, data = chunk
                    if (wait := read_at + self.latency - self._loop.time()) > 0:
                        await asyncio.sleep(wait)
                    await self._open.wait()  # held while cut: the senders' buffers fill, nothing is lost
                    if sink.is_closing():  # half-open: its server side is gone; the client's bytes vanish
                        continue
                    step = max(1, int(self.rate / 20)) if self.rate else len(data)
                    for start in range(0, len(data), step):  # a twentieth of a second's worth at a time
                        if self.rate:
                            await asyncio.sleep(step / self.rate)
                        sink.write(data[start : start + step])
                        await sink.drain()
            if sink not in self._blackholed:  # a half-open client side stays open, silent
                with contextlib.suppress(Exception):
                    sink.close()

        reader = asyncio.ensure_future(read())
        try:
            await send()
        finally:
            reader.cancel()


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def pause(pid: int) -> list[int]:
    """Freeze `pid` and its descendants; returns them, for `resume`."""
    frozen = tree(pid)
    for each in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGSTOP)
    return frozen


def resume(frozen: list[int]) -> None:
    for each in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGCONT)
