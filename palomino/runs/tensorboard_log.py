"""A run's curves and pictures as TensorBoard event files, beside metrics.jsonl (optional extra).

Fed the same records and sample pictures the run directory gets, by the embedded run and by the
orchestrator alike; torch-free (tensorboardX writes the events; TensorBoard reads them). Tags:
`generator_loss/<cell>`, `discriminator_loss/<cell>`, `generator_lr/<cell>`,
`discriminator_lr/<cell>`, `mixture_score/<cell>`, `grid/best_score` (the lowest cell score of
each iteration), `samples/<cell>` (each cell's sample picture as it is written), and at the end
`result/score` and `result/samples`. Steps are iterations.
"""

from __future__ import annotations

import io
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from palomino.errors import ConfigError
from palomino.runs.directory import RunDirectory

log = logging.getLogger(__name__)

INSTALL = "pip install 'palomino[tensorboard]' (tensorboardX writes the events, tensorboard shows them)"
# An iteration whose records never all arrive (a cell died, the grid shrank) is written with
# what it has once this many newer iterations are pending.
PENDING_ITERATIONS = 8
MAX_PIXELS = 4096 * 4096  # a sample picture is an 8×8 grid of images or a 400×400 scatter


def require_writer() -> None:
    """Fail before training, not after, when the writer is not installed."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        raise ConfigError(f"--tensorboard: tensorboardX is not installed: {INSTALL}") from None


class TensorBoardLog:
    """Event files of one run in `folder` (`tensorboard --logdir` its parent to see runs side by side)."""

    def __init__(self, folder: Path, cells: int, purge_step: int | None = None) -> None:
        """`cells`: records an iteration has (the grid's best is written when all are in);
        `purge_step`: a resumed run redoes iterations from here, so TensorBoard drops what an
        earlier writer logged at or after it."""
        require_writer()
        from tensorboardX import SummaryWriter

        self.cells = cells
        # A suffix of its own: a resume within the same second must neither overwrite the first
        # file nor sort before it (TensorBoard reads a run's files in name order).
        suffix = f".{time.time_ns()}"
        self._writer = SummaryWriter(str(folder), purge_step=purge_step or None, flush_secs=10, filename_suffix=suffix)
        self._scores: dict[int, list[float]] = {}

    def metrics(self, record: dict[str, Any]) -> None:
        """One cell's record of one iteration (a metrics.jsonl line)."""
        iteration, cell = record.get("iteration"), record.get("cell")
        if not isinstance(iteration, int) or not isinstance(cell, list | tuple) or len(cell) != 2:
            return
        name = f"{cell[0]}-{cell[1]}"
        for side in ("generator", "discriminator"):
            values = record.get(side) if isinstance(record.get(side), dict) else {}
            self._scalar(f"{side}_loss/{name}", values.get("loss"), iteration)
            self._scalar(f"{side}_lr/{name}", values.get("learning_rate"), iteration)
        score = record.get("score")
        self._scalar(f"mixture_score/{name}", score, iteration)
        arrived = self._scores.setdefault(iteration, [])
        arrived.append(float(score) if _finite(score) else math.inf)
        if len(arrived) >= self.cells:
            self._best(iteration)
        while len(self._scores) > PENDING_ITERATIONS:
            self._best(min(self._scores))

    def samples(self, cell: str, iteration: int, png: bytes) -> None:
        """A cell's sample picture (the PNG the run directory keeps); one that is not a picture is skipped."""
        try:
            pixels = _pixels(png)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            log.warning("cell %s, iteration %d: sample picture not logged to TensorBoard: %s", cell, iteration, error)
            return
        self._writer.add_image(f"samples/{cell}", pixels, iteration, dataformats="HWC")

    def result(self, run: RunDirectory, iteration: int) -> None:
        """The finished run's result: its score (the whole grid's ensemble, else the best cell's) and samples."""
        try:
            ranking = json.loads(run.ranking_path.read_text())
        except (OSError, ValueError):
            ranking = {}
        ensemble = ranking.get("ensemble") if isinstance(ranking, dict) else None
        if isinstance(ensemble, dict):
            self._scalar("result/score", ensemble.get("held_out_score"), iteration)
        elif isinstance(ranking, dict) and ranking.get("ranking"):
            self._scalar("result/score", ranking["ranking"][0].get("score"), iteration)
        if run.result_samples_path.is_file():
            self._writer.add_image(
                "result/samples", _pixels(run.result_samples_path.read_bytes()), iteration, dataformats="HWC"
            )

    def close(self) -> None:
        for iteration in sorted(self._scores):
            self._best(iteration)
        self._writer.close()

    def _best(self, iteration: int) -> None:
        best = min(self._scores.pop(iteration, []), default=math.inf)
        if math.isfinite(best):
            self._writer.add_scalar("grid/best_score", best, iteration)

    def _scalar(self, tag: str, value: Any, iteration: int) -> None:
        if _finite(value):
            self._writer.add_scalar(tag, float(value), iteration)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _pixels(png: bytes) -> np.ndarray:
    """A PNG's pixels (H, W, 3); its size checked before it is decoded (a picture from the wire)."""
    image = Image.open(io.BytesIO(png), formats=["PNG"])
    if image.width * image.height > MAX_PIXELS:
        raise ValueError(f"{image.width}×{image.height} pixels: more than a sample picture's {MAX_PIXELS}")
    return np.asarray(image.convert("RGB"))
