"""A read-only view of one run directory, for the dashboard and the orchestrator's read endpoints.

Torch-free and synchronous (callers use `asyncio.to_thread`). metrics.jsonl can reach tens of
megabytes on a large grid, so its complete lines are indexed by byte offset once and the index
is extended as the file grows: paging and tailing never re-read what was read before.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import yaml

from palomino.runs.directory import JsonlIndex, RunDirectory, file_stat

log = logging.getLogger(__name__)

EXPERIMENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
CELL = re.compile(r"^(\d{1,4})-(\d{1,4})$")
_SAMPLE = re.compile(r"^iter-(\d{1,9})\.png$")


def valid_experiment_id(text: str) -> bool:
    return bool(EXPERIMENT_ID.match(text))


def valid_cell(text: str) -> bool:
    return bool(CELL.match(text))


class RunFiles:
    """What the dashboard reads from `<runs>/<experiment>/`: never writes, never imports torch."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.run = RunDirectory(self.path)  # where each file is; read here, never written
        self.metrics = JsonlIndex(self.run.metrics_path)
        self._config: tuple[float, dict[str, Any]] | None = None
        self._layouts: tuple[int, int, list[dict[str, Any]]] | None = None

    @property
    def experiment(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        return RunDirectory(self.path).is_run()

    # ---- configuration and layouts -------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """config.yaml as plain data (cached until it changes); {} when unreadable."""
        stat = file_stat(self.run.config_path)
        if stat is None:
            return {}
        if self._config is None or self._config[0] != stat.mtime:
            try:
                raw = yaml.safe_load(self.run.config_path.read_text()) or {}
            except (OSError, yaml.YAMLError) as error:
                log.warning("%s: unreadable config.yaml: %s", self.path, error)
                raw = {}
            self._config = (stat.mtime, raw if isinstance(raw, dict) else {})
        return self._config[1]

    def layouts(self) -> list[dict[str, Any]]:
        """Every line of topology.jsonl: {epoch, rows, cols, cells: {"r-c": worker}}."""
        path = self.run.topology_path
        stat = file_stat(path)
        if stat is None:
            return []
        if self._layouts is None or self._layouts[:2] != (stat.inode, stat.size):
            layouts = []
            for line in path.read_bytes().splitlines():
                try:
                    layout = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                if (
                    isinstance(layout, dict)
                    and isinstance(layout.get("rows"), int)
                    and isinstance(layout.get("cols"), int)
                ):
                    layouts.append(layout)
            self._layouts = (stat.inode, stat.size, layouts)
        return self._layouts[2]

    def has_cell(self, cell: str) -> bool:
        """Whether `cell` ("r-c") lies inside any layout this run has had."""
        match = CELL.match(cell)
        if not match:
            return False
        row, col = int(match[1]), int(match[2])
        layouts = self.layouts() or [self._configured_layout()]
        return any(row < layout["rows"] and col < layout["cols"] for layout in layouts)

    def _configured_layout(self) -> dict[str, Any]:
        grid = self.config().get("grid") or {}
        return {"epoch": 0, "rows": int(grid.get("rows", 1)), "cols": int(grid.get("cols", 1)), "cells": {}}

    # ---- state ---------------------------------------------------------------------------------

    def state(self, now: float | None = None) -> str:
        """finished (result/ranking.json exists), running (its trainer holds its lock; a run without
        one, an orchestrator's: written to lately) or stopped."""
        held = self.run.lock.held()
        if held:  # first: a finished run can be resumed with more iterations
            return "running"
        if self.run.ranking_path.is_file():
            return "finished"
        if held is not None:
            return "stopped"
        return "running" if self.run.written_lately(now) else "stopped"

    def summary(self) -> dict[str, Any]:
        """The same keys as the orchestrator's experiment summary, from the files alone."""
        config = self.config()
        self.metrics.refresh()
        layouts = self.layouts()
        layout = layouts[-1] if layouts else self._configured_layout()
        training = config.get("training") or {}
        return {
            "id": self.experiment,
            "name": config.get("name", self.experiment),
            "state": self.state(),
            "reason": "",
            "run_dir": str(self.path),
            "epoch": layout.get("epoch", 0),
            "rows": layout["rows"],
            "cols": layout["cols"],
            "iterations": training.get("iterations"),
            "records": self.metrics.count,
            "cells": dict(layout.get("cells") or {}),
            "liveness": {},
            "failures": [],
            "source": "runs",
        }

    # ---- metrics -------------------------------------------------------------------------------

    def metrics_page(self, since: int, limit: int) -> dict[str, Any]:
        self.metrics.refresh()
        records, next_line = self.metrics.read(since, limit)
        return {"since": since, "next": next_line, "total": self.metrics.count, "records": records}

    # ---- images and results --------------------------------------------------------------------

    def sample_iterations(self, cell: str) -> list[int]:
        folder = self.run.samples_dir(cell)
        if not CELL.match(cell) or not folder.is_dir():
            return []
        return sorted(int(m[1]) for name in os.listdir(folder) if (m := _SAMPLE.match(name)))

    def sample_png(self, cell: str, iteration: int) -> Path | None:
        if not CELL.match(cell) or iteration < 0:
            return None
        path = self.run.samples_path(cell, iteration)
        return path if path.is_file() else None

    def real_png(self) -> Path | None:
        path = self.run.real_samples_path
        return path if path.is_file() else None

    def result_png(self) -> Path | None:
        path = self.run.result_samples_path
        return path if path.is_file() else None

    def result(self) -> dict[str, Any]:
        """ranking.json and scores.json as they are (null when not written yet)."""
        return {
            "ranking": _read_json(self.run.ranking_path),
            "scores": _read_json(self.run.scores_path),
            "samples": self.result_png() is not None,
            "real": self.real_png() is not None,
        }


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("%s: unreadable: %s", path, error)
        return None


class RunsFolder:
    """Run directories under a folder (or one run directory given directly), each viewed once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._runs: dict[str, RunFiles] = {}

    @property
    def single(self) -> bool:
        """Whether the folder is itself a run directory (`palomino train --dashboard`)."""
        return RunDirectory(self.path).is_run()

    def ids(self) -> list[str]:
        if self.single:
            return [self.path.name] if valid_experiment_id(self.path.name) else []
        try:
            names = os.listdir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(n for n in names if valid_experiment_id(n) and RunDirectory(self.path / n).is_run())

    def get(self, experiment: str) -> RunFiles | None:
        if not valid_experiment_id(experiment):
            return None
        run = self._runs.get(experiment)
        if run is None:
            if self.single:
                path = self.path if experiment == self.path.name else None
            else:
                path = self.path / experiment
            if path is None:
                return None
            run = RunFiles(path)
        if not run.exists():
            return None
        self._runs[experiment] = run
        return run
