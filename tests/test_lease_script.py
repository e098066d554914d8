"""benchmarks/lease.sh: a job outlives the call that started it, and later calls wait on it and pack it."""

from __future__ import annotations

import os
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = 'sleep 3; echo made >"$OUT/row.json"; echo "the job\'s own line"; exit {rc}'


def lease(tmp: Path, call: str, wait: int, rc: int = 0) -> subprocess.CompletedProcess[str]:
    """One device call's worth: `WAIT=wait bash benchmarks/lease.sh bash -c JOB`, its $OUT emptied as the device's is."""
    out = tmp / f"out-{call}"
    out.mkdir()
    env = {**os.environ, "LEASE_DIR": str(tmp / "lease"), "OUT": str(out), "WAIT": str(wait)}
    command = ["bash", "benchmarks/lease.sh", "bash", "-c", JOB.format(rc=rc)]
    return subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def packed(tmp: Path, call: str) -> list[str]:
    with tarfile.open(tmp / f"out-{call}" / "lease.tgz") as tar:
        return sorted(name.removeprefix("./") for name in tar.getnames())


def test_a_job_runs_on_after_the_call_and_a_later_call_collects_it(tmp_path: Path) -> None:
    first = lease(tmp_path, "first", wait=0)
    assert first.returncode == 3, first.stdout + first.stderr
    assert "started: bash -c" in first.stdout and "running" in first.stdout
    assert "out/row.json" not in packed(tmp_path, "first")

    second = lease(tmp_path, "second", wait=60)  # the same line again: waits on the job, starts nothing
    assert second.returncode == 0, second.stdout + second.stderr
    assert "started:" not in second.stdout
    assert "finished rc=0" in second.stdout and "the job's own line" in second.stdout
    assert "out/row.json" in packed(tmp_path, "second")
    assert (tmp_path / "out-second" / "job.log").read_text().strip() == "the job's own line"


def test_a_failed_job_says_so_with_its_exit_status(tmp_path: Path) -> None:
    result = lease(tmp_path, "only", wait=60, rc=7)
    assert result.returncode == 7
    assert "finished rc=7" in result.stdout


def test_without_a_command_it_says_how_to_call_it(tmp_path: Path) -> None:
    result = subprocess.run(["bash", "benchmarks/lease.sh"], check=False, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: WAIT=530 bash benchmarks/lease.sh COMMAND" in result.stderr


def test_the_job_outlives_a_call_stopped_with_its_process_group(tmp_path: Path) -> None:
    """The device kills what a call leaves running except a process in its own session: so here."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "LEASE_DIR": str(tmp_path / "lease"), "OUT": str(out), "WAIT": "30"}
    call = subprocess.Popen(
        ["bash", "benchmarks/lease.sh", "bash", "-c", JOB.format(rc=0)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    while not (tmp_path / "lease" / "started").exists():
        time.sleep(0.1)
    os.killpg(call.pid, 9)
    call.wait()
    deadline = time.monotonic() + 60
    while not (tmp_path / "lease" / "rc").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp_path / "lease" / "rc").read_text().strip() == "0"
    assert (tmp_path / "lease" / "out" / "row.json").read_text().strip() == "made"
