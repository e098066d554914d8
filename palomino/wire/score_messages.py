"""Score jobs (work queue `palomino.score`) and their results (events `exp.<exp>.score`).

A job carries everything a scorer needs, so scorers share no filesystem with anyone: the
mixture (mixture.json as `mixture`, its safetensors as the payload), the data configuration
to compare against and the scoring options. Framed like snapshots: JSON header + checksummed payload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from palomino.errors import SnapshotError, describe_validation
from palomino.wire import frame

if TYPE_CHECKING:
    from palomino.config import ExperimentConfig

SCORE_JOB_MAX_BYTES = 256 * 1024 * 1024
EXPERIMENT_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class ScoreJob(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    kind: Literal["score_job"] = "score_job"
    job: str  # unique per (experiment, target, iteration): a redone job overwrites its result
    experiment: str = Field(pattern=EXPERIMENT_ID)
    target: str  # "best", or the cell "r-c" whose neighbourhood mixture this is
    iteration: int | None = None  # None: the final mixture; else a periodic one (scoring.every)
    mixture: dict[str, Any]  # mixture.json
    data: dict[str, Any]  # the experiment's DataConfig
    data_seed: int = 0  # the experiment's seed: the toys and data.size subsets are drawn with it
    options: dict[str, Any] = {}  # ScoringOptions
    # The experiment's config (ExperimentConfig as JSON) when the scorer is to optimise the mixture's
    # weights first: the whole grid's ensemble of a distributed run (palomino.runs.grid_ensemble).
    ensemble: dict[str, Any] | None = None

    @classmethod
    def of(
        cls,
        experiment: str,
        config: ExperimentConfig,
        target: str,
        mixture: dict[str, Any],
        *,
        iteration: int | None = None,
        ensemble: dict[str, Any] | None = None,
    ) -> ScoreJob:
        """The job that scores one of `experiment`'s mixtures against its data, with its scoring options."""
        return cls(
            job=f"{experiment}:{target}" + ("" if iteration is None else f"@{iteration}"),
            experiment=experiment,
            target=target,
            iteration=iteration,
            mixture=mixture,
            data=config.data.model_dump(mode="json"),
            data_seed=config.seed,
            options=config.scoring.job_options(),
            ensemble=ensemble,
        )


class ScoreResult(BaseModel):
    """The body of a `score` event; `error` is set (and `scores` empty) when the job could not be scored."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    kind: Literal["score"] = "score"
    job: str
    experiment: str = Field(pattern=EXPERIMENT_ID)  # names a folder under runs/: no path tricks
    target: str
    iteration: int | None = None
    scorer: str = ""
    scores: dict[str, Any] = {}
    error: str | None = None
    ensemble: dict[str, Any] | None = None  # an ensemble job's summary: the optimised weights, its scores
    samples_png: str | None = Field(None, max_length=8 * 1024 * 1024)  # base64: an ensemble's picture


def encode_job(job: ScoreJob, payload: bytes) -> bytes:
    return frame.pack(job.model_dump(mode="json"), payload)


def decode_job(body: bytes, *, max_bytes: int = SCORE_JOB_MAX_BYTES) -> tuple[ScoreJob, bytes]:
    """The job and its payload, or a SnapshotError naming what is wrong (the queue dead-letters it)."""
    return frame.unpack_message(body, ScoreJob.model_validate, max_bytes=max_bytes, what="score job")


def decode_result(body: bytes, *, max_bytes: int = SCORE_JOB_MAX_BYTES) -> ScoreResult:
    if len(body) > max_bytes:
        raise SnapshotError(f"score result of {len(body)} bytes exceeds the limit of {max_bytes} bytes")
    data = frame.load_json(body, "score result")
    try:
        return ScoreResult.model_validate(data)
    except ValidationError as error:
        raise SnapshotError(f"score result is invalid: {describe_validation(error)}") from None
