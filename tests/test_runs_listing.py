"""`palomino runs` on run directories as an orchestrator, a big grid or a killed trainer leave them
(test_train_cli.py follows a real run from running to killed to finished)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from palomino.runs.directory import RunDirectory
from palomino.runs.listing import TAIL_BYTES, list_runs


def make_run(folder: Path, name: str, rows: int = 2, cols: int = 2) -> RunDirectory:
    run = RunDirectory(folder / name)
    run.path.mkdir(parents=True)
    run.config_path.write_text(f"name: x\ngrid: {{rows: {rows}, cols: {cols}}}\ntraining: {{iterations: 500}}\n")
    return run


def record(iteration: int, cell: tuple[int, int], score: float) -> str:
    return json.dumps({"iteration": iteration, "cell": list(cell), "score": score, "pad": "x" * 600}) + "\n"


def test_progress_comes_from_the_tail_of_a_large_metrics_file(tmp_path: Path) -> None:
    run = make_run(tmp_path, "big-20261127-100000-abcd", 12, 12)
    with open(run.metrics_path, "w") as handle:
        for iteration in range(20):  # 144 cells × 20 iterations ≈ 1.8 MB: more than the tail
            for row in range(12):
                for col in range(12):
                    handle.write(record(iteration, (row, col), 1.0 + iteration + row + col))
        handle.write('{"iteration": 20, "cell": [0, 0], "sco')  # a torn last line (a killed writer)
    assert run.metrics_path.stat().st_size > TAIL_BYTES
    (listed,) = list_runs(tmp_path, now=time.time())
    assert (listed.grid, listed.iterations_done, listed.iterations) == ("12×12", 20, 500)
    assert listed.best_score == 20.0 and listed.score_name == "cell score"


def test_states_newest_first(tmp_path: Path) -> None:
    older = make_run(tmp_path, "a-20261120-100000-abcd")
    older.metrics_path.write_text(record(0, (0, 0), 0.5))
    (older.path / "orchestrator.json").write_text(json.dumps({"state": "failed", "reason": "below min_cells"}))
    quiet = make_run(tmp_path, "b-20261121-100000-abcd")  # no lock (an orchestrator's), not written lately
    quiet.metrics_path.write_text(record(3, (0, 0), 0.5))
    os.utime(quiet.metrics_path, (time.time() - 600, time.time() - 600))
    os.utime(quiet.config_path, (time.time() - 600, time.time() - 600))
    live = make_run(tmp_path, "c-20261122-100000-abcd")  # no lock, written a moment ago
    live.metrics_path.write_text(record(1, (0, 0), 0.5))
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "stray.txt").write_text("")
    listed = list_runs(tmp_path)
    assert [(r.name[0], r.state, r.iterations_done) for r in listed] == [
        ("c", "running", 2),
        ("b", "killed", 4),
        ("a", "failed", 1),
    ]
    assert not any(r.resumable for r in listed)  # none has a checkpoint
    with live.lock.hold():
        os.utime(live.metrics_path, (time.time() - 600, time.time() - 600))
        os.utime(live.config_path, (time.time() - 600, time.time() - 600))
        assert list_runs(tmp_path)[0].state == "running"  # held: running however long an iteration takes
    assert list_runs(tmp_path)[0].state == "killed"  # a lock no process holds


def test_an_empty_or_missing_folder_lists_nothing(tmp_path: Path) -> None:
    assert list_runs(tmp_path) == [] and list_runs(tmp_path / "nowhere") == []
