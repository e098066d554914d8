"""The two ports a cell runner talks through. Adapters: in-memory (embedded), RabbitMQ/Redis."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

from palomino.grid import Coord
from palomino.wire import Snapshot


class SnapshotBus(Protocol):
    """Publish my snapshot; read my neighbours' newest ones."""

    async def bind(self, neighbours: Iterable[Coord], epoch: int) -> None:
        """Follow exactly these cells' snapshots from now on (called again when the epoch changes)."""

    async def publish(self, snapshot: Snapshot) -> None:
        """Make `snapshot` visible to the cells that follow its coordinate."""

    async def newest(self, coord: Coord) -> Snapshot | None:
        """The newest snapshot held of `coord`, or None; never blocks."""

    async def wait(self, coord: Coord, iteration: int, timeout: float | None = None) -> Snapshot:
        """Block until a snapshot of `coord` with iteration ≥ `iteration` is held.

        Returns the snapshot of exactly `iteration` while it is still held (buses keep
        each cell's last two), so synchronous runs see their neighbours' iteration i−1
        even when a neighbour has run one ahead. Raises TimeoutError after `timeout` s.
        """


class Liveness(Protocol):
    """Heartbeats with a time-to-live; whoever stops beating drops out of `alive()`."""

    async def heartbeat(self, worker: str, ttl: float) -> None: ...

    async def alive(self) -> set[str]: ...


class Recorder(Protocol):
    """Where a cell's records go: the run directory (embedded) or the orchestrator (distributed)."""

    async def metrics(self, record: dict[str, Any]) -> None: ...

    async def samples(self, coord: Coord, iteration: int, samples: torch.Tensor) -> None: ...

    async def checkpoint(
        self, coord: Coord, iteration: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
    ) -> None: ...
