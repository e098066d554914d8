"""A run's curves and pictures as TensorBoard event files, beside metrics.jsonl (optional extra).

Fed the same records and sample pictures the run directory gets, by the embedded run and by the
orchestrator alike; torch-free (tensorboardX writes the events; TensorBoard reads them). Tags:
`generator_loss/<cell>`, `discriminator_loss/<cell>`, `generator_lr/<cell>`,
`discriminator_lr/<cell>`, `mixture_score/<cell>`, `grid/best_score` (the lowest cell score of
each iteration), `samples/<cell>` (each cell's sample picture as it is written), and at the end
`result/score` and `result/samples`. A step is the number of iterations done (a record of
iteration i is step i + 1, the picture drawn after it too).

Optional, so it never stops a run: a record or a picture it cannot log is skipped with a warning,
and a writer whose thread died (a full disk) is given up, not waited on.
"""

from __future__ import annotations

import io
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from palomino.errors import ConfigError
from palomino.runs.directory import RunDirectory
from palomino.runs.listing import result_score

log = logging.getLogger(__name__)

INSTALL = "pip install 'palomino[tensorboard]' (tensorboardX writes the events, tensorboard shows them)"
# An iteration whose records never all arrive (a cell died, the grid shrank) is written with
# what it has once this many newer iterations are pending.
PENDING_ITERATIONS = 64
MAX_STEP = 10**12  # far beyond any run's iterations (the config bounds them), inside an int64
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
        """`cells`: records an iteration has (the grid's best is written when all are in; the
        orchestrator updates it as the layout changes); `purge_step`: a resumed run redoes
        iterations from this step on, so TensorBoard drops what an earlier writer logged there."""
        require_writer()
        from tensorboardX import SummaryWriter

        self.cells = cells
        # A suffix of its own: a resume within the same second must neither overwrite the first
        # file nor sort before it (TensorBoard reads a run's files in name order).
        suffix = f".{time.time_ns()}"
        self._writer = SummaryWriter(str(folder), purge_step=purge_step, flush_secs=10, filename_suffix=suffix)
        self._scores: dict[int, list[float]] = {}  # step → the cell scores in so far
        self._written: set[int] = set()  # steps whose grid/best_score is written: never twice
        self._dead = False

    def metrics(self, record: dict[str, Any]) -> None:
        """One cell's record of one iteration (a metrics.jsonl line)."""
        iteration, cell = record.get("iteration"), record.get("cell")
        if not _step(iteration) or not isinstance(cell, list | tuple) or len(cell) != 2:
            return
        step, name = iteration + 1, f"{cell[0]}-{cell[1]}"
        for side in ("generator", "discriminator"):
            values = record.get(side) if isinstance(record.get(side), dict) else {}
            self._scalar(f"{side}_loss/{name}", values.get("loss"), step)
            self._scalar(f"{side}_lr/{name}", values.get("learning_rate"), step)
        score = _number(record.get("score"))
        self._scalar(f"mixture_score/{name}", score, step)
        if step in self._written:
            return  # a late or redone record of a step already summed up
        arrived = self._scores.setdefault(step, [])
        arrived.append(math.inf if score is None else score)
        if len(arrived) >= self.cells:
            self._best(step)
        while len(self._scores) > PENDING_ITERATIONS:
            self._best(min(self._scores))

    def samples(self, cell: str, step: int, png: bytes) -> None:
        """A cell's sample picture (the PNG the run directory keeps); one that is not a picture is skipped."""
        if not _step(step):
            return
        try:
            pixels = _pixels(png)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            log.warning("cell %s, iteration %d: sample picture not logged to TensorBoard: %s", cell, step, error)
            return
        self._image(f"samples/{cell}", pixels, step)

    def result(self, run: RunDirectory, step: int) -> None:
        """The finished run's result: its score (the whole grid's ensemble, else the best cell's) and samples."""
        score = result_score(run)
        if score is not None:
            self._scalar("result/score", score[0], step)
        try:
            self._image("result/samples", _pixels(run.result_samples_path.read_bytes()), step)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            log.warning("the result's samples not logged to TensorBoard: %s", error)

    def close(self) -> None:
        for step in sorted(self._scores):
            self._best(step)
        if not self._dead and self._alive():
            self._writer.close()

    def _best(self, step: int) -> None:
        best = min(self._scores.pop(step, []), default=math.inf)
        self._written.add(step)
        if math.isfinite(best):
            self._add("add_scalar", "grid/best_score", best, step)

    def _scalar(self, tag: str, value: Any, step: int) -> None:
        value = _number(value)
        if value is not None:
            self._add("add_scalar", tag, value, step)

    def _image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        self._add("add_image", tag, pixels, step, dataformats="HWC")

    def _add(self, method: str, *args: Any, **kwargs: Any) -> None:
        if self._dead:
            return
        if not self._alive():  # its thread died (a full disk): adding would wait on its queue forever
            self._dead = True
            log.warning("TensorBoard's writer stopped (a full or failing disk?): no more events for this run")
            return
        getattr(self._writer, method)(*args, **kwargs)

    def _alive(self) -> bool:
        """Whether tensorboardX's writing thread runs (where its version keeps it; assumed alive elsewhere)."""
        writer = getattr(getattr(self._writer, "file_writer", None), "event_writer", None)
        thread = getattr(writer, "_worker", None)
        return thread is None or thread.is_alive()


def _step(value: Any) -> bool:
    """An iteration count TensorBoard can keep (an int64 step), not a bool or an absurd number."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_STEP


def _number(value: Any) -> float | None:
    """A finite float of an int or float from a record (huge ints, bools, NaN and text are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _pixels(png: bytes) -> np.ndarray:
    """A PNG's pixels (H, W, 3); its size checked before it is decoded (a picture from the wire)."""
    image = Image.open(io.BytesIO(png), formats=["PNG"])
    if image.width * image.height > MAX_PIXELS:
        raise ValueError(f"{image.width}×{image.height} pixels: more than a sample picture's {MAX_PIXELS}")
    return np.asarray(image.convert("RGB"))
