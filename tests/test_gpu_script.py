"""benchmarks/gpu.sh stays ready to run unchanged on a lent GPU host: its quick CPU form runs here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_gpu_script(out: Path, *args: str, timeout: float = 540, **env: str) -> subprocess.CompletedProcess[str]:
    """`bash benchmarks/gpu.sh ARGS` in its quick CPU form, its tables in `out`. Past `timeout` the
    script and every process it started are stopped (its runs go on in the background otherwise)."""
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "QUICK": "1",
        "OUT": str(out),
        # The script calls python3, as a GPU host's is: here, this environment's.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **env,
    }
    command = ["bash", "benchmarks/gpu.sh", *args]
    script = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = script.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(script.pid, signal.SIGKILL)
        script.communicate()
        raise
    return subprocess.CompletedProcess(command, script.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # every stage in its quick form: minutes, more beside other work
def test_the_gpu_script_runs_every_stage_on_a_cpu(tmp_path: Path) -> None:
    done = run_gpu_script(tmp_path, timeout=1100)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for stage in (
        "tiles-steps",
        "tiles-grid",
        "tiles-grid-tf32",
        "tiles-grid-compiled",
        "tiles-grid-lipizzaner",
        "tiles-grid-lipizzaner-compiled",
        "tiles-dcgan",
        "baselines",
        "step-throughput",
        "tiles-count",
        "tiles-launches",
        "train-grid",
    ):
        text = (tmp_path / f"{stage}.txt").read_text()
        assert "Traceback" not in text, f"{stage}:\n{text[-2000:]}"
    assert "s/iteration" in (tmp_path / "tiles-grid.txt").read_text()
    assert "compiled ms/batch" in (tmp_path / "tiles-steps.txt").read_text()
    assert ", compiled:" in (tmp_path / "tiles-grid-compiled.txt").read_text()
    assert "compiled" in (tmp_path / "tiles-launches.txt").read_text()
    assert "projected to 16,000 batches per cell" in (tmp_path / "tiles-grid-lipizzaner.txt").read_text()
    assert "float32 products: high precision" in (tmp_path / "tiles-grid-tf32.txt").read_text()
    assert "s/iteration" in (tmp_path / "train-grid-speed.txt").read_text()  # a real palomino train, timed
    counts = json.loads((tmp_path / "tiles-count.json").read_text())
    assert [row["cells"] for row in counts["rows"]] == [1, 2, 4]
    assert all(row["syncs_total"] > 0 for row in counts["rows"])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_gpu_scripts_lipizzaner_row_runs_on_a_cpu(tmp_path: Path, referee_classifier: Path) -> None:
    """The 12×12 and 6×6 rows of the seeds' table (issue 47) in their quick form: two sizes side by
    side (2×2 and 1×1 here; 3×3 and 2×2 by default), both scorers, the referee taken from where
    `gpu.sh prepare` leaves it (REFEREE), and the table joined after."""
    done = run_gpu_script(tmp_path, "lipizzaner", timeout=1400, SIZES="2 1", REFEREE=str(referee_classifier))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no referee in" not in done.stderr  # the prepared one was used, not trained again
    rows = [json.loads(p.read_text()) for p in sorted((tmp_path / "lipizzaner" / "rows").glob("*.json"))]
    assert [(row["arm"], row["size"]) for row in rows] == [("full", "1x1"), ("full", "2x2")]
    for row in rows:
        assert "--device cpu" not in row["command"]
        assert row["lipizzaner"]["fid"] > 0 and row["held_out"]["fid"] > 0
    table = json.loads((tmp_path / "lipizzaner" / "table.json").read_text())
    assert len(table["rows"]) == 2
