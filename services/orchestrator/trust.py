"""Trust boundaries of the control plane: what a cell's message must fit to be taken (pure)."""

from __future__ import annotations

from typing import Any

from palomino.grid import Coord
from palomino.services.orchestrator.experiment import Experiment
from palomino.wire.control_messages import Checkpoint, Metrics, Samples


def untrusted(experiment: Experiment, message: Any) -> str:
    """Why a cell's message does not fit the layout ("" when it does): it must come from the worker
    that holds its coordinate, for an iteration the experiment has. Stale or forged otherwise."""
    why = ""
    iterations = experiment.config.training.iterations
    if isinstance(message, (Checkpoint, Samples)):
        coord = Coord(*message.coord)
        if message.real if isinstance(message, Samples) else False:
            why = "" if message.worker in experiment.cells.values() else "real samples from a worker outside the layout"
        elif experiment.cells.get(coord) != message.worker:
            why = f"{message.kind} for {coord} from {message.worker}, which does not hold it"
        elif not 0 <= message.iteration <= iterations:
            why = f"{message.kind} for iteration {message.iteration} of {iterations}"
        elif isinstance(message, Checkpoint) and int(message.meta.get("epoch", 0)) < experiment.history_since.get(
            coord, 0
        ):
            why = "a checkpoint from before the coordinate changed hands"
    elif isinstance(message, Metrics):
        record = message.record
        cell, iteration = record.get("cell"), record.get("iteration")
        if not (isinstance(cell, list) and len(cell) == 2 and all(isinstance(v, int) for v in cell)):
            why = "metrics without a valid cell"
        elif experiment.cells.get(Coord(*cell)) != message.worker:
            why = f"metrics for {tuple(cell)} from {message.worker}, which does not hold it"
        elif not (isinstance(iteration, int) and 0 <= iteration < iterations):
            why = f"metrics for iteration {iteration!r} of {iterations}"
    return why
