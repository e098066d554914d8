"""A finished cell's Done reaches the orchestrator even when its capped queue drops it: the cell
re-sends it until the orchestrator acknowledges it (real broker, the session's own; the real
orchestrator's message handling on a running experiment)."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
from conftest import wait_until_async
from helpers import done, running_2x2

from palomino.grid import Coord
from palomino.services.cell.done_delivery import DoneDelivery
from palomino.transport.control_channel import ControlChannel, cell_address, orchestrator_address
from palomino.wire.control_messages import DoneAck, Register


@pytest.mark.integration
async def test_a_done_pushed_out_of_the_capped_queue_is_sent_again_until_acknowledged(
    broker_url: str, tmp_path: Path
) -> None:
    orchestrator, experiment = running_2x2(tmp_path)
    address = orchestrator_address(f"test-{secrets.token_hex(4)}")
    # The orchestrator is down: its queue fills, and past its cap of 5 the oldest go.
    queue = await ControlChannel(broker_url, address, cap=(5, 1024**2)).connect()
    cell = await ControlChannel(broker_url, cell_address("w1")).connect()
    sends = 0

    async def send(message, payload: bytes) -> None:
        nonlocal sends
        sends += 1
        await cell.send(address, message, payload)

    delivery = DoneDelivery(send, first=1.0, longest=1.0)

    async def on_cell(message, payload: bytes) -> None:
        if isinstance(message, DoneAck):
            delivery.acknowledged(message)

    await cell.listen(on_cell)
    resending = asyncio.create_task(delivery.run())
    try:
        await delivery.send(done("w1", (0, 1)), b"")
        for i in range(10):  # other workers announce themselves: the Done is pushed out of the queue
            await cell.send(address, Register(worker=f"spare{i}", host="h", pid=i))
        orchestrator.control = queue
        await queue.listen(orchestrator.on_control)  # the orchestrator is back
        await wait_until_async(lambda: not delivery.pending, timeout=30)
        assert set(experiment.done) == {Coord(0, 1)}
        assert sends >= 2  # the first was dropped by the cap: only a re-send got through
        settled = sends
        await asyncio.sleep(2.5)
        assert sends == settled  # acknowledged: no more re-sends
    finally:
        resending.cancel()
        await queue.channel.queue_delete(f"palomino.{address}")
        await queue.close()
        await cell.close()
