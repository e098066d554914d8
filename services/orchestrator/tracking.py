"""Each experiment's TensorBoard events (`palomino orchestrator --tensorboard DIR`): DIR/<experiment>/,
fed the records and sample pictures the orchestrator writes to the run directory.

Optional: whatever goes wrong here is logged and the experiment goes on as if it were off."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from palomino.errors import ConfigError
from palomino.runs.tensorboard_log import TensorBoardLog
from palomino.services.orchestrator.experiment import Experiment

log = logging.getLogger(__name__)


class Boards:
    """One TensorBoardLog an experiment, opened at its first record and closed when it ends."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder) if folder else None
        self._open: dict[str, TensorBoardLog] = {}

    def _of(self, experiment: Experiment) -> TensorBoardLog | None:
        if self.folder is None or experiment.finished:
            return None
        board = self._open.get(experiment.id)
        if board is None:
            try:
                board = TensorBoardLog(self.folder / experiment.id, experiment.config.cells)
            except ConfigError as error:  # the writer is not installed: off for every experiment
                log.warning("no TensorBoard events for any experiment: %s", error)
                self.folder = None
                return None
            self._open[experiment.id] = board
        board.cells = len(experiment.cells) or experiment.config.cells  # the layout's, as it shrinks
        return board

    def metrics(self, experiment: Experiment, record: dict[str, Any]) -> None:
        try:
            if board := self._of(experiment):
                board.metrics(record)
        except Exception:  # optional: never stops the experiment (logged with its traceback)
            log.warning("experiment %s: a record not logged to TensorBoard", experiment.id, exc_info=True)

    def samples(self, experiment: Experiment, cell: str, iteration: int, png: bytes) -> None:
        """Decodes the picture: call it off the event loop."""
        try:
            if board := self._of(experiment):
                board.samples(cell, iteration, png)
        except Exception:  # optional: never stops the experiment (logged with its traceback)
            log.warning("experiment %s: a sample picture not logged to TensorBoard", experiment.id, exc_info=True)

    def end(self, experiment: Experiment) -> None:
        """The experiment ended: its result (when it finished) and the file closed."""
        board = self._open.pop(experiment.id, None)
        if board is None:
            return
        try:
            if experiment.state == "finished":
                board.result(experiment.run, experiment.config.training.iterations)
            board.close()
        except Exception:  # optional: never stops the experiment (logged with its traceback)
            log.warning("experiment %s: its TensorBoard events not closed cleanly", experiment.id, exc_info=True)

    def close(self) -> None:
        for board in self._open.values():
            try:
                board.close()
            except Exception:  # the orchestrator is stopping: close the others
                log.warning("TensorBoard events not closed cleanly", exc_info=True)
        self._open.clear()
