"""Each experiment's TensorBoard events (`palomino orchestrator --tensorboard DIR`): DIR/<experiment>/,
fed the records and sample pictures the orchestrator writes to the run directory."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from palomino.errors import PalominoError
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
            except (PalominoError, OSError) as error:  # the run goes on without its curves
                log.warning("experiment %s: no TensorBoard events: %s", experiment.id, error)
                self.folder = None
                return None
            self._open[experiment.id] = board
        return board

    def metrics(self, experiment: Experiment, record: dict[str, Any]) -> None:
        if board := self._of(experiment):
            board.metrics(record)

    def samples(self, experiment: Experiment, cell: str, iteration: int, png: bytes) -> None:
        if board := self._of(experiment):
            board.samples(cell, iteration, png)

    def end(self, experiment: Experiment) -> None:
        """The experiment ended: its result (when it finished) and the file closed."""
        board = self._open.pop(experiment.id, None)
        if board is None:
            return
        if experiment.state == "finished":
            board.result(experiment.run, experiment.config.training.iterations)
        board.close()

    def close(self) -> None:
        for board in self._open.values():
            board.close()
        self._open.clear()
