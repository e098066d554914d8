"""Result collection: each cell's result as it arrives, the run's result once every cell of the
layout has one, score jobs for the scorers, and what the scorers send back."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from pathlib import Path

from palomino.grid import Coord
from palomino.runs.directory import RunDirectory, finite_json
from palomino.runs.result import CellResult, read_encoded, write_ensemble, write_result
from palomino.services.orchestrator import owed_scores
from palomino.services.orchestrator.experiment import Experiment
from palomino.services.orchestrator.experiment_store import write_collected
from palomino.services.orchestrator.placement import Placement
from palomino.services.orchestrator.shared import Shared
from palomino.wire.control_messages import Done
from palomino.wire.score_messages import ScoreResult

log = logging.getLogger(__name__)


def accept_ensemble(run: RunDirectory, result: ScoreResult) -> None:
    """result/grid/ (every cell's generator) with the weights a scorer optimised becomes result/.
    The weights are checked against the components: a forged or stale result changes nothing."""
    summary = result.ensemble or {}
    payload, description = read_encoded(run.result_dir / "grid")
    weights = summary["weights"]
    if (
        not isinstance(weights, list)
        or len(weights) != len(description["components"])
        or summary.get("cells") != description["components"]
        or not all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in weights)
        or sum(weights) <= 0
    ):
        raise ValueError(
            f"weights {str(weights)[:80]} do not fit the grid's {len(description['components'])} components"
        )
    summary = {**summary, "weights": [w / sum(weights) for w in weights]}
    png = base64.b64decode(result.samples_png) if result.samples_png else b""
    write_ensemble(run, payload, description, summary, png)


def read_scores(folder: Path) -> dict:
    try:
        scores = json.loads(RunDirectory(folder).scores_path.read_text())
    except (OSError, ValueError):
        return {}
    return scores if isinstance(scores, dict) else {}


def entry_of(scores: dict, result: ScoreResult) -> tuple[dict, str]:
    """Where `result` goes in scores.json: ("best"), "cells" → target, "periodic" → "r-c@iteration"."""
    if result.iteration is None and result.target == "best":
        return scores, "best"
    if result.iteration is None:
        return scores.setdefault("cells", {}), result.target
    return scores.setdefault("periodic", {}), f"{result.target}@{result.iteration}"


def already_scored(folder: Path, result: ScoreResult) -> bool:
    """Its target has a score already (not an error): a job queued twice (owed_scores) scored twice."""
    section, key = entry_of(read_scores(folder), result)
    return isinstance(section.get(key), dict) and "error" not in section[key]


def record_score(folder: Path, result: ScoreResult) -> None:
    """Merge one result into scores.json, laid out as `palomino score` writes it ("best", "cells"),
    plus "periodic": {"r-c@iteration": ...} for `scoring.every`. A failed job's entry is {"error": ...}."""
    from palomino.io import atomic_write

    scores = read_scores(folder)
    scores.setdefault("run", result.experiment)
    entry = {"scorer": result.scorer, **({"error": result.error} if result.error else result.scores)}
    section, key = entry_of(scores, result)
    section[key] = entry if result.iteration is None else {"iteration": result.iteration, **entry}
    atomic_write(RunDirectory(folder).scores_path, json.dumps(finite_json(scores), indent=2, allow_nan=False).encode())


class Results:
    def __init__(self, shared: Shared, placement: Placement) -> None:
        self.shared, self.placement = shared, placement
        self.owed = owed_scores.OwedScores(shared)

    async def on_done(self, experiment: Experiment, message: Done, payload: bytes) -> None:
        coord = Coord(*message.coord)
        if coord in experiment.done and experiment.cells.get(coord) == message.worker:
            return  # sent again before our acknowledgement reached it: taken once
        if experiment.cells.get(coord) != message.worker:
            if experiment.moved_from.get(message.worker) != coord:
                return  # a cell that has since been replaced
            coord = next(c for c, w in experiment.cells.items() if w == message.worker)
            log.info(
                "cell %s of %s finished before its move: its result stands for %s", message.coord, experiment.id, coord
            )
        experiment.moved_from.pop(message.worker, None)
        experiment.done[coord] = CellResult(
            str(coord),
            message.score,
            message.components,
            message.weights,
            payload,
            message.mixture,
            base64.b64decode(message.samples_png) if message.samples_png else b"",
            trained_at=str(Coord(*message.coord)),
        )
        await asyncio.to_thread(write_collected, experiment.run.path, experiment.done[coord])
        await asyncio.to_thread(experiment.persist)
        if message.worker in self.shared.workers:
            self.shared.workers[message.worker].free()
        await self.maybe_finish(experiment)

    async def maybe_finish(self, experiment: Experiment) -> None:
        """Once every cell of the current layout has reported its result, rank them into result/."""
        if (
            experiment.state == "running"
            and not experiment.collecting
            and set(experiment.done) >= set(experiment.cells)
        ):
            experiment.collecting = True  # before the await: a concurrent Done must not write result/ again
            try:
                best = await asyncio.to_thread(write_result, experiment.run, list(experiment.done.values()))
            except (OSError, ValueError) as error:
                log.exception("experiment %s: the result cannot be written", experiment.id)
                await self.placement.end(experiment, "failed", f"the result cannot be written: {error}")
                return
            if experiment.state != "running":
                return  # stopped while result/ was being written
            experiment.state, experiment.ended_at = "finished", time.time()  # only now: result/ is complete
            experiment.scores_owed = owed_scores.targets(experiment)  # saved with "finished": never lost
            await asyncio.to_thread(experiment.persist)
            self.shared.boards.end(experiment)
            log.info(
                "experiment %s finished: best mixture of cell %s (%s %.4g)",
                experiment.id,
                best.cell,
                best.description.get("score_name", "mmd2"),
                best.score,
            )
            await self.shared.event(
                experiment, "state", {"state": "finished", "best_cell": best.cell, "best_score": best.score}
            )
            experiment.release_results()  # the score jobs are built from the run directory
            await self.owed.pay(experiment)
            await self.placement.forget_all_published(experiment)

    async def on_score(self, result: ScoreResult) -> None:
        """A scorer's result → the run's scores.json (also for runs this orchestrator no longer holds);
        an ensemble's weights → result/ first."""
        experiment = self.shared.experiments.get(result.experiment)
        folder = experiment.run.path if experiment else self.shared.runs / result.experiment
        if not RunDirectory(folder).is_run():
            log.info("score for unknown experiment %s dropped", result.experiment)
            return
        if await asyncio.to_thread(already_scored, folder, result):
            self.shared.counters["scores_twice"] += 1
            log.info("score %s arrived again (its job was queued twice): the first stands", result.job)
            return
        if result.target == "best" and result.ensemble is not None:
            try:
                await asyncio.to_thread(accept_ensemble, RunDirectory(folder), result)
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.warning(
                    "experiment %s: the ensemble's weights are not usable (%s); result/ keeps the best cell's mixture",
                    result.experiment,
                    error,
                )
        await asyncio.to_thread(record_score, folder, result)
