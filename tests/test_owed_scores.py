"""No lost score job: an orchestrator killed anywhere between a run's last Done and its score jobs'
confirmation leaves them owed in orchestrator.json, and its successor queues them; each target's
score is recorded once, however often its job was queued."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from helpers import orchestrator_without_broker

from palomino.config.models import ExperimentConfig
from palomino.errors import PalominoError
from palomino.grid import Coord, Topology
from palomino.runs.directory import RunDirectory
from palomino.services.orchestrator import owed_scores, results
from palomino.services.orchestrator.experiment import Experiment, Worker
from palomino.services.orchestrator.orchestrator import Orchestrator
from palomino.wire.control_messages import Done
from palomino.wire.score_messages import ScoreJob, ScoreResult

CELLS = {Coord(0, 0): "w0", Coord(0, 1): "w1", Coord(1, 0): "w2", Coord(1, 1): "w3"}
TARGETS = {"best", "0-0", "0-1", "1-0", "1-1"}


class Killed(BaseException):
    """The orchestrator's process dies here (a BaseException: nothing in it catches this)."""


class Broker:
    """The durable score queue as the orchestrators see it: a job is in it once enqueue returned
    (the broker's confirmation); it outlives every orchestrator. `refuse` makes enqueue fail."""

    def __init__(self) -> None:
        self.jobs: list[ScoreJob] = []
        self.refuse = False

    async def enqueue(self, job: ScoreJob, payload: bytes) -> None:
        if self.refuse:
            raise PalominoError("cannot publish: the broker is gone")
        assert payload.startswith(b"mixture of "), "a job carries its mixture's bytes"
        self.jobs.append(job)


def orchestrator(runs: Path, broker: Broker) -> Orchestrator:
    live = orchestrator_without_broker(runs)
    live.shared.scoring = broker
    return live


def running(runs: Path, broker: Broker) -> tuple[Orchestrator, Experiment]:
    live = orchestrator(runs, broker)
    config = ExperimentConfig.model_validate(
        {
            "name": "owed",
            "grid": {"rows": 2, "cols": 2},
            "distributed": {"min_cells": 2},
            "training": {"ensemble": {"scope": "neighbourhood"}},
        }
    )
    run = RunDirectory.create(runs, config)
    experiment = Experiment(run.experiment, config, run, state="running")
    experiment.topology = Topology(2, 2, config.grid.neighbourhood, epoch=0)
    experiment.cells = dict(CELLS)
    for coord, worker in CELLS.items():
        live.workers[worker] = Worker(worker, experiment=experiment.id, coord=coord, idle=False)
    live.experiments[experiment.id] = experiment
    experiment.persist()
    return live, experiment


def done(experiment: str, worker: str, coord: Coord) -> Done:
    return Done(
        experiment=experiment,
        worker=worker,
        coord=tuple(coord),
        iteration=9,
        score=0.1 + coord.row + coord.col / 10,
        components=[str(coord)],
        weights=[1.0],
        mixture={"cell": str(coord)},
    )


async def deliver_dones(live: Orchestrator) -> None:
    """Every cell's Done, as the cells resend them until acknowledged."""
    (experiment,) = live.experiments.values()
    for coord, worker in CELLS.items():
        async with live.shared.lock:
            await live.results.on_done(experiment, done(experiment.id, worker, coord), f"mixture of {coord}".encode())


async def score_everything(live: Orchestrator, broker: Broker) -> None:
    """A scorer takes every job the queue holds (twice queued: twice scored) and sends its result."""
    for job in broker.jobs:
        result = ScoreResult(job=job.job, experiment=job.experiment, target=job.target, scorer="s", scores={"fid": 1.0})
        await live.results.on_score(result)


def kill_at(point: int, monkeypatch: pytest.MonkeyPatch, broker: Broker) -> list[int]:
    """Count the orchestrator's await points (threads it waits on, confirmations); die at `point`."""
    passed = [0]
    to_thread, enqueue = asyncio.to_thread, broker.enqueue

    def step() -> None:
        passed[0] += 1
        if passed[0] == point:
            raise Killed

    async def counted_thread(function, *args, **kwargs):
        step()
        return await to_thread(function, *args, **kwargs)

    async def counted_enqueue(job: ScoreJob, payload: bytes) -> None:
        step()
        await enqueue(job, payload)
        step()  # confirmed, not yet struck off

    monkeypatch.setattr(asyncio, "to_thread", counted_thread)
    monkeypatch.setattr(broker, "enqueue", counted_enqueue)
    return passed


def test_a_kill_at_any_point_between_the_last_done_and_the_jobs_confirmation_loses_no_score(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded: list[str] = []
    record = results.record_score

    def counted_record(folder: Path, result: ScoreResult) -> None:
        recorded.append(result.target)
        record(folder, result)

    monkeypatch.setattr(results, "record_score", counted_record)
    point, points = 1, None
    while points is None:
        runs, broker = tmp_path / f"kill-{point}", Broker()
        first, _ = running(runs, broker)
        with monkeypatch.context() as patch:
            passed = kill_at(point, patch, broker)
            try:
                asyncio.run(deliver_dones(first))
                points = passed[0]  # ran to the end: every point has been tried
            except Killed:
                pass
        if points is None:  # its successor: reload, the Dones resent, what was left half done
            second = orchestrator(runs, broker)
            second._reload_experiments()
            asyncio.run(second.resume())
            asyncio.run(deliver_dones(second))
        else:
            second = first
        recorded.clear()
        asyncio.run(score_everything(second, broker))

        (experiment,) = second.experiments.values()
        assert experiment.state == "finished", f"killed at point {point}"
        assert {job.target for job in broker.jobs} == TARGETS, f"killed at point {point}"
        assert sorted(recorded) == sorted(TARGETS), f"killed at point {point}: each score recorded once"
        assert second.counters["scores_twice"] == len(broker.jobs) - len(TARGETS)
        scores = json.loads(experiment.run.scores_path.read_text())
        assert set(scores["cells"]) == TARGETS - {"best"} and scores["best"]["fid"] == 1.0
        assert json.loads((experiment.run.path / "orchestrator.json").read_text())["scores_owed"] == []
        point += 1
    assert (
        points == 4 * 2 + 2 + 5 * 4
    )  # each Done kept and saved; result/, "finished"; each job built, sent, confirmed, struck off


def test_jobs_the_broker_refused_stay_owed_and_are_queued_once_it_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = Broker()
    broker.refuse = True
    live, experiment = running(tmp_path, broker)
    asyncio.run(deliver_dones(live))
    assert experiment.state == "finished" and broker.jobs == []
    saved = json.loads((experiment.run.path / "orchestrator.json").read_text())
    assert saved["state"] == "finished" and set(saved["scores_owed"]) == TARGETS

    asyncio.run(live.results.owed.pay_due())  # too soon after the refusal: not offered again yet
    assert broker.jobs == []
    broker.refuse = False
    monkeypatch.setattr(owed_scores, "RETRY_AFTER", 0.0)
    asyncio.run(live.results.owed.pay_due())
    assert [job.target for job in broker.jobs] == ["best", "0-0", "0-1", "1-0", "1-1"]
    assert experiment.scores_owed == []
    asyncio.run(live.results.owed.pay_due())  # nothing owed: nothing queued again
    assert len(broker.jobs) == 5


def test_a_job_that_cannot_be_built_is_given_up_and_the_rest_are_queued(tmp_path: Path) -> None:
    broker = Broker()
    broker.refuse = True
    live, experiment = running(tmp_path, broker)
    asyncio.run(deliver_dones(live))
    (experiment.run.path / "collected" / "0-1" / "result.json").unlink()  # the disk lost it
    broker.refuse = False
    live.results.owed._refused_at.clear()
    asyncio.run(live.results.owed.pay_due())
    assert [job.target for job in broker.jobs] == ["best", "0-0", "1-0", "1-1"] and experiment.scores_owed == []


def test_an_error_result_gives_way_to_a_later_score(tmp_path: Path) -> None:
    broker = Broker()
    live, experiment = running(tmp_path, broker)
    asyncio.run(deliver_dones(live))
    job, name = f"{experiment.id}:0-0", experiment.id
    failed = ScoreResult(job=job, experiment=name, target="0-0", scorer="s", error="out of memory")
    scored = ScoreResult(job=job, experiment=name, target="0-0", scorer="s", scores={"fid": 2.0})
    for result in (failed, scored, failed):
        asyncio.run(live.results.on_score(result))
    assert json.loads(experiment.run.scores_path.read_text())["cells"]["0-0"] == {"scorer": "s", "fid": 2.0}
