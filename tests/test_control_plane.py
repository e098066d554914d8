"""benchmarks/control_plane.py at 64 workers (issue 35's test form): simulated workers that speak the
real protocol, the real orchestrator, a RabbitMQ and a Redis the harness starts itself. 10 % of the
workers are killed at once a third of the way; the run must still finish with every iteration
recorded exactly once and every cell's Done taken. Timings are the benchmark's to report, not asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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
    # Issue 52: one connection a worker (its control channel; the snapshot bus and score queue open
    # channels on it), where each block once opened its own: 64 + 6 spares, and the orchestrator's.
    assert report["broker_connections"] <= 70 + 4, report


def harness(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "control_plane.py"), "--workers", "4", "--period", "0.5",
            "--kill", "0", "--window", "1", "--work", str(tmp_path), *extra]  # fmt: skip


def started_by(work: Path) -> list[int]:
    """Live processes whose command line or working folder is under `work` (the harness's servers too)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
            if (proc / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue  # a zombie: already gone
        except OSError:
            continue
        if " --work " not in cmdline and (str(work) in cmdline or cwd.startswith(str(work))):  # not the harness
            found.append(int(proc.name))
    return found


@pytest.mark.slow
@pytest.mark.integration
def test_a_failed_experiment_ends_the_harness_with_its_verdict(tmp_path: Path) -> None:
    """Issue 52: the harness once waited seven minutes in silence after its experiment had failed."""
    out = tmp_path / "report.json"
    command = harness(tmp_path, "--iterations", "400", "--fail-at", "3", "--out", str(out))
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["state"] == "failed" and "a fault injected at iteration 3" in report["reason"], report
    assert report["connects_failed"] == 0 and "connects_retried" in report
    assert started_by(tmp_path) == []


@pytest.mark.slow
@pytest.mark.integration
def test_sigterm_stops_every_process_and_server_the_harness_started(tmp_path: Path) -> None:
    run = subprocess.Popen(harness(tmp_path, "--iterations", "100000"), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("*/plan/events-p*.jsonl"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)  # both simulated-worker processes run (the servers and orchestrator before them)
        assert len(started_by(tmp_path)) >= 4  # a broker, an orchestrator, two simulated-worker processes
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=180)
    finally:
        if run.poll() is None:  # a failed assertion above: its own clean-up first, else nothing it started is stopped
            run.send_signal(signal.SIGTERM)
            try:
                run.wait(timeout=180)
            except subprocess.TimeoutExpired:
                run.kill()
    assert run.returncode == 130 and "every process and server it started is stopped" in stderr
    assert started_by(tmp_path) == []
