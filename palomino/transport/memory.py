"""In-memory adapters: every cell in one process, one event loop, no broker."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable, Iterable

from palomino.grid import Coord
from palomino.wire import Snapshot

_HISTORY = 2  # enough for synchronous runs: a neighbour is never more than one iteration ahead


class InMemorySnapshotBus:
    def __init__(self) -> None:
        self._held: dict[Coord, deque[Snapshot]] = {}
        self._changed = asyncio.Condition()

    async def bind(self, neighbours: Iterable[Coord], epoch: int) -> None:
        # Every snapshot of the process is visible; nothing to subscribe to.
        return None

    async def publish(self, snapshot: Snapshot) -> None:
        coord = Coord(*snapshot.header.cell)
        async with self._changed:
            self._held.setdefault(coord, deque(maxlen=_HISTORY)).append(snapshot)
            self._changed.notify_all()

    async def newest(self, coord: Coord) -> Snapshot | None:
        held = self._held.get(Coord(*coord))
        return held[-1] if held else None

    def _pick(self, coord: Coord, iteration: int) -> Snapshot | None:
        held = self._held.get(Coord(*coord))
        if not held or held[-1].iteration < iteration:
            return None
        exact = [s for s in held if s.iteration == iteration]
        return exact[0] if exact else held[-1]

    async def wait(self, coord: Coord, iteration: int, timeout: float | None = None) -> Snapshot:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self._pick(coord, iteration) is not None), timeout
            )
            snapshot = self._pick(coord, iteration)
        assert snapshot is not None
        return snapshot


class InMemoryLiveness:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._expires: dict[str, float] = {}

    async def heartbeat(self, worker: str, ttl: float) -> None:
        self._expires[worker] = self._clock() + ttl

    async def alive(self) -> set[str]:
        now = self._clock()
        return {worker for worker, expires in self._expires.items() if expires > now}

    async def forget(self, worker: str) -> None:
        self._expires.pop(worker, None)
