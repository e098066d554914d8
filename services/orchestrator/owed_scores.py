"""The score jobs a finished experiment owes, kept until the broker has confirmed each.

Finishing names them in orchestrator.json in the same write that says "finished", so an
orchestrator killed between the two can no longer lose them; each target is struck off once its
job is confirmed, and a restart (or the supervisor, after the broker refused) queues what is
still owed. Jobs are built from the run directory, so this works the same after a restart,
when the experiment no longer holds its cells' bytes. A kill between a confirmation and its
strike-off queues that job twice: its second result is dropped by `results.record_score`."""

from __future__ import annotations

import asyncio
import logging
import time

from palomino.errors import PalominoError
from palomino.runs.result import grid_components, read_encoded, save_encoded
from palomino.services.orchestrator.experiment import Experiment
from palomino.services.orchestrator.experiment_store import read_collected
from palomino.services.orchestrator.shared import Shared
from palomino.wire.score_messages import ScoreJob

log = logging.getLogger(__name__)
RETRY_AFTER = 10.0  # seconds before jobs the broker refused are offered again


def targets(experiment: Experiment) -> list[str]:
    """What a finished experiment's scoring owes: "best" (none for a class mixture: `palomino score`
    scores that) and every cell's neighbourhood mixture; nothing when scoring.final is off."""
    if not experiment.config.scoring.final:
        return []
    cells = [str(coord) for coord in sorted(experiment.done)]
    return cells if experiment.partition is not None else ["best", *cells]


def build_job(experiment: Experiment, target: str) -> tuple[ScoreJob, bytes]:
    """The job for `target`, read from the run directory (OSError, ValueError, KeyError: unreadable)."""
    run, config = experiment.run, experiment.config
    if target != "best":
        result = read_collected(run.path, [target])[target]
        return ScoreJob.of(experiment.id, config, target, result.description), result.payload
    if config.grid_ensemble:
        try:
            return ensemble_job(experiment)
        except (OSError, ValueError, KeyError) as error:  # the best cell's mixture is still a result
            log.warning("experiment %s: no grid ensemble (%s); scoring the best cell's mixture", experiment.id, error)
    payload, description = read_encoded(run.result_dir)
    return ScoreJob.of(experiment.id, config, "best", description), payload


def ensemble_job(experiment: Experiment) -> tuple[ScoreJob, bytes]:
    """Every cell's generator, for the scorer to optimise into the grid's ensemble (kept in
    result/grid/ until its weights come back: results.accept_ensemble)."""
    run, config = experiment.run, experiment.config
    grid = run.result_dir / "grid"
    if (grid / "mixture.json").is_file():
        payload, description = read_encoded(grid)
    else:
        cells = [str(coord) for coord in sorted(experiment.done)]
        payload, description = grid_components(list(read_collected(run.path, cells).values()), experiment.id)
        save_encoded(grid, payload, description)
    ensemble = config.model_dump(mode="json")
    return ScoreJob.of(experiment.id, config, "best", description, ensemble=ensemble), payload


class OwedScores:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._refused_at: dict[str, float] = {}  # experiment → when the broker last refused its jobs

    async def pay(self, experiment: Experiment) -> None:
        """Queue every job `experiment` still owes, in order, each struck off once confirmed. A refusal
        leaves the rest owed for a later try (`pay_due`); a job that cannot be built is given up, logged."""
        while experiment.scores_owed:
            target = experiment.scores_owed[0]
            try:
                job, payload = await asyncio.to_thread(build_job, experiment, target)
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.error("experiment %s: score job %s cannot be built (%s); not scored", experiment.id, target, error)
            else:
                try:
                    await self.shared.scoring.enqueue(job, payload)
                except PalominoError as error:
                    self._refused_at[experiment.id] = time.monotonic()
                    log.warning(
                        "score job %s not queued yet (%s): %d owed", job.job, error, len(experiment.scores_owed)
                    )
                    return
            experiment.scores_owed.remove(target)
            await asyncio.to_thread(experiment.persist)
        self._refused_at.pop(experiment.id, None)

    async def pay_due(self) -> None:
        """Offer again the jobs of finished experiments that the broker refused (or a restart found owed)."""
        now = time.monotonic()
        for experiment in list(self.shared.experiments.values()):
            due = now - self._refused_at.get(experiment.id, -RETRY_AFTER) >= RETRY_AFTER
            if experiment.finished and experiment.scores_owed and due:
                await self.pay(experiment)
