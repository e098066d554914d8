"""A multi-cell worker's SnapshotBus: neighbours it hosts itself are read from memory, the rest
from the broker. Every snapshot is still published to the broker — for the neighbours outside the
block and for the orchestrator, which restores a dead cell from its newest published snapshot — but
the broker delivers to this worker only the cells it does not host."""

from __future__ import annotations

from collections.abc import Iterable

from palomino.grid import Coord
from palomino.transport.ports import SnapshotBus
from palomino.transport.store import SnapshotStore
from palomino.wire import Snapshot


class BlockBus:
    def __init__(self, remote: SnapshotBus) -> None:
        self.remote = remote
        self._local = SnapshotStore()
        self._hosted: set[Coord] = set()
        self._followed: dict[Coord, set[Coord]] = {}  # hosted cell → its neighbours

    async def bind(self, neighbours: Iterable[Coord], epoch: int) -> None:
        """A loop's own bind is a no-op here: the block binds for all its cells at once (`layout`)."""
        return None

    async def layout(self, neighbours: dict[Coord, Iterable[Coord]], epoch: int) -> None:
        """The block hosts exactly `neighbours`' keys now, each following its neighbours; the broker
        is asked only for those hosted elsewhere."""
        hosted = {Coord(*c) for c in neighbours}
        for gone in self._hosted - hosted:
            self._local.forget(gone)  # moved away or released: another worker publishes it now
        self._hosted = hosted
        self._followed = {Coord(*c): {Coord(*n) for n in ns} for c, ns in neighbours.items()}
        outside = set().union(*self._followed.values()) - hosted if self._followed else set()
        await self.remote.bind(sorted(outside), epoch)

    async def publish(self, snapshot: Snapshot) -> None:
        if Coord(*snapshot.header.cell) in self._hosted:
            await self._local.put(snapshot)
        await self.remote.publish(snapshot)

    async def newest(self, coord: Coord) -> Snapshot | None:
        if Coord(*coord) in self._hosted:
            return self._local.newest(coord)
        return await self.remote.newest(coord)

    async def wait(self, coord: Coord, iteration: int, timeout: float | None = None) -> Snapshot:
        if Coord(*coord) in self._hosted:
            return await self._local.wait(coord, iteration, timeout)
        return await self.remote.wait(coord, iteration, timeout)
