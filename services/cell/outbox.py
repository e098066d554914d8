"""A cell worker's one door to the orchestrator: registrations, metrics, samples, checkpoints,
results (Done, re-sent until acknowledged) and failures all leave through its Outbox, which owns
the control channel and knows where each kind goes. A new message kind changes this file and its
receiver (services/orchestrator/orchestrator.py `on_control`), nothing else."""

from __future__ import annotations

import logging
from typing import Any

from aio_pika.abc import AbstractRobustConnection

from palomino.errors import PalominoError
from palomino.services.cell.done_delivery import DoneDelivery
from palomino.transport.control_channel import ControlChannel, checkpoints_address
from palomino.wire.control_messages import Checkpoint, ControlMessage, Done, DoneAck, Failed

log = logging.getLogger(__name__)

# Seconds a checkpoint may wait for room in its queue (a whole grid's last checkpoints arrive at once).
CHECKPOINT_PUBLISH_TIMEOUT = 600.0


class Outbox:
    def __init__(self, control: ControlChannel, orchestrator: str) -> None:
        self.control, self.orchestrator = control, orchestrator
        self.dones = DoneDelivery(self.send)  # run() and settle() by the worker, for its life

    @property
    def connection(self) -> AbstractRobustConnection:
        """The worker's one broker connection: its blocks' snapshot buses and score queues open channels on it."""
        return self.control.connection

    async def send(self, message: ControlMessage, payload: bytes = b"") -> None:
        """To the orchestrator's control queue (capped: past it the oldest are dead-lettered)."""
        await self.control.send(self.orchestrator, message, payload)

    async def checkpoint(self, message: Checkpoint, payload: bytes) -> None:
        """To the checkpoints' own queue, which refuses rather than drops: a full one makes this wait."""
        address = checkpoints_address(self.orchestrator)
        await self.control.send(address, message, payload, timeout=CHECKPOINT_PUBLISH_TIMEOUT)

    async def done(self, done: Done, payload: bytes) -> None:
        """Sent now and again until the orchestrator acknowledges it (`acknowledged`)."""
        await self.dones.send(done, payload)

    def acknowledged(self, ack: DoneAck) -> None:
        self.dones.acknowledged(ack)

    async def failed(self, **fields: Any) -> None:
        """A slot cannot go on (Failed's fields); a report that cannot be sent is logged: its
        heartbeat's end tells the orchestrator the rest."""
        try:
            await self.send(Failed(**fields))
        except PalominoError as error:
            log.warning("could not report the failure: %s", error)
