"""hpc/slurm/palomino.sbatch, unchanged, under a real Slurm: a one-node cluster of the test's own
(tests/slurm_cluster.py: its slurm.conf, munge key, munged, slurmctld and slurmd), the script
submitted with `sbatch` and the settings it documents (PALOMINO_RUNTIME=venv: this interpreter's
virtual environment; PALOMINO_SERVERS=host: Debian's RabbitMQ and Redis; CPU cells). A ring 3×3
trains to the end; a longer one is stopped mid-run with scancel and resumes from its checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, last_line, missing_data, palomino
from servers import ServerError, _binary, free_port, listening
from slurm_cluster import SlurmCluster, SlurmMissing

from palomino.grid import Coord, cell_name
from palomino.runs import RunDirectory
from palomino.runs.checkpoints import newest_valid

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.integration]

SBATCH = REPO / "hpc" / "slurm" / "palomino.sbatch"
CELLS = [Coord(r, c) for r in range(3) for c in range(3)]
TASKS, CELLS_PER_TASK = 2, 5  # one task per core of a 2-core node; 2 × 5 slots hold the 9 cells
# examples/ring-3x3.yaml, small enough to train in seconds on two shared cores.
SMALL = [
    "training.batches_per_iteration=5",
    "training.batch_size=64",
    "training.fitness.sample_size=200",
    "training.mixture.score_samples=200",
    "training.sample_every=1000",
    "network.hidden=32",
    "network.latent_dim=16",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    try:
        slurm = SlurmCluster(tmp_path_factory.mktemp("slurm"), kill_wait=30)
    except SlurmMissing as error:
        missing_data(f"a Slurm cluster needed: {error}")
    slurm.start()
    yield slurm
    slurm.stop()


def amqp_port() -> int:
    """A free port whose +20000 (the script's RABBITMQ_DIST_PORT) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 20000 < 65536 and not listening(port + 20000):
            return port
    raise AssertionError("no free AMQP port with a free distribution port")


def job_env(tmp_path: Path, name: str, iterations: int, checkpoint_every: int) -> dict[str, str]:
    """What a user exports before `sbatch` (its default --export=ALL hands it to the job)."""
    try:
        # The servers' programs on PATH, as `module load` would put them (Debian's rabbitmq-server in
        # /usr/sbin is a wrapper that runs it as the rabbitmq user: its own scripts are beside it).
        server_dirs = [str(Path(os.path.realpath(_binary(p))).parent) for p in ("rabbitmq-server", "redis-server")]
    except ServerError as error:
        pytest.fail(str(error))
    if not (Path(sys.prefix) / "bin" / "palomino").is_file():
        pytest.fail(
            f"PALOMINO_RUNTIME=venv needs Palomino in a virtual environment: none in {sys.prefix} (run .venv/bin/pytest)"
        )
    home = tmp_path / "home"  # Erlang's cookie goes to $HOME
    home.mkdir()
    overrides = [f"name={name}", f"training.iterations={iterations}", f"training.checkpoint_every={checkpoint_every}"]
    return {
        "PATH": os.pathsep.join([*dict.fromkeys(server_dirs), os.environ["PATH"]]),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PALOMINO_RUNTIME": "venv",
        "PALOMINO_VENV": sys.prefix,  # the environment running these tests, Palomino installed in it
        "PALOMINO_SERVERS": "host",
        "PALOMINO_DEVICE": "cpu",
        "PALOMINO_CELLS_PER_TASK": str(CELLS_PER_TASK),
        "PALOMINO_EXPERIMENT": str(REPO / "examples" / "ring-3x3.yaml"),
        "PALOMINO_SET": " ".join(overrides + SMALL),
        "PALOMINO_AMQP_PORT": str(amqp_port()),
        "PALOMINO_REDIS_PORT": str(free_port()),
        "PALOMINO_ORCHESTRATOR_PORT": str(free_port()),
        "PALOMINO_DASHBOARD_PORT": str(free_port()),
    }


def submit(cluster: SlurmCluster, tmp_path: Path, env: dict[str, str]) -> str:
    """The project's script as it is, with command-line options for a 2-core node without GPUs:
    they override its #SBATCH lines (3 nodes × 4 tasks, --gpus-per-task=1). On a cluster without
    GRES, --gpus-per-task=0 is accepted where --gres=none is not."""
    return cluster.sbatch(
        SBATCH,
        "--nodes=1",
        f"--ntasks-per-node={TASKS}",
        "--cpus-per-task=1",
        "--gpus-per-task=0",
        "--time=10",
        f"--output={tmp_path}/slurm-%j.out",
        env=env,
        cwd=tmp_path,  # the job's $PWD: palomino-<jobid>/ (logs), runs/ and datasets/ go here
    )


def records(run: RunDirectory) -> list[dict]:
    return [r for r in run.metrics() if "cell" in r]


def leftovers(job_id: str) -> list[str]:
    """Processes of this job still alive after it ended (by the SLURM_JOB_ID in their environment),
    killed so that none outlives the test. epmd aside: Erlang's port mapper outlives every node on
    the machine by design, as the test brokers' does."""
    left = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ and not re.search(r"(^|/)epmd\b", command):
            left.append(f"{proc.name}: {command}")
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)
    return left


def ended(cluster: SlurmCluster, job_id: str, tmp_path: Path, timeout: float, each_second=None) -> dict[str, str]:
    try:
        return cluster.wait_for_end(job_id, timeout, each_second)
    except Exception:
        print(job_log(tmp_path, job_id), file=sys.stderr)
        raise


def job_log(tmp_path: Path, job_id: str) -> str:
    files = [tmp_path / f"slurm-{job_id}.out", *sorted((tmp_path / f"palomino-{job_id}" / "logs").glob("*.log"))]
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in files if p.is_file())


def test_sbatch_trains_a_ring_grid_on_a_slurm_cluster(cluster: SlurmCluster, tmp_path: Path) -> None:
    iterations = 6
    job_id = submit(cluster, tmp_path, job_env(tmp_path, "slurm-ring", iterations, checkpoint_every=3))
    cell_steps: dict[str, str] = {}

    def watch_steps(_: dict[str, str]) -> None:
        cell_steps.update({s["StepId"]: s["Tasks"] for s in cluster.steps(job_id) if s.get("Name") == "palomino-cells"})

    job = ended(cluster, job_id, tmp_path, timeout=240, each_second=watch_steps)
    log = job_log(tmp_path, job_id)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert job["NumTasks"] == str(TASKS)
    # srun's one step started the tasks asked for: Slurm says so, each task's output carries its
    # label (--label), and each task registered as a worker that trained its patch of the grid.
    assert list(cell_steps.values()) == [str(TASKS)], cell_steps
    cells_log = (tmp_path / f"palomino-{job_id}" / "logs" / "cells.log").read_text()
    assert {int(n) for n in re.findall(r"^(\d+): ", cells_log, re.M)} == set(range(TASKS))

    out = (tmp_path / f"slurm-{job_id}.out").read_text()
    run_path = Path(re.findall(r"^palomino: run directory (.+)$", out, re.M)[-1])
    assert run_path.parent == tmp_path / "runs", out
    run = RunDirectory.open(run_path)
    counted = Counter((tuple(r["cell"]), r["iteration"]) for r in records(run))
    assert counted == Counter({(cell, i): 1 for cell in CELLS for i in range(iterations)})  # each iteration once
    assert json.loads((run_path / "result" / "ranking.json").read_text())["ranking"]
    layout = json.loads((run_path / "topology.jsonl").read_text().splitlines()[-1])["cells"]
    workers = Counter(worker.rsplit("/", 1)[0] for worker in layout.values())
    assert sorted(workers.values()) == [4, 5], layout  # two tasks, each hosting its patch
    assert leftovers(job_id) == []  # the EXIT trap stopped every service and server


def test_scancel_mid_run_leaves_checkpoints_that_resume(cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = submit(cluster, tmp_path, job_env(tmp_path, "slurm-cancel", 100_000, checkpoint_every=5))
    runs = tmp_path / "runs"

    def checkpointed() -> bool:  # every cell has a checkpoint
        found = list(runs.glob("slurm-cancel-*"))
        return bool(found) and all(list((found[0] / "checkpoints" / cell_name(c)).glob("iter-*.json")) for c in CELLS)

    deadline = time.monotonic() + 180
    while not checkpointed():
        state = cluster.job(job_id)["JobState"]
        assert state in {"PENDING", "RUNNING"}, f"job {state} before any checkpoint\n{job_log(tmp_path, job_id)}"
        assert time.monotonic() < deadline, f"no checkpoint of every cell in 180 s\n{job_log(tmp_path, job_id)}"
        time.sleep(1)

    # SIGTERM to the batch script alone: its EXIT trap stops the cells first (each finishes its
    # iteration and checkpoints while the broker is up), then the services. A plain scancel signals
    # every process of the job at once, the broker too: only the periodic checkpoints would remain.
    signalled = time.time()
    cluster.command("scancel", "--batch", "--signal=TERM", job_id)
    job = ended(cluster, job_id, tmp_path, timeout=120)
    log = job_log(tmp_path, job_id)
    assert job["ExitCode"] == "0:15", (job, log)  # the batch script ended by the SIGTERM
    assert leftovers(job_id) == []

    run_path = next(runs.glob("slurm-cancel-*"))
    run = RunDirectory.open(run_path)
    before = records(run)
    counted = Counter((cell_name(r["cell"]), r["iteration"]) for r in before)
    assert set(counted.values()) == {1}, "an iteration recorded twice"
    newest = {}
    for coord in CELLS:
        checkpoint = newest_valid(run.checkpoint_dir(coord), raw=True)  # the project's own loader
        assert checkpoint is not None, coord
        recorded = [i for (cell, i) in counted if cell == cell_name(coord)]
        # Written after the signal (whole seconds: a file system's clock may have no finer), at the
        # iteration after the last one recorded: nothing lost.
        assert checkpoint.iteration == max(recorded) + 1 == len(recorded), (coord, checkpoint.iteration, log)
        assert checkpoint.path.stat().st_mtime >= int(signalled), (coord, checkpoint.path)
        newest[cell_name(coord)] = checkpoint.iteration

    # `palomino train --resume` continues it in one process from those checkpoints, to a few
    # iterations past the newest. The two tasks' patches stopped at different iterations: with
    # `tiles: auto` the resume trains one cell at a time, each from its own checkpoint.
    iterations = max(newest.values()) + 2
    done = palomino("train", "--resume", run_path, "--set", f"training.iterations={iterations}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no valid checkpoint" not in done.stderr, done.stderr[-3000:]
    assert last_line(done.stdout) == str(run_path)
    after = records(RunDirectory.open(run_path))
    assert Counter((tuple(r["cell"]), r["iteration"]) for r in after) == Counter(
        {(cell, i): 1 for cell in CELLS for i in range(iterations)}
    )
    # Each cell went on from its checkpoint: the Slurm job's records (all before it) are kept as they were.
    assert [r for r in after if r["iteration"] < newest[cell_name(r["cell"])]] == before
    listed = json.loads(last_line(palomino("runs", "--json", runs, cwd=tmp_path).stdout))
    assert (listed["state"], listed["iterations_done"]) == ("finished", iterations), listed
