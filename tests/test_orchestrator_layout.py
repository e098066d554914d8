"""The orchestrator's layout bookkeeping when a shrink and a cell's Done cross on the wire.

The control channel here is a recorder: these tests are about the orchestrator's decisions, not
the broker (tests/test_distributed.py runs the same paths with real processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from palomino.config.models import ExperimentConfig
from palomino.grid import Coord, Topology
from palomino.runs.directory import RunDirectory
from palomino.services.orchestrator import Experiment, Orchestrator, Worker
from palomino.services.settings import ServiceSettings
from palomino.wire.control import Done, Resize


class RecordingControl:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    async def send(self, address: str, message: object, payload: bytes = b"") -> None:
        self.sent.append((address, message))

    async def event(self, experiment: str, kind: str, body: dict) -> None:
        pass


def running_2x2(tmp_path: Path) -> tuple[Orchestrator, Experiment]:
    orchestrator = Orchestrator(ServiceSettings(), tmp_path)
    orchestrator.control = RecordingControl()

    async def no_queue(experiment: Experiment, coord: Coord) -> None:
        pass

    orchestrator._forget_published = no_queue  # no last-value queues without a broker
    config = ExperimentConfig.model_validate(
        {"name": "race", "grid": {"rows": 2, "cols": 2}, "distributed": {"min_cells": 2}, "scoring": {"final": False}}
    )
    experiment = Experiment("race-1", config, RunDirectory.create(tmp_path, config), state="running")
    experiment.topology = Topology(2, 2, config.grid.neighbourhood, epoch=0)
    experiment.cells = {Coord(0, 0): "w0", Coord(0, 1): "w1", Coord(1, 0): "w2", Coord(1, 1): "w3"}
    for coord, worker in experiment.cells.items():
        orchestrator.workers[worker] = Worker(worker, experiment=experiment.id, coord=coord, idle=False)
    orchestrator.experiments[experiment.id] = experiment
    return orchestrator, experiment


def done(worker: str, coord: tuple[int, int]) -> Done:
    return Done(experiment="race-1", worker=worker, coord=coord, iteration=9, score=0.1, components=[], weights=[], mixture={})


def test_a_done_sent_just_before_a_shrink_moved_its_worker_counts_where_it_went(tmp_path: Path) -> None:
    orchestrator, experiment = running_2x2(tmp_path)
    # w0 dies; 3 survivors lay out as 1×3: w2 moves from 1-0 and w3 from 1-1 …
    asyncio.run(orchestrator._shrink(experiment, {Coord(0, 0): "w0"}))
    moved = {m.worker: m.coord for _, m in orchestrator.control.sent if isinstance(m, Resize)}
    assert moved == {"w1": (0, 1), "w2": (0, 0), "w3": (0, 2)}
    # … but w2 had finished at 1-0 and its Done crossed the Resize: it stands for 0-0.
    asyncio.run(orchestrator._on_done(experiment, done("w2", (1, 0)), b""))
    assert set(experiment.done) == {Coord(0, 0)} and experiment.done[Coord(0, 0)].cell == "0-0"
    assert experiment.state == "running"


def test_a_done_from_a_replaced_worker_is_still_dropped(tmp_path: Path) -> None:
    orchestrator, experiment = running_2x2(tmp_path)
    asyncio.run(orchestrator._shrink(experiment, {Coord(0, 0): "w0"}))
    asyncio.run(orchestrator._on_done(experiment, done("w0", (0, 0)), b""))  # the dead one, late
    asyncio.run(orchestrator._on_done(experiment, done("w1", (1, 1)), b""))  # never held 1-1
    assert experiment.done == {}
