"""Embedded mode: every cell of the grid in this process, through the in-memory adapters.

A partitioned run (data.partition: labels) is the same with one sub-grid per class
(palomino.grid.partition): its cells are ordinary cells, each on its class's torus.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from palomino.coevolution import Cell
from palomino.coevolution.tile import use_tile
from palomino.config import ExperimentConfig
from palomino.data import Dataset
from palomino.engine.hosting import host_cells
from palomino.engine.loop import LoopSettings
from palomino.grid import ClassGrid, Coord, Topology, cell_name, partition_grid
from palomino.runs.checkpoints import Checkpoint, newest_valid, write_checkpoint
from palomino.runs.directory import RunDirectory
from palomino.runs.finish import cell_result, ensemble_result
from palomino.runs.grid_ensemble import Features
from palomino.runs.images import progress_png, real_png
from palomino.runs.result import write_class_result, write_result
from palomino.runs.tensorboard_log import TensorBoardLog
from palomino.transport import InMemoryLiveness, InMemorySnapshotBus

log = logging.getLogger(__name__)


class RunRecorder:
    """Recorder port → the run directory."""

    def __init__(
        self,
        run: RunDirectory,
        dataset: Dataset,
        keep: int,
        on_metrics: Callable[[dict], None] | None = None,
        board: TensorBoardLog | None = None,
    ):
        self.run, self.dataset, self.keep, self.on_metrics, self.board = run, dataset, keep, on_metrics, board

    async def metrics(self, record: dict[str, Any]) -> None:
        self.run.append_metrics(record)
        if self.board:
            self.board.metrics(record)
        if self.on_metrics:
            self.on_metrics(record)

    async def samples(self, coord: Coord, iteration: int, samples: torch.Tensor) -> None:
        png = progress_png(samples, self.dataset.kind, self.dataset.modes)
        self.run.write_samples(coord, iteration, png)
        if self.board:
            self.board.samples(str(coord), iteration, png)

    async def checkpoint(
        self, coord: Coord, iteration: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
    ) -> None:
        await asyncio.to_thread(write_checkpoint, self.run.checkpoint_dir(coord), iteration, tensors, meta, self.keep)


@dataclass
class TrainOutcome:
    finished: bool
    best_cell: str | None = None
    best_score: float | None = None
    classes: dict[int, tuple[str, float]] | None = None  # partitioned: label → (best cell, its score)
    score_name: str = "MMD²"  # what a cell's score is (training.mixture.score)


def layout(config: ExperimentConfig) -> tuple[Topology, dict[Coord, Topology | ClassGrid]]:
    """The grid's extent and each cell's torus: the whole grid, or its class's sub-grid."""
    kind = config.grid.neighbourhood
    if not config.partitioned:
        topology = Topology(config.grid.rows, config.grid.cols, kind)
        return topology, {coord: topology for coord in topology.cells()}
    assert config.data.labels is not None
    partition = partition_grid(config.data.labels, config.grid.per_class_shape, kind)
    return Topology(partition.rows, partition.cols, kind), {
        coord: partition.grid_of(coord) for coord in partition.cells()
    }


def newest_checkpoints(run: RunDirectory, cells: list[Cell]) -> dict[Coord, Checkpoint | None]:
    return {cell.coord: newest_valid(run.checkpoint_dir(cell.coord)) for cell in cells}


def restore_cells(
    run: RunDirectory, cells: list[Cell], synchronous: bool, newest: dict[Coord, Checkpoint | None] | None = None
) -> None:
    """Each cell from its newest valid checkpoint (synchronous runs: none newer than the slowest cell's)."""
    newest = newest if newest is not None else newest_checkpoints(run, cells)
    at_most = None
    if synchronous:
        at_most = min((c.iteration if c else 0) for c in newest.values())
    for cell in cells:
        checkpoint = newest[cell.coord]
        if checkpoint is not None and at_most is not None and checkpoint.iteration > at_most:
            checkpoint = newest_valid(run.checkpoint_dir(cell.coord), at_most=at_most)
        if checkpoint is None:
            log.warning("cell %s has no valid checkpoint: it starts again from iteration 0", cell.coord)
            continue
        cell.restore(checkpoint.tensors, checkpoint.meta)
    resumed = {str(cell.coord): cell.iteration for cell in cells}
    # Iterations after a cell's checkpoint are redone, so their old records go.
    run.keep_metrics(lambda r: r["iteration"] < resumed.get(cell_name(r["cell"]), 0))


async def train_embedded(
    config: ExperimentConfig,
    run: RunDirectory,
    dataset: Dataset,
    *,
    resume: bool = False,
    stop: asyncio.Event | None = None,
    on_metrics: Callable[[dict], None] | None = None,
    on_restored: Callable[[int], None] | None = None,
    ensemble_features: Features | None = None,
    tensorboard: Path | None = None,
) -> TrainOutcome:
    """Train `config`'s grid in this process into `run`. `ensemble_features`: what the grid's
    ensemble of an image run is scored on (palomino.scoring.extractors.ensemble_features; None: pixels);
    `tensorboard`: a folder for the run's TensorBoard events too."""
    stop = stop or asyncio.Event()
    if config.scoring.every:
        log.warning(
            "scoring.every applies to distributed runs (their scorers); score this one when it ends: palomino score RUN_DIR"
        )
    topology, tori = layout(config)
    cells = [
        Cell(coord, torus, config, dataset, experiment=run.experiment, device=config.device)
        for coord, torus in tori.items()
    ]
    tiled = use_tile(config, cells)
    if resume:
        newest = newest_checkpoints(run, cells)
        reached = {c.iteration if c else 0 for c in newest.values()}
        if tiled and config.tiles == "auto" and len(reached) > 1 and not config.training.synchronous:
            # A distributed run's workers stopped at different iterations, and a tile's cells move in
            # lockstep from the iteration all of them reached, which the faster cells may have pruned
            # (they would start again from 0): one cell at a time, each from its own newest.
            log.info("resuming cells at iterations %d to %d: untiled, each from its own checkpoint", min(reached), max(reached))  # fmt: skip
            tiled = False
        restore_cells(run, cells, config.training.synchronous or tiled, newest)
        if on_restored:
            on_restored(sum(cell.iteration for cell in cells))
    else:
        classes = {str(c.label): c.topology.describe() for c in cells if isinstance(c.topology, ClassGrid)}
        run.append_topology(topology, {str(c.coord): f"embedded-{c.coord}" for c in cells}, classes or None)
    if not run.real_samples_path.exists():
        run.write_real_samples(real_png(dataset, seed=config.seed))
    board = None
    if tensorboard is not None:
        # Resumed: the records from the first redone iteration on are written again (steps: iterations done).
        redone = min(c.iteration for c in cells) + 1 if resume else None
        board = TensorBoardLog(tensorboard, len(cells), purge_step=redone)
    try:
        bus = InMemorySnapshotBus()
        recorder = RunRecorder(run, dataset, config.training.checkpoint_keep, on_metrics, board)
        settings = LoopSettings.of(config, "embedded", distributed=False)
        await host_cells(cells, bus, InMemoryLiveness(), recorder, settings, stop, tiled=tiled)
        if any(cell.iteration < config.training.iterations for cell in cells):
            return TrainOutcome(finished=False)
        outcome = await _write_results(cells, bus, config, run, dataset, ensemble_features)
        if board:
            board.result(run, config.training.iterations)
        return outcome
    finally:
        if board:
            board.close()


async def _write_results(
    cells: list[Cell],
    bus: InMemorySnapshotBus,
    config: ExperimentConfig,
    run: RunDirectory,
    dataset: Dataset,
    features: Features | None,
) -> TrainOutcome:
    """The finished grid's result: each cell's mixture, then the best (or each class's) and the ensemble."""
    snapshots = {c.coord: await bus.newest(c.coord) for c in cells}
    results = [await asyncio.to_thread(cell_result, cell, snapshots, dataset, run.experiment) for cell in cells]
    if config.partitioned:
        per_class = write_class_result(run, results, list(config.data.labels or ()))
        classes = {label: (r.cell, r.score) for label, r in per_class.items()}
        return TrainOutcome(finished=True, classes=classes)
    ensemble = None
    if config.grid_ensemble:
        ensemble = await asyncio.to_thread(ensemble_result, cells, dataset, run.experiment, features)
    best = write_result(run, results, ensemble)
    name = {"mmd": "MMD²", "fid": "FID on Lipizzaner's CNN"}[config.training.mixture.score]
    return TrainOutcome(finished=True, best_cell=best.cell, best_score=best.score, score_name=name)
