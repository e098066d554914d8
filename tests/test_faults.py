"""tests/faults.py, the fault injection that chaos.py and the partition tests use (issue 50): a link
that partitions without closing anything, and a pause of a process tree."""

from __future__ import annotations

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
