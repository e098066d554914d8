"""`palomino scorer`: scores mixtures from the work queue `palomino.score`, away from training.

A thin shell: the job carries the mixture and the data configuration, `palomino.scoring`
computes the metrics in a thread (the connection's heartbeats go on), the result goes to
`palomino.events`. A job that cannot be scored (a mixture that does not load, data that is
missing, a classifier that is not there) gets a result with the error, and is acked: no crash loop.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import tempfile
import time
from pathlib import Path

from palomino.errors import PalominoError
from palomino.services.common.service_settings import ServiceSettings
from palomino.transport.score_queue import ScoreQueue
from palomino.wire.score_messages import ScoreJob, ScoreResult

log = logging.getLogger(__name__)


def score_job(job: ScoreJob, payload: bytes) -> tuple[dict, dict | None, bytes | None]:
    """(the job's scores, an ensemble job's summary, its samples' PNG). Torch; runs in a worker
    thread. Raises PalominoError/ValueError on bad input."""
    from palomino.config import DataConfig
    from palomino.runs.mixture import Mixture
    from palomino.runs.result import save_encoded
    from palomino.scoring import ScoringOptions, score_mixture

    data = DataConfig.model_validate(job.data)
    options = ScoringOptions.model_validate(job.options)
    with tempfile.TemporaryDirectory(prefix="palomino-score-") as folder:
        save_encoded(Path(folder), payload, job.mixture)
        mixture = Mixture.load(Path(folder))
    summary, png = None, None
    if job.ensemble is not None:
        summary, png = optimise_job_mixture(mixture, data, job)
    return score_mixture(mixture, data, options, data_seed=job.data_seed), summary, png


def optimise_job_mixture(mixture, data, job: ScoreJob) -> tuple[dict, bytes]:
    """The whole grid's ensemble of a distributed run: weights optimised here, where torch and data are."""
    from palomino.config import ExperimentConfig
    from palomino.data import load_dataset
    from palomino.errors import PalominoError
    from palomino.runs.grid_ensemble import grid_ensemble
    from palomino.runs.images import picture_of, picture_samples, png_bytes
    from palomino.scoring.extractors import ensemble_features

    if mixture.conditional:
        raise PalominoError("a conditional run's generators are not ensembled over the grid")
    config = ExperimentConfig.model_validate(job.ensemble)
    dataset = load_dataset(data, job.data_seed)
    features = ensemble_features(config, dataset.kind)
    critics = mixture.critics or None
    grid = grid_ensemble(mixture.generators, mixture.components, dataset, config, critics=critics, features=features)
    mixture.weights = grid.ensemble.weights
    grid.apply_filter(mixture)
    n = picture_samples(dataset.kind)
    return grid.summary(), png_bytes(picture_of(mixture.sample(n, seed=config.seed), dataset.kind, dataset.modes))


class Scorer:
    def __init__(self, settings: ServiceSettings, name: str | None = None) -> None:
        self.settings = settings
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.shutdown = asyncio.Event()
        self.ready = False  # connected and consuming: a signal now means "finish the job, then leave"
        self.scored = 0

    def request_shutdown(self) -> None:
        self.shutdown.set()

    async def handle(self, job: ScoreJob, payload: bytes) -> ScoreResult:
        log.info("scoring job %s (%s of %s)", job.job, job.target, job.experiment)
        started = time.monotonic()
        result = ScoreResult(
            job=job.job, experiment=job.experiment, target=job.target, iteration=job.iteration, scorer=self.name
        )
        try:
            result.scores, result.ensemble, png = await asyncio.to_thread(score_job, job, payload)
            result.samples_png = base64.b64encode(png).decode() if png else None
        except PalominoError as error:
            log.warning("job %s cannot be scored: %s", job.job, error)
            result.error = str(error)
        except Exception as error:  # a payload safetensors rejects, a config that does not validate, …
            log.warning("job %s cannot be scored: %s: %s", job.job, type(error).__name__, error, exc_info=True)
            result.error = f"{type(error).__name__}: {error}"
        self.scored += 1
        log.info(
            "job %s done in %.1f s%s",
            job.job,
            time.monotonic() - started,
            f" (error: {result.error})" if result.error else "",
        )
        return result

    async def run(self) -> None:
        queue = await ScoreQueue(
            self.settings.broker_url,
            self.settings.namespace,
            key=self.settings.signer,
            connect_deadline=self.settings.connect_deadline,
        ).connect()
        try:
            await queue.consume(self.handle)
            self.ready = True
            log.info("scorer %s ready (broker %s)", self.name, self.settings.broker_url.split("@")[-1])
            await self.shutdown.wait()
        finally:
            await queue.close()
