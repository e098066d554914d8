"""benchmarks/chaos.py in its short form (issues 36 and 50): three minutes of a fault every 30 s —
seed 7 strikes Redis, a cell worker, RabbitMQ, the dashboard and the orchestrator, in that order,
the first three with a partition (every link to Redis drops its bytes for 30 s), a kill and a pause
(RabbitMQ frozen for three heartbeat TTLs), the last two with what the seed draws next — over a
RabbitMQ and a Redis the soak starts itself, with ring 3×3 and grid 4×4 experiments one after
another. The soak's own verdict must hold: every experiment finished, no iteration lost or
recorded twice, every checkpoint loads, results, samples and scores written, no stall past twice
the longest recovery, no service's memory doubled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.integration
def test_three_minutes_of_kills_partitions_and_pauses_lose_nothing(tmp_path: Path) -> None:
    out = tmp_path / "verdict.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--duration", "180", "--period", "30",
               "--seed", "7", "--faults", "kill,partition,pause", "--iterations", "20", "--batches", "20",
               "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    verdict = json.loads(out.read_text())
    assert done.returncode == 0 and verdict["ok"], verdict["problems"] or done.stderr[-3000:]
    faults = verdict["kills"]
    assert [k["kind"] for k in faults] == ["redis", "cell", "rabbitmq", "dashboard", "orchestrator"]
    assert [k["fault"] for k in faults[:3]] == ["partition", "kill", "pause"]
    assert all(k["restart_s"] is not None for k in faults)
    experiments = verdict["experiments"]
    assert len(experiments) >= 2 and {e["kind"] for e in experiments} == {"ring-3x3", "grid-4x4"}
    assert all(e["state"] == "finished" and e["records"] > 0 and e["checkpoints_loaded"] > 0 for e in experiments)
