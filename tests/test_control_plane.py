"""benchmarks/control_plane.py at 64 workers (issue 35's test form): simulated workers that speak the
real protocol, the real orchestrator, a RabbitMQ and a Redis the harness starts itself. 10 % of the
workers are killed at once a third of the way; the run must still finish with every iteration
recorded exactly once and every cell's Done taken. Timings are the benchmark's to report, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.integration
def test_64_simulated_workers_lose_ten_percent_and_nothing_is_lost(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "control_plane.py"), "--workers", "64", "--iterations", "40",
               "--period", "0.5", "--window", "3", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["state"] == "finished", report
    assert report["killed_workers"] == 6 and report["epochs_for_the_failure"] >= 1
    assert report["records"] == 64 * 40 and report["records_twice"] == 0 and report["records_missing"] == 0
    assert report["dones_taken"] == 64
