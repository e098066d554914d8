"""The run directory: the contract between the engine, services, CLI, dashboard and tests.

<run>/config.yaml  topology.jsonl  metrics.jsonl  samples/<r>-<c>/  checkpoints/<r>-<c>/  result/
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from palomino.config import ExperimentConfig, dump_config, load_config
from palomino.errors import ConfigError
from palomino.grid import Coord, Topology
from palomino.io import atomic_write
from palomino.runs.lock import RunLock

log = logging.getLogger(__name__)

# A run without a lock that has not been written to for this long is not being trained.
LIVE_WINDOW_S = 120.0


def new_experiment_id(name: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSON-lines file; a torn last line (a killed writer) is skipped."""
    if not path.exists():
        return
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError:
                log.warning("%s:%d: skipping a malformed line", path, number)


@dataclass
class FileStat:
    inode: int
    size: int
    mtime: float


def file_stat(path: Path) -> FileStat | None:
    """A file's inode, size and mtime, or None when it is not there."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return FileStat(st.st_ino, st.st_size, st.st_mtime)


class JsonlIndex:
    """Offsets of the complete lines of a JSON-lines file that only grows (or is replaced whole)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets: list[int] = []  # start of each non-blank complete line
        self._end = 0  # bytes indexed so far (always just after a newline)
        self._inode: int | None = None
        self._lock = threading.Lock()

    def refresh(self) -> bool:
        """Index what was appended; True when the file was replaced or truncated (the index restarted)."""
        with self._lock:
            stat = file_stat(self.path)
            replaced = self._inode is not None and (stat is None or stat.inode != self._inode or stat.size < self._end)
            if replaced:  # keep_metrics() rewrites the file atomically (a resume or a replaced cell)
                self._offsets, self._end, self._inode = [], 0, None
            if stat is None:
                return replaced
            self._inode = stat.inode
            if stat.size > self._end:
                with open(self.path, "rb") as handle:
                    handle.seek(self._end)
                    chunk = handle.read(stat.size - self._end)
                complete = chunk.rfind(b"\n") + 1  # a torn last line waits for its newline
                position = 0
                while position < complete:
                    newline = chunk.index(b"\n", position)
                    if chunk[position:newline].strip():
                        self._offsets.append(self._end + position)
                    position = newline + 1
                self._end += complete
            return replaced

    @property
    def count(self) -> int:
        return len(self._offsets)

    def read(self, since: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Records of lines [since, since+limit) and the index of the next line; malformed lines are skipped."""
        with self._lock:
            since = max(0, min(since, len(self._offsets)))
            stop = min(len(self._offsets), since + max(0, limit))
            if since == stop:
                return [], since
            start, end = self._offsets[since], (self._offsets[stop] if stop < len(self._offsets) else self._end)
            with open(self.path, "rb") as handle:
                handle.seek(start)
                chunk = handle.read(end - start)
        records = []
        for number, line in enumerate(chunk.splitlines(), since + 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line, parse_constant=lambda _: None)  # NaN/Infinity: not JSON, read as null
            except ValueError:
                log.warning("%s:%d: skipping a malformed line", self.path, number)
                continue
            if isinstance(record, dict):
                records.append(record)
        return records, stop


class RunDirectory:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, out: Path, config: ExperimentConfig) -> RunDirectory:
        run = cls(Path(out) / new_experiment_id(config.name))
        run.path.mkdir(parents=True)
        atomic_write(run.config_path, dump_config(config).encode())
        return run

    @classmethod
    def open(cls, path: Path) -> RunDirectory:
        run = cls(path)
        if not run.is_run():
            raise ConfigError(f"--resume {path}: not a run directory (no config.yaml in it)")
        return run

    @property
    def experiment(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def topology_path(self) -> Path:
        return self.path / "topology.jsonl"

    @property
    def result_dir(self) -> Path:
        return self.path / "result"

    @property
    def ranking_path(self) -> Path:
        return self.result_dir / "ranking.json"

    @property
    def result_samples_path(self) -> Path:
        return self.result_dir / "samples.png"

    @property
    def scores_path(self) -> Path:
        """scores.json: `palomino score`'s report, and the scorers' results of a distributed run."""
        return self.path / "scores.json"

    def is_run(self) -> bool:
        return self.config_path.is_file()

    @property
    def lock(self) -> RunLock:
        """training.lock: held by the process training this run (palomino/runs/lock.py)."""
        return RunLock(self.path / "training.lock")

    def written_lately(self, now: float | None = None) -> bool:
        """Whether metrics.jsonl, topology.jsonl or config.yaml changed in the last LIVE_WINDOW_S: how a
        run without a lock (an orchestrator's) is told running from stopped."""
        stats = [file_stat(p) for p in (self.metrics_path, self.topology_path, self.config_path)]
        newest = max((s.mtime for s in stats if s is not None), default=0.0)
        return (now or time.time()) - newest < LIVE_WINDOW_S

    def load_config(self) -> ExperimentConfig:
        return load_config(self.config_path)

    def checkpoint_dir(self, coord: Coord) -> Path:
        return self.path / "checkpoints" / str(coord)

    def samples_dir(self, coord: Coord | str) -> Path:
        return self.path / "samples" / str(coord)

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        with open(path, "a") as handle:
            handle.write(_line(record))

    def append_metrics(self, record: dict[str, Any]) -> None:
        self._append(self.metrics_path, record)

    def append_metrics_many(self, records: list[dict[str, Any]]) -> list[str]:
        """Several records in one write (the orchestrator writes what arrived together); the lines."""
        lines = [_line(r) for r in records]
        with open(self.metrics_path, "a") as handle:
            handle.write("".join(lines))
        return lines

    def append_topology(
        self, topology: Topology, assignment: dict[str, str], classes: dict[str, dict[str, int]] | None = None
    ) -> None:
        """`classes` (partitioned runs): label → its sub-grid's rows, cols and row_offset."""
        record: dict[str, Any] = {
            "epoch": topology.epoch,
            "rows": topology.rows,
            "cols": topology.cols,
            "cells": assignment,
        }
        if classes is not None:
            record["classes"] = classes
        self._append(self.topology_path, record)

    def metrics(self) -> Iterator[dict[str, Any]]:
        return read_jsonl(self.metrics_path)

    def keep_metrics(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Rewrite metrics.jsonl with only the records `keep` accepts (resume drops redone iterations)."""
        kept = [r for r in self.metrics() if keep(r)]
        atomic_write(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept).encode())

    @property
    def real_samples_path(self) -> Path:
        """samples/real.png: real training data, shown beside the generated samples."""
        return self.path / "samples" / "real.png"

    def write_real_samples(self, png: bytes) -> Path:
        self.real_samples_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.real_samples_path, png)
        return self.real_samples_path

    def samples_path(self, cell: Coord | str, iteration: int) -> Path:
        return self.samples_dir(cell) / f"iter-{iteration}.png"

    def write_samples(self, coord: Coord, iteration: int, png: bytes) -> Path:
        path = self.samples_path(coord, iteration)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, png)
        return path


def finite_json(value: Any) -> Any:
    """JSON has no NaN or infinity: such values are written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def _line(record: dict[str, Any]) -> str:
    """One JSON-lines record, NaN and infinities as null."""
    return json.dumps(finite_json(record), allow_nan=False, default=_jsonable) + "\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
