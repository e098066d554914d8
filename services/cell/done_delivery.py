"""A finished cell's Done, re-sent until the orchestrator acknowledges it (DoneAck).

The orchestrator's queue is capped (past the cap the oldest messages are dead-lettered) and the
orchestrator may be down: a Done lost there left the experiment waiting for a cell that had
finished and only heartbeated. So a Done stays pending, re-sent with a doubling period, until
the orchestrator says it has it, or has decided never to take it (a stale or late Done is acked
too). Duplicates are harmless: the orchestrator takes a cell's Done once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from palomino.errors import PalominoError
from palomino.wire.control_messages import Done, DoneAck

log = logging.getLogger(__name__)

RESEND_FIRST = 30.0  # seconds before the first re-send: a busy orchestrator works through its queue first
RESEND_LONGEST = 300.0
GIVE_UP = 24 * 3600.0  # a namespace's orchestrator queue expires a day after its last use: nobody will answer

Send = Callable[[Done, bytes], Awaitable[None]]


@dataclass
class _Pending:
    done: Done
    payload: bytes
    first_sent: float
    next_at: float
    period: float
    sends: int = 0


class DoneDelivery:
    def __init__(
        self, send: Send, *, first: float = RESEND_FIRST, longest: float = RESEND_LONGEST, give_up: float = GIVE_UP
    ) -> None:
        self._send, self.first, self.longest, self.give_up = send, first, longest, give_up
        self._pending: dict[tuple[str, str, tuple[int, int]], _Pending] = {}
        self._settled = asyncio.Event()

    @staticmethod
    def _key(message: Done | DoneAck) -> tuple[str, str, tuple[int, int]]:
        return message.experiment, message.worker, tuple(message.coord)

    @property
    def pending(self) -> list[Done]:
        return [p.done for p in self._pending.values()]

    async def send(self, done: Done, payload: bytes) -> None:
        """Send now and keep it until acknowledged; a failed send is only logged: it is re-sent."""
        now = asyncio.get_running_loop().time()
        pending = self._pending[self._key(done)] = _Pending(done, payload, now, now + self.first, self.first)
        self._settled.clear()
        await self._try(pending)

    def acknowledged(self, ack: DoneAck) -> None:
        pending = self._pending.get(self._key(ack))
        if pending is not None and pending.done.iteration == ack.iteration:
            del self._pending[self._key(ack)]
            log.debug("done of %s acknowledged after %d send(s)", ack.coord, pending.sends)
        if not self._pending:
            self._settled.set()

    async def run(self) -> None:
        """Re-send what is due, for the worker's life."""
        while True:
            await asyncio.sleep(min(1.0, self.first))
            await self.resend_due()

    async def resend_due(self) -> None:
        now = asyncio.get_running_loop().time()
        for key, pending in list(self._pending.items()):
            if now - pending.first_sent > self.give_up:
                log.error("done of cell %s of %s never acknowledged in %.0f s: given up (is the orchestrator gone?)",
                          pending.done.coord, pending.done.experiment, self.give_up)  # fmt: skip
                del self._pending[key]
            elif now >= pending.next_at:
                log.warning("done of cell %s of %s not acknowledged after %.0f s: sending it again",
                            pending.done.coord, pending.done.experiment, now - pending.first_sent)  # fmt: skip
                pending.period = min(2 * pending.period, self.longest)
                pending.next_at = now + pending.period
                await self._try(pending)
        if not self._pending:
            self._settled.set()

    async def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for every Done to be acknowledged (a worker that leaves); whether they were."""
        if not self._pending:
            return True
        try:
            await asyncio.wait_for(self._settled.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _try(self, pending: _Pending) -> None:
        pending.sends += 1
        try:
            await self._send(pending.done, pending.payload)
        except PalominoError as error:
            log.warning("done of cell %s not sent (%s); it is sent again later", pending.done.coord, error)
