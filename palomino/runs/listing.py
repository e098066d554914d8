"""`palomino runs`: what each run directory under a folder is — state, grid, progress, best score.

Torch-free and read-only. A large grid's metrics.jsonl reaches a hundred megabytes, so progress
comes from its tail: the newest iteration recorded and the best score in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from palomino.runs.directory import RunDirectory, read_jsonl

TAIL_BYTES = 1 << 20  # enough for the newest iteration of a 12×12 grid's records (~0.7 kB a cell)
_STAMP = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{4}$")


@dataclass
class RunSummary:
    name: str
    state: str  # running, finished, killed; failed or stopped: a distributed run its orchestrator ended
    resumable: bool  # killed with checkpoints: `palomino train --resume PATH` continues it
    grid: str  # rows×cols of the newest layout
    iterations_done: int
    iterations: int | None
    best_score: float | None  # lower is better, as every Palomino score
    score_name: str | None
    started: float  # seconds since the epoch
    path: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def list_runs(folder: Path, now: float | None = None) -> list[RunSummary]:
    """Every run directory directly under `folder`, newest first; [] when there is none."""
    try:
        entries = [folder / name for name in os.listdir(folder)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    runs = [summarise(RunDirectory(path), now) for path in entries if RunDirectory(path).is_run()]
    return sorted(runs, key=lambda run: (run.started, run.name), reverse=True)


def summarise(run: RunDirectory, now: float | None = None) -> RunSummary:
    config = _yaml(run.config_path)
    training = config.get("training") if isinstance(config.get("training"), dict) else {}
    done, best, score_name = _progress(run)
    state = _state(run, now)
    if state == "finished":
        done = training.get("iterations", done)
        best, score_name = result_score(run) or (best, score_name)
    return RunSummary(
        name=run.experiment,
        state=state,
        resumable=state == "killed" and any((run.path / "checkpoints").glob("*/iter-*.safetensors")),
        grid=_grid(run, config),
        iterations_done=done,
        iterations=training.get("iterations"),
        best_score=best,
        score_name=score_name,
        started=_started(run),
        path=str(run.path),
    )


def _state(run: RunDirectory, now: float | None) -> str:
    held = run.lock.held()
    if held:  # first: a finished or failed run can be resumed with more iterations
        return "running"
    if run.ranking_path.is_file():
        return "finished"
    ended = _json(run.path / "orchestrator.json").get("state")
    if ended in ("failed", "stopped"):  # a distributed run the orchestrator ended (its reason is in the file)
        return str(ended)
    if held is not None:
        return "killed"
    return "running" if run.written_lately(now) else "killed"


def _progress(run: RunDirectory) -> tuple[int, float | None, str | None]:
    """(iterations done, the best cell score of the newest iteration, its name) from metrics.jsonl's tail."""
    records = _tail(run.metrics_path)
    iterations = [r["iteration"] for r in records if isinstance(r.get("iteration"), int)]
    if not iterations:
        return 0, None, None
    newest = max(iterations)
    scores = [
        r["score"]
        for r in records
        if r.get("iteration") == newest and isinstance(r.get("score"), int | float) and r["score"] == r["score"]
    ]
    return newest + 1, min(scores, default=None), "cell score" if scores else None


def _tail(path: Path) -> list[dict[str, Any]]:
    """The records in the last TAIL_BYTES of a JSON-lines file (a cut first line and a torn last one skipped)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - TAIL_BYTES))
            lines = handle.read().splitlines()
    except OSError:  # missing or unreadable: no progress to show
        return []
    if size > TAIL_BYTES:
        lines = lines[1:]
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def result_score(run: RunDirectory) -> tuple[float, str] | None:
    """The finished result's score and its name: the whole grid's ensemble on held-out data, else the
    best cell's (None without a readable one). `palomino runs` and the TensorBoard log show it."""
    try:
        ranking = json.loads(run.ranking_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(ranking, dict):
        return None
    ensemble = ranking.get("ensemble")
    if isinstance(ensemble, dict) and isinstance(ensemble.get("held_out_score"), int | float):
        return float(ensemble["held_out_score"]), f"ensemble {ensemble.get('score_name', 'score')}"
    cells = ranking.get("ranking")
    if (
        isinstance(cells, list)
        and cells
        and isinstance(cells[0], dict)
        and isinstance(cells[0].get("score"), int | float)
    ):
        return float(cells[0]["score"]), str(ranking.get("score", "score")).split(" ")[0]
    return None


def _grid(run: RunDirectory, config: dict[str, Any]) -> str:
    layouts = [r for r in read_jsonl(run.topology_path) if isinstance(r, dict)]
    if layouts and isinstance(layouts[-1].get("rows"), int) and isinstance(layouts[-1].get("cols"), int):
        return f"{layouts[-1]['rows']}×{layouts[-1]['cols']}"
    grid = config.get("grid") if isinstance(config.get("grid"), dict) else {}
    return f"{grid.get('rows', '?')}×{grid.get('cols', '?')}"


def _started(run: RunDirectory) -> float:
    """When the run began: the stamp of its generated name, else config.yaml's time."""
    match = _STAMP.search(run.experiment)
    if match:
        with contextlib.suppress(ValueError):  # a name like a stamp that is no date
            return datetime.strptime(match[1], "%Y%m%d-%H%M%S").replace(tzinfo=UTC).timestamp()
    return run.config_path.stat().st_mtime


def _json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}
