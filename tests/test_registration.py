"""How spares become known: idle slots register at a falling rate, and an orchestrator that sees
a live slot it does not know (it restarted, a Register was lost) asks it to register (Hello).

The control channel (under the worker's outbox) is a recorder on both sides; tests/test_chaos.py restarts a real orchestrator
among real workers."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from pathlib import Path

import pytest
from helpers import running_2x2

from palomino.services.cell import worker as worker_module
from palomino.services.cell.outbox import Outbox
from palomino.services.cell.worker import CellWorker
from palomino.services.common.service_settings import ServiceSettings
from palomino.wire.control_messages import Hello, Register


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[float, object]] = []

    async def send(self, address: str, message: object, payload: bytes = b"") -> None:
        self.sent.append((asyncio.get_running_loop().time(), message))


async def test_idle_slots_announce_themselves_ever_more_rarely_and_at_once_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_module, "REGISTER_PERIOD", 0.2)
    monkeypatch.setattr(worker_module, "REGISTER_PERIOD_MAX", 1.6)
    monkeypatch.setattr(worker_module, "HELLO_GAP", 0.05)
    worker = CellWorker(ServiceSettings(), "w", cells=2)
    worker.outbox = Outbox(control := Recorder(), worker.orchestrator)  # type: ignore[arg-type]
    task = asyncio.create_task(worker._registrations())
    try:
        await asyncio.sleep(1.6)  # sent at 0, 0.2, 0.6, 1.4: at a fixed 0.2 s, eight
        times = [t for t, _ in control.sent]
        assert 3 <= len(times) <= 5, times
        gaps = [b - a for a, b in pairwise(times)]
        assert gaps[-1] > 1.5 * gaps[0], gaps
        count = len(control.sent)
        await worker._on_control(Hello(worker="w/1"), b"")  # the next would be 1.6 s after the last
        await asyncio.sleep(0.4)
        assert len(control.sent) == count + 1
        await worker._on_control(Hello(worker="someone-else"), b"")  # not one of its slots
        await asyncio.sleep(0.4)
        assert len(control.sent) == count + 1
    finally:
        task.cancel()
    registers = [m for _, m in control.sent]
    assert all(isinstance(m, Register) and (m.worker, m.slots) == ("w/0", ["w/1"]) for m in registers)


def test_the_orchestrator_asks_live_slots_it_does_not_know_and_not_again_at_once(tmp_path: Path) -> None:
    orchestrator, _ = running_2x2(tmp_path)
    orchestrator.shared.alive = {"w0", "w1", "w2", "w3", "spare/0", "spare/1"}  # w0–w3 are the layout's

    async def go() -> None:
        await orchestrator.supervisor.greet()
        await orchestrator.supervisor.greet()  # half a second later: not asked again yet

    asyncio.run(go())
    hellos = sorted((address, m.worker) for address, m in orchestrator.control.sent if isinstance(m, Hello))
    assert hellos == [("cell.spare/0", "spare/0"), ("cell.spare/1", "spare/1")]
