"""The snapshots a bus holds: each cell's last two, with waiting. Shared by every SnapshotBus adapter."""

from __future__ import annotations

import asyncio
from collections import deque

from palomino.grid import Coord
from palomino.wire import Snapshot

HISTORY = 2  # enough for synchronous runs: a neighbour is never more than one iteration ahead


class SnapshotStore:
    def __init__(self) -> None:
        self._held: dict[Coord, deque[Snapshot]] = {}
        self._changed = asyncio.Condition()

    async def put(self, snapshot: Snapshot) -> None:
        coord = Coord(*snapshot.header.cell)
        async with self._changed:
            # Appended even if older than the newest: a replacement cell restored from a checkpoint
            # legitimately starts again from an earlier iteration.
            self._held.setdefault(coord, deque(maxlen=HISTORY)).append(snapshot)
            self._changed.notify_all()

    def newest(self, coord: Coord) -> Snapshot | None:
        held = self._held.get(Coord(*coord))
        return held[-1] if held else None

    def forget(self, coord: Coord) -> None:
        self._held.pop(Coord(*coord), None)

    def _pick(self, coord: Coord, iteration: int) -> Snapshot | None:
        held = self._held.get(Coord(*coord))
        if not held or held[-1].iteration < iteration:
            return None
        exact = [s for s in held if s.iteration == iteration]
        return exact[0] if exact else held[-1]

    async def wait(self, coord: Coord, iteration: int, timeout: float | None = None) -> Snapshot:
        async with self._changed:
            if self._pick(coord, iteration) is None:  # wait_for(…, 0) would time out even on one held
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._pick(coord, iteration) is not None), timeout
                )
            snapshot = self._pick(coord, iteration)
        assert snapshot is not None
        return snapshot
