"""tests/faults.py, the fault injection that chaos.py and the partition tests use (issue 50): a link
that partitions without closing anything, and a pause of a process tree."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faults import Link, pause, resume

from palomino.errors import TransportError


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1024):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address
    server.shutdown()
    server.server_close()


def ask(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    try:
        return sock.recv(1024)
    except TimeoutError:
        return b""


def test_a_cut_link_holds_every_byte_and_keeps_the_connection_open(echo: tuple[str, int]) -> None:
    link = Link(echo).start()
    try:
        assert link.url("amqp://u:p@server:5672/vhost") == f"amqp://u:p@127.0.0.1:{link.port}/vhost"
        assert link.url("redis://server:6379/0") == f"redis://127.0.0.1:{link.port}/0"
        sock = socket.create_connection(("127.0.0.1", link.port), timeout=1)
        assert ask(sock, b"one") == b"one"
        link.cut()
        assert ask(sock, b"held") == b""  # nothing back, and nothing closed: a partition, not a reset
        fresh = socket.create_connection(("127.0.0.1", link.port), timeout=1)
        assert ask(fresh, b"new") == b""  # a new connection gets no answer either
        link.heal()
        sock.settimeout(5)
        fresh.settimeout(5)
        assert sock.recv(1024) == b"held"  # delayed, as TCP would deliver it, not lost
        assert fresh.recv(1024) == b"new" and ask(sock, b"two") == b"two"
        assert link.held == 1 and link.connections == 2
    finally:
        link.stop()


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def settle(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.02)


def test_a_pause_freezes_a_process_and_its_children_until_resumed() -> None:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while len(frozen := pause(parent.pid)) < 2 and time.monotonic() < deadline:
            resume(frozen)  # the child not started yet
            time.sleep(0.1)
        assert len(frozen) == 2
        settle(lambda: all(state(pid) == "T" for pid in frozen))  # a signal lands a moment after it is sent
        resume(frozen)
        settle(lambda: all(state(pid) in "SR" for pid in frozen))
    finally:
        for pid in reversed(frozen):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.wait()


class Watched(socketserver.BaseRequestHandler):
    """Echo, and tell the test when the client's connection closed on the server's side."""

    closed = threading.Event()

    def handle(self) -> None:
        while data := self.request.recv(1024):
            self.request.sendall(data)
        Watched.closed.set()


def test_a_delayed_link_delivers_everything_late_and_in_order(echo: tuple[str, int]) -> None:
    link = Link(echo).start()
    try:
        link.delay(0.3)
        sock = socket.create_connection(("127.0.0.1", link.port), timeout=5)
        started = time.monotonic()
        for part in (b"a", b"b", b"c"):
            sock.sendall(part)
        received = b""
        while len(received) < 3:
            received += sock.recv(1024)
        assert received == b"abc" and time.monotonic() - started >= 0.6  # there and back
    finally:
        link.stop()


def test_a_throttled_link_carries_at_most_its_rate(echo: tuple[str, int]) -> None:
    link = Link(echo).start()
    try:
        link.throttle(40_000)
        sock = socket.create_connection(("127.0.0.1", link.port), timeout=10)
        started = time.monotonic()
        sock.sendall(bytes(40_000))
        received = 0
        while received < 40_000:
            received += len(sock.recv(65536))
        assert time.monotonic() - started >= 0.9  # 40 kB at 40 kB/s, before the echo's way back
    finally:
        link.stop()


def test_a_half_open_link_closes_the_servers_side_and_leaves_the_client_talking_to_nothing() -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Watched)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    link = Link(server.server_address).start()
    try:
        Watched.closed.clear()
        sock = socket.create_connection(("127.0.0.1", link.port), timeout=1)
        assert ask(sock, b"one") == b"one"
        assert link.half_open() == 1
        assert Watched.closed.wait(5)  # the server saw its client go
        sock.sendall(b"into the void")  # the client's socket is open: its writes succeed
        assert ask(sock, b"anyone?") == b""  # and nothing answers, nor closes it (recv timed out)
        fresh = socket.create_connection(("127.0.0.1", link.port), timeout=1)
        assert ask(fresh, b"new") == b"new"  # a new connection goes through
    finally:
        link.stop()
        server.shutdown()
        server.server_close()


def test_every_broker_connection_has_palomino_s_heartbeat_unless_its_url_names_one() -> None:
    from palomino.transport.broker import HEARTBEAT, with_heartbeat

    assert with_heartbeat("amqp://u:p@h:5672/") == f"amqp://u:p@h:5672/?heartbeat={HEARTBEAT}"
    assert with_heartbeat("amqp://h/v?frame_max=131072") == f"amqp://h/v?frame_max=131072&heartbeat={HEARTBEAT}"
    assert with_heartbeat("amqp://h/?heartbeat=5") == "amqp://h/?heartbeat=5"


@pytest.mark.integration
async def test_a_worker_behind_a_half_open_broker_link_hears_the_orchestrator_again(broker_url: str) -> None:
    """The broker drops the worker's connection (and its exclusive queue) while the worker's socket
    stays open and silent: only the AMQP heartbeat can tell it (here 4 s, named in the URL, to keep
    the test short; Palomino's default is HEARTBEAT). It reconnects, declares its queue again, and
    what the orchestrator sends after reaches it."""
    from palomino.transport.control_channel import ControlChannel, cell_address
    from palomino.wire.control_messages import ControlMessage, Hello

    heartbeat = 4
    host, port = broker_url.split("@")[1].split("/")[0].split(":")
    link = Link((host, int(port))).start()
    worker = f"half-open-{os.getpid()}"
    url = link.url(broker_url) + ("&" if "?" in broker_url else "?") + f"heartbeat={heartbeat}"
    cell = await ControlChannel(url, cell_address(worker)).connect()
    orchestrator = await ControlChannel(broker_url, f"cell.sender-{os.getpid()}").connect()
    heard: asyncio.Queue[ControlMessage] = asyncio.Queue()

    async def on_message(message: ControlMessage, payload: bytes) -> None:
        heard.put_nowait(message)

    try:
        await cell.listen(on_message)
        ping = Hello(worker=worker)
        await orchestrator.send(cell_address(worker), ping)
        assert (await asyncio.wait_for(heard.get(), 10)).kind == "hello"
        assert cell.connection.transport.connection.heartbeat_timeout == heartbeat
        connections = link.connections
        assert link.half_open() == 1
        started = time.monotonic()
        # Until the worker notices, what is sent to it is unroutable (its queue went with the broker's
        # side of the connection): send until one lands. aiormq gives up on a silent server after
        # (heartbeat + 1) × 3 s.
        while heard.empty():
            assert time.monotonic() - started < 6 * (heartbeat + 1), "still deaf after twice aiormq's grace"
            with contextlib.suppress(TransportError):
                await orchestrator.send(cell_address(worker), ping, timeout=1)
            await asyncio.sleep(0.5)
        assert link.connections > connections  # it reconnected, through the link
    finally:
        await cell.close()
        await orchestrator.close()
        link.stop()
