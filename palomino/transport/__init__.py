"""Ports between a cell and the world, and their in-memory adapters (embedded mode)."""

from palomino.transport.memory import InMemoryLiveness, InMemorySnapshotBus
from palomino.transport.ports import Liveness, Recorder, SnapshotBus

__all__ = ["InMemoryLiveness", "InMemorySnapshotBus", "Liveness", "Recorder", "SnapshotBus"]
