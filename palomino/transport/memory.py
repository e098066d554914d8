"""In-memory adapters: every cell in one process, one event loop, no broker."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from palomino.grid import Coord
from palomino.transport.store import SnapshotStore
from palomino.wire import Snapshot


class InMemorySnapshotBus:
    def __init__(self) -> None:
        self._store = SnapshotStore()

    async def bind(self, neighbours: Iterable[Coord], epoch: int) -> None:
        # Every snapshot of the process is visible; nothing to subscribe to.
        return None

    async def publish(self, snapshot: Snapshot) -> None:
        await self._store.put(snapshot)

    async def newest(self, coord: Coord) -> Snapshot | None:
        return self._store.newest(coord)

    async def wait(self, coord: Coord, iteration: int, timeout: float | None = None) -> Snapshot:
        return await self._store.wait(coord, iteration, timeout)


class InMemoryLiveness:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._expires: dict[str, float] = {}

    async def heartbeat(self, worker: str, ttl: float) -> None:
        self._expires[worker] = self._clock() + ttl

    async def alive(self) -> set[str]:
        now = self._clock()
        return {worker for worker, expires in self._expires.items() if expires > now}
