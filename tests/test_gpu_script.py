"""benchmarks/gpu.sh stays ready to run unchanged on a lent GPU host: its quick CPU form runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_script_runs_every_stage_on_a_cpu(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "QUICK": "1",
        "OUT": str(tmp_path),
        # The script calls python3, as a GPU host's is: here, this environment's.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        ["bash", "benchmarks/gpu.sh"], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for stage in (
        "tiles-steps",
        "tiles-grid",
        "tiles-grid-tf32",
        "tiles-dcgan",
        "baselines",
        "step-throughput",
        "tiles-count",
        "train-grid",
    ):
        text = (tmp_path / f"{stage}.txt").read_text()
        assert "Traceback" not in text, f"{stage}:\n{text[-2000:]}"
    assert "s/iteration" in (tmp_path / "tiles-grid.txt").read_text()
    assert "float32 products: high precision" in (tmp_path / "tiles-grid-tf32.txt").read_text()
    assert "s/iteration" in (tmp_path / "train-grid-speed.txt").read_text()  # a real palomino train, timed
    counts = json.loads((tmp_path / "tiles-count.json").read_text())
    assert [row["cells"] for row in counts["rows"]] == [1, 2, 4]
    assert all(row["syncs_total"] > 0 for row in counts["rows"])
