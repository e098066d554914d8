"""The run directory: the contract between the engine, services, CLI, dashboard and tests.

<run>/config.yaml  topology.jsonl  metrics.jsonl  samples/<r>-<c>/  checkpoints/<r>-<c>/  result/
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from palomino.config import ExperimentConfig, dump_config, load_config
from palomino.errors import ConfigError
from palomino.grid import Coord, Topology
from palomino.io import atomic_write

log = logging.getLogger(__name__)


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


class LineIndex:
    """Where each complete line of an append-only JSON-lines file starts, extended as the file grows:
    a page of a long metrics.jsonl costs the page, not the file. A rewrite (new inode, or shorter)
    starts the index again."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._starts: list[int] = []
        self._end = 0
        self._identity: tuple[int, int] | None = None

    def _refresh(self) -> None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._starts, self._end, self._identity = [], 0, None
            return
        identity = (stat.st_dev, stat.st_ino)
        if identity != self._identity or stat.st_size < self._end:
            self._starts, self._end, self._identity = [], 0, identity
        with open(self.path, "rb") as handle:
            handle.seek(self._end)
            position = self._end
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # a line still being written
                self._starts.append(position)
                position += len(line)
        self._end = position

    def page(self, since: int, limit: int) -> tuple[list[dict[str, Any]], int, int]:
        """(records of lines since..since+limit, the next line, the lines there are now)."""
        self._refresh()
        chosen = self._starts[since : since + limit]
        records: list[dict[str, Any]] = []
        if chosen:
            stop = since + len(chosen)
            end = self._starts[stop] if stop < len(self._starts) else self._end
            with open(self.path, "rb") as handle:
                handle.seek(chosen[0])
                data = handle.read(end - chosen[0])
            for line in data.splitlines():
                try:
                    if line.strip():
                        records.append(json.loads(line))
                except ValueError:
                    log.warning("%s: skipping a malformed line", self.path)
        return records, since + len(chosen), len(self._starts)


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
        if not run.config_path.is_file():
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

    def load_config(self) -> ExperimentConfig:
        return load_config(self.config_path)

    def checkpoint_dir(self, coord: Coord) -> Path:
        return self.path / "checkpoints" / str(coord)

    def samples_dir(self, coord: Coord) -> Path:
        return self.path / "samples" / str(coord)

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        with open(path, "a") as handle:
            handle.write(json.dumps(finite_json(record), allow_nan=False, default=_jsonable) + "\n")

    def append_metrics(self, record: dict[str, Any]) -> None:
        self._append(self.metrics_path, record)

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

    def write_samples(self, coord: Coord, iteration: int, png: bytes) -> Path:
        folder = self.samples_dir(coord)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"iter-{iteration}.png"
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


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
