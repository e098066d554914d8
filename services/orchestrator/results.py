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

from palomino.errors import PalominoError
from palomino.grid import Coord
from palomino.runs.directory import RunDirectory, finite_json
from palomino.runs.result import CellResult, grid_components, save_encoded, write_ensemble, write_result
from palomino.services.orchestrator.experiment import Experiment
from palomino.services.orchestrator.experiment_store import write_collected
from palomino.services.orchestrator.placement import Placement
from palomino.services.orchestrator.shared import Shared
from palomino.wire.control_messages import Done
from palomino.wire.score_messages import ScoreJob, ScoreResult

log = logging.getLogger(__name__)


def accept_ensemble(run: RunDirectory, result: ScoreResult) -> None:
    """result/grid/ (every cell's generator) with the weights a scorer optimised becomes result/.
    The weights are checked against the components: a forged or stale result changes nothing."""
    summary = result.ensemble or {}
    folder = run.result_dir / "grid"
    description = json.loads((folder / "mixture.json").read_text())
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
    write_ensemble(run, (folder / "mixture.safetensors").read_bytes(), description, summary, png)


def record_score(folder: Path, result: ScoreResult) -> None:
    """Merge one result into scores.json, laid out as `palomino score` writes it ("best", "cells"),
    plus "periodic": {"r-c@iteration": ...} for `scoring.every`. A failed job's entry is {"error": ...}."""
    import json

    from palomino.io import atomic_write

    path = RunDirectory(folder).scores_path
    try:
        scores = json.loads(path.read_text())
    except (OSError, ValueError):
        scores = {}
    scores.setdefault("run", result.experiment)
    entry = {"scorer": result.scorer, **({"error": result.error} if result.error else result.scores)}
    if result.iteration is None and result.target == "best":
        scores["best"] = entry
    elif result.iteration is None:
        scores.setdefault("cells", {})[result.target] = entry
    else:
        scores.setdefault("periodic", {})[f"{result.target}@{result.iteration}"] = {
            "iteration": result.iteration,
            **entry,
        }
    atomic_write(path, json.dumps(finite_json(scores), indent=2, allow_nan=False).encode())


class Results:
    def __init__(self, shared: Shared, placement: Placement) -> None:
        self.shared, self.placement = shared, placement

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
            await self._enqueue_scoring(experiment, best)
            experiment.release_results()
            await self.placement.forget_all_published(experiment)

    async def _enqueue_scoring(self, experiment: Experiment, best: CellResult) -> None:
        """Score jobs for the best mixture and every cell's (scorers may come later: the queue keeps them)."""
        scoring = experiment.config.scoring
        if not scoring.final:
            return
        targets = [
            (str(coord), result.description, result.payload, None) for coord, result in sorted(experiment.done.items())
        ]
        if experiment.partition is None:  # a class mixture has no single payload: `palomino score` scores it
            targets.insert(0, await self._best_target(experiment, best))
        for target, description, payload, ensemble in targets:
            job = ScoreJob.of(experiment.id, experiment.config, target, description, ensemble=ensemble)
            try:
                await self.shared.scoring.enqueue(job, payload)
            except PalominoError as error:
                log.warning("score job %s not queued: %s", job.job, error)
                return

    async def _best_target(self, experiment: Experiment, best: CellResult) -> tuple[str, dict, bytes, dict | None]:
        """The "best" score job: the best neighbourhood mixture, or — training.ensemble.scope grid — every
        cell's generator, for the scorer to optimise into the grid's ensemble (kept in result/grid/
        until its weights come back)."""
        config = experiment.config
        if not config.grid_ensemble:
            return "best", best.description, best.payload, None
        results = list(experiment.done.values())
        try:
            payload, description = await asyncio.to_thread(grid_components, results, experiment.id)
            await asyncio.to_thread(save_encoded, experiment.run.result_dir / "grid", payload, description)
        except (OSError, ValueError, KeyError) as error:  # the best cell's mixture is still a result
            log.warning("experiment %s: no grid ensemble (%s); scoring the best cell's mixture", experiment.id, error)
            return "best", best.description, best.payload, None
        return "best", description, payload, config.model_dump(mode="json")

    async def on_score(self, result: ScoreResult) -> None:
        """A scorer's result → the run's scores.json (also for runs this orchestrator no longer holds);
        an ensemble's weights → result/ first."""
        experiment = self.shared.experiments.get(result.experiment)
        folder = experiment.run.path if experiment else self.shared.runs / result.experiment
        if not RunDirectory(folder).is_run():
            log.info("score for unknown experiment %s dropped", result.experiment)
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
