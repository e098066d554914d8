"""What the orchestrator knows of an experiment and of a worker, and how it persists them."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from palomino.config import ExperimentConfig
from palomino.errors import PalominoError
from palomino.grid import Coord, Topology, cell_name, parse_coord
from palomino.grid.partition import Partition, class_rectangle, partition_grid
from palomino.runs.directory import RunDirectory
from palomino.runs.result import CellResult
from palomino.services.common.runfiles import RunFiles
from palomino.services.common.states import ENDED, State
from palomino.services.orchestrator.experiment_store import read_collected, write_state

log = logging.getLogger(__name__)


@dataclass
class Worker:
    id: str
    host: str = ""
    device: str = "cpu"
    last_seen: float = field(default_factory=time.monotonic)  # last time Redis showed its heartbeat
    experiment: str | None = None
    coord: Coord | None = None
    idle: bool = True  # said so by its last Register; a freed worker is no spare until it does
    block: str = ""  # the process it is a slot of (`palomino cell --cells K`); "" for a one-cell worker

    def free(self) -> None:
        self.experiment, self.coord = None, None


@dataclass
class Experiment:
    id: str
    config: ExperimentConfig
    run: RunDirectory
    state: State = "waiting"
    reason: str = ""
    created: float = field(default_factory=time.monotonic)
    topology: Topology | None = None
    cells: dict[Coord, str] = field(default_factory=dict)
    done: dict[Coord, CellResult] = field(default_factory=dict)
    recorded: set[tuple[str, int]] = field(default_factory=set)  # (cell, iteration) in metrics.jsonl
    failures: list[dict[str, Any]] = field(default_factory=list)
    laid_out: set[Coord] = field(default_factory=set)  # every coordinate of every layout (their last-value queues)
    partition: Partition | None = None  # a partitioned run's class sub-grids (cell ids of `topology`'s space)
    # The epoch each coordinate's history began (a shrink gave it another worker): older snapshots
    # and checkpoints of it are a previous occupant's, never restored.
    history_since: dict[Coord, int] = field(default_factory=dict)
    # worker → the coordinate the last shrink moved it from: its Done may already be on the way
    # from there (it finished as the Resize was sent), and then it is the result of where it went.
    moved_from: dict[str, Coord] = field(default_factory=dict)
    # Restoring a coordinate: which saved state went out last, and which did not load in a cell.
    restoring: dict[Coord, tuple[str, int]] = field(default_factory=dict)
    unusable: dict[Coord, set[tuple[str, int]]] = field(default_factory=dict)
    collecting: bool = False  # every cell is done and result/ is being written
    client: str = ""  # who submitted it (the API's peer address): submissions are capped per client
    ended_at: float | None = None  # wall time it ended: listed until the retention has passed
    scores_owed: list[str] = field(default_factory=list)  # score targets not yet confirmed queued (owed_scores)
    # metrics.jsonl is appended to record by record and rewritten (off the event loop) where a
    # replacement redoes iterations: one at a time.
    metrics_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @cached_property
    def files(self) -> RunFiles:
        """The API's read-only view of the run directory, kept: its metrics index grows with the file."""
        return RunFiles(self.run.path)

    @property
    def finished(self) -> bool:
        return self.state in ENDED

    def summary(self, alive: set[str] | None = None) -> dict[str, Any]:
        topology = self.topology
        return {
            "id": self.id,
            "name": self.config.name,
            "state": self.state,
            "reason": self.reason,
            "run_dir": str(self.run.path),
            "epoch": topology.epoch if topology else None,
            "rows": topology.rows if topology else None,
            "cols": topology.cols if topology else None,
            "iterations": self.config.training.iterations,
            "records": len(self.recorded),
            "cells": {str(c): w for c, w in sorted(self.cells.items())},
            "liveness": {w: (alive is None or w in alive) for w in self.cells.values()},
            "failures": self.failures,
            **({"classes": self.partition.describe()} if self.partition else {}),
        }

    def release_results(self) -> None:
        """Once it has ended, its cells' results are on disk (collected/, result/), whence its score
        jobs are built: keep which cells finished, not their mixtures' and pictures' bytes. An ended
        experiment stays listed for the retention (a week by default), and each had held ~0.5 MB a
        cell: a long-lived orchestrator grew by every experiment it ran."""
        self.done = {coord: replace(r, payload=b"", samples_png=b"") for coord, r in self.done.items()}

    def shape_of(self, coord: Coord) -> tuple[int, int]:
        """rows×cols an Assign/Resize tells the cell at `coord`: its class's sub-grid, else the grid."""
        if self.partition is not None:
            grid = self.partition.grid_of(coord)
            return grid.rows, grid.cols
        assert self.topology is not None
        return self.topology.rows, self.topology.cols

    def record_layout(self) -> None:
        assert self.topology is not None
        classes = self.partition.describe() if self.partition else None
        self.run.append_topology(self.topology, {str(c): w for c, w in self.cells.items()}, classes)
        self.persist()

    def persist(self) -> None:
        """orchestrator.json in the run directory: what a restarted orchestrator reloads."""
        topology = self.topology
        state = {
            "state": self.state, "reason": self.reason, "partition": None if self.partition is None else self.partition.to_json(),
            "topology": None if topology is None else {"rows": topology.rows, "cols": topology.cols, "kind": topology.kind, "epoch": topology.epoch},
            "cells": {str(c): w for c, w in sorted(self.cells.items())},
            "done": sorted(str(c) for c in self.done),
            "failures": self.failures,
            "laid_out": sorted(str(c) for c in self.laid_out),
            "history_since": {str(c): e for c, e in self.history_since.items()},
            "ended_at": self.ended_at,
            "scores_owed": self.scores_owed,
        }  # fmt: skip
        try:
            write_state(self.run.path, state)
        except OSError as error:
            log.error("experiment %s: its state cannot be saved (%s); a restart would lose it", self.id, error)

    @classmethod
    def from_saved(cls, run_dir: Path, saved: dict[str, Any]) -> Experiment:
        """The experiment as a killed orchestrator left it (ValueError, OSError, KeyError: not reloadable)."""
        run = RunDirectory(run_dir)
        experiment = cls(run.experiment, run.load_config(), run, state=saved["state"], reason=saved.get("reason", ""))
        experiment.ended_at = saved.get("ended_at")
        if experiment.finished and experiment.ended_at is None:  # saved before ends were timed
            experiment.ended_at = (Path(run_dir) / "orchestrator.json").stat().st_mtime
        if saved.get("topology"):
            t = saved["topology"]
            experiment.topology = Topology(int(t["rows"]), int(t["cols"]), t["kind"], epoch=int(t["epoch"]))
        experiment.cells = {parse_coord(c): str(w) for c, w in saved.get("cells", {}).items()}
        experiment.failures = list(saved.get("failures", []))
        experiment.scores_owed = [str(target) for target in saved.get("scores_owed", [])]
        experiment.laid_out = {parse_coord(c) for c in saved.get("laid_out", [])}
        experiment.history_since = {parse_coord(c): int(e) for c, e in saved.get("history_since", {}).items()}
        collected = read_collected(run.path, list(saved.get("done", [])), with_bytes=not experiment.finished)
        experiment.done = {parse_coord(c): result for c, result in collected.items()}
        experiment.recorded = {
            (cell_name(r["cell"]), int(r["iteration"])) for r in run.metrics() if "cell" in r and "iteration" in r
        }
        if saved.get("partition"):
            experiment.partition = Partition.from_json(saved["partition"])
        return experiment


def class_layout(config: ExperimentConfig, workers: int) -> Partition | None:
    """A partitioned run's sub-grids for `workers` workers: grid.per_class each when all are
    there, else the workers shared out evenly over the classes (None: fewer than one per class)."""
    labels = sorted(config.data.labels or ())
    per_rows, per_cols = config.grid.per_class_shape
    partition = partition_grid(labels, (per_rows, per_cols), config.grid.neighbourhood)
    if workers >= partition.size:
        return partition
    if workers < len(labels):
        return None
    share = [workers // len(labels) + (k < workers % len(labels)) for k in range(len(labels))]
    grids = tuple(g.resized(*class_rectangle(n, per_rows), 0) for g, n in zip(partition.grids, share))
    return Partition(grids, (per_rows, per_cols))


class TooBusy(PalominoError):
    """A client has as many experiments waiting or running as it may."""
