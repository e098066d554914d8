"""The distributed runtime end to end: real orchestrator and cell processes, real RabbitMQ and Redis
(the session's throwaway ones, which some tests restart), and workers killed with SIGKILL mid-run."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import wait_until
from servers import Servers

from palomino.services.common.client import OrchestratorClient
from palomino.services.local import free_port, stop_processes

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ITERATIONS = 60  # long enough that a kill after the first records lands mid-run


def env(**changes: str) -> dict[str, str]:
    """The environment of the processes a test starts: read when they start, after the servers' URLs are set."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **changes}


def config(tmp_path: Path, checkpoint_every: int = 2, **distributed) -> str:
    cfg = {
        "name": "dist",
        "seed": 3,
        "grid": {"rows": 2, "cols": 2},
        "training": {
            "iterations": ITERATIONS,
            "batch_size": 64,
            "batches_per_iteration": 20,
            "fitness": {"sample_size": 32},
            "mixture": {"score_samples": 64},
            "checkpoint_every": checkpoint_every,
            "sample_every": 7,
        },
        "data": {"name": "gaussian_ring", "size": 500},
        "network": {"name": "mlp", "hidden": 64},
        "distributed": {"heartbeat_ttl": 3.0, "neighbour_timeout": 10.0, **distributed},
    }
    return yaml.safe_dump(cfg)


class Stack:
    """An orchestrator and cells as separate processes, as `palomino up` starts them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.port = tmp_path, free_port()
        self.runs = tmp_path / "runs"
        self.processes: dict[str, subprocess.Popen] = {}
        self.client = OrchestratorClient(f"http://127.0.0.1:{self.port}")

    def spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}.log", "wb")
        # A namespace of its own: other stacks on this broker (a concurrent run) never see its messages.
        process = subprocess.Popen(
            [sys.executable, "-m", "palomino", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env(PALOMINO_NAMESPACE=f"test-{self.port}"),
        )
        self.processes[name] = process
        return process

    def start(self, cells: int) -> None:
        self.start_orchestrator()
        self.worker_prefix = f"t{self.port}"
        for i in range(cells):
            self.spawn(f"cell-{i}", "cell", "--worker-id", f"{self.worker_prefix}-{i}")

    def start_orchestrator(self, log: str = "orchestrator") -> None:
        self.spawn(log, "orchestrator", "--runs", str(self.runs), "--port", str(self.port))
        deadline = time.monotonic() + 60
        while not self.client.healthy():
            assert time.monotonic() < deadline, self.log(log)
            time.sleep(0.3)

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def kill(self, worker: str) -> None:
        name = "cell-" + worker.rsplit("-", 1)[1]
        self.processes[name].send_signal(signal.SIGKILL)
        self.processes[name].wait()

    def stop(self) -> None:
        stop_processes(list(self.processes.values()))


@pytest.fixture
def stack(tmp_path: Path):
    s = Stack(tmp_path)
    yield s
    s.stop()


def wait_for_records(stack: Stack, experiment: str, records: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        summary = stack.client.experiment(experiment)
        if summary["records"] >= records or (summary["state"] != "running" and summary["state"] != "waiting"):
            return summary
        assert time.monotonic() < deadline, f"only {summary['records']} records: {summary}"
        time.sleep(0.2)


def wait_for_cell_record(run_dir: Path, cell: str, iteration: int = 0, timeout: float = 120) -> None:
    """Until metrics.jsonl holds iteration `iteration` (or a later one) of `cell` ("r-c")."""
    deadline = time.monotonic() + timeout
    while recorded_cells(run_dir / "metrics.jsonl").get(cell, -1) < iteration:
        assert time.monotonic() < deadline, f"cell {cell} recorded no iteration {iteration} in {timeout} s"
        time.sleep(0.2)


def recorded_cells(metrics: Path) -> dict[str, int]:
    """Each recorded cell's newest recorded iteration."""
    cells: dict[str, int] = {}
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            record = json.loads(line)
            name = "-".join(map(str, record["cell"]))
            cells[name] = max(cells.get(name, -1), int(record["iteration"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line being written
    return cells


def check_finished_run(run_dir: Path, cells: int, iterations: int) -> list[dict]:
    for name in (
        "config.yaml",
        "topology.jsonl",
        "metrics.jsonl",
        "result/mixture.safetensors",
        "result/mixture.json",
        "result/ranking.json",
        "result/samples.png",
    ):
        assert (run_dir / name).is_file(), name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = [(tuple(r["cell"]), r["iteration"]) for r in records]
    assert len(keys) == len(set(keys)), "a (cell, iteration) was recorded twice"
    assert {k[1] for k in keys} == set(range(iterations))
    ranking = json.loads((run_dir / "result/ranking.json").read_text())["ranking"]
    assert len(ranking) == cells
    assert all((run_dir / "result/cells" / entry["cell"] / "mixture.safetensors").is_file() for entry in ranking)
    assert (run_dir / "samples/real.png").read_bytes().startswith(b"\x89PNG")
    return [json.loads(line) for line in (run_dir / "topology.jsonl").read_text().splitlines()]


def test_up_trains_a_grid_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(config(tmp_path))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "palomino",
            "up",
            str(path),
            "--cells",
            "4",
            "--spares",
            "1",
            "--out",
            str(tmp_path / "runs"),
            "--set",
            "scoring.every=25",
            "--set",
            "training.ensemble.critic_quantile=0.05",
            "--set",
            "training.ensemble.critic=own",
            "--tensorboard",
            str(tmp_path / "tb"),
        ],
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = Path(result.stdout.strip().splitlines()[-1])
    topology = check_finished_run(run_dir, cells=4, iterations=ITERATIONS)
    assert topology[0]["rows"] == 2 and topology[0]["cols"] == 2 and len(topology[0]["cells"]) == 4
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4 * ITERATIONS
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["0-0", "0-1", "1-0", "1-1"]
    # The scorer scored the final mixtures (up waits for them) and the periodic ones of scoring.every.
    scores = json.loads((run_dir / "scores.json").read_text())
    assert set(scores["cells"]) == {"0-0", "0-1", "1-0", "1-1"} and scores["best"]["metrics"]["modes"]["modes"] == 8
    assert "best mixture: modes" in result.stderr
    # The scorer optimised the whole grid's ensemble; the orchestrator accepted its weights into result/.
    mixture = json.loads((run_dir / "result/mixture.json").read_text())
    assert mixture["cell"] == "grid" and mixture["components"] == ["0-0", "0-1", "1-0", "1-1"]
    assert mixture["weights"] == pytest.approx(mixture["ensemble"]["weights"]) and sum(
        mixture["weights"]
    ) == pytest.approx(1)
    assert json.loads((run_dir / "result/ranking.json").read_text())["ensemble"]["cells"] == mixture["components"]
    # Every cell sent its discriminator; the scorer calibrated each one on its cell's data into the
    # filter that cell's samples go through (training.ensemble.critic: own).
    rule = mixture["filter"]
    assert mixture["critics"] == mixture["components"] and rule["quantile"] == 0.05 and rule["rule"] == "own"
    assert len(rule["thresholds"]) == 4 and all(math.isfinite(t) for t in rule["thresholds"])
    assert mixture["ensemble"]["filter"] == rule
    sampled = subprocess.run([sys.executable, "-m", "palomino", "sample", str(run_dir), "--n", "50", "--out", str(tmp_path / "s.npy")],
                             capture_output=True, text=True, env=env(), timeout=120, check=False)  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    periodic = {(key.split("@")[0], entry["iteration"]) for key, entry in scores.get("periodic", {}).items()}
    assert {(cell, i) for cell in scores["cells"] for i in (25, 50)} <= periodic, sorted(periodic)
    # The orchestrator logged the run to TensorBoard as it wrote metrics.jsonl and the samples.
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(tmp_path / "tb" / run_dir.name), {"scalars": 0, "images": 0})
    events.Reload()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best = {i + 1: min(r["score"] for r in records if r["iteration"] == i) for i in range(ITERATIONS)}
    assert {e.step: e.value for e in events.Scalars("grid/best_score")} == pytest.approx(best, rel=1e-6)
    for cell in ("0-0", "0-1", "1-0", "1-1"):
        assert [e.step for e in events.Scalars(f"generator_loss/{cell}")] == list(range(1, ITERATIONS + 1))
        drawn = sorted(int(p.stem[5:]) for p in (run_dir / "samples" / cell).glob("iter-*.png"))
        assert drawn and [e.step for e in events.Images(f"samples/{cell}")] == drawn
    assert [e.step for e in events.Scalars("result/score")] == [ITERATIONS]


@pytest.mark.parametrize(
    "selection",
    [{"replacement": "if_fitter", "opponents": "per_batch"}, {"enabled": False, "opponents": "per_batch"}],
    ids=["lipizzaner", "lipizzaner-no-selection"],
)
def test_lipizzaners_mode_trains_the_same_numbers_distributed_as_in_one_process(
    tmp_path: Path, selection: dict
) -> None:
    """The faithful settings (examples/lipizzaner-mnist-3x3.yaml's, on the ring), synchronous: four cell
    workers around the broker record what one process records, to the last bit."""
    raw = yaml.safe_load(config(tmp_path))
    raw["training"].update(
        iterations=5,
        batches_per_iteration=10,
        synchronous=True,
        losses=["nonsaturating"],
        discriminator_skip_each_nth_step=1,
        mutation={"reaches_optimizer": False},
        selection=selection,
        ensemble={"scope": "neighbourhood"},
        checkpoint_every=0,
        sample_every=0,
    )
    path = tmp_path / "lipizzaner.yaml"
    path.write_text(yaml.safe_dump({**raw, "tiles": "off"}))

    def records(*how: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "palomino", *how, str(path), "--out", str(tmp_path / how[0])],
            capture_output=True, text=True, env=env(), timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        lines = (Path(done.stdout.strip().splitlines()[-1]) / "metrics.jsonl").read_text().splitlines()
        return {
            (r["iteration"], tuple(r["cell"])): (r["score"], r["generator"], r["discriminator"], r["mixture"])
            for r in map(json.loads, lines)
        }

    one_process = records("train")
    assert len(one_process) == 20
    # About one distributed run in five differed here until a binding cell's catch-up looked at a
    # last-value queue only once (another neighbour's read hides its one message: the cell then
    # trained against its neighbour's next snapshot; test_transport_services shows it). Up to three
    # runs stay, one of which must match to the last bit, until CI has shown no other cause.
    differing = []
    for _ in range(3):
        distributed = records("up", "--cells", "4")
        if distributed == one_process:
            break
        logs = max((tmp_path / "up" / ".up-logs").iterdir())  # this run's; a missed snapshot is logged
        missed = [
            line for f in sorted(logs.glob("cell-*.log")) for line in f.read_text().splitlines() if "not held" in line
        ]
        differing.append((min(k for k in one_process if distributed.get(k) != one_process[k]), missed[:3]))
    else:
        raise AssertionError(f"three distributed runs differ from one process, first at (iteration, cell) {differing}")


def test_a_killed_cell_is_replaced_by_a_spare(stack: Stack) -> None:
    stack.start(cells=5)
    # No checkpoint before iteration 40: the spare can only restore from the newest published snapshot.
    experiment = stack.client.submit(config(stack.tmp_path, checkpoint_every=40, on_failure="replace"))["id"]
    summary = wait_for_records(stack, experiment, 6)
    assert summary["state"] == "running"
    victim_cell, victim = sorted(summary["cells"].items())[1]
    # Six records may all come from the other cells on a loaded machine. A cell records an iteration,
    # then publishes its snapshot: its record of iteration 1 means its trained snapshot of iteration 0
    # is published, so a kill at any moment after leaves a trained snapshot to restore.
    wait_for_cell_record(Path(summary["run_dir"]), victim_cell, iteration=1)
    stack.kill(victim)
    killed_at = time.monotonic()
    while victim in stack.client.experiment(experiment)["cells"].values():
        assert time.monotonic() - killed_at < 3.0 + 5.0 + 2.0, "no spare took over within TTL + 5 s"
        time.sleep(0.2)
    detected = time.monotonic() - killed_at
    final = stack.client.wait(experiment, timeout=240)
    assert final["state"] == "finished", final
    assert detected <= 3.0 + 5.0 + 0.5
    assert final["failures"][0]["action"] == "replace" and final["failures"][0]["cell"] == victim_cell
    topology = check_finished_run(Path(final["run_dir"]), cells=4, iterations=ITERATIONS)
    assert [t["epoch"] for t in topology] == [0, 1]
    assert topology[1]["cells"][victim_cell] != victim and victim not in topology[1]["cells"].values()
    restarted = re.search(
        rf"cell\s+{victim_cell}\s+of\s+\S+\s+restarts\s+at\s+iteration\s+(\d+)\s+from\s+(\w+)",
        stack.log("orchestrator"),
    )
    assert restarted and restarted.group(2) == "snapshot" and int(restarted.group(1)) > 0, stack.log("orchestrator")[
        -2000:
    ]
    print(
        f"[fault] replace: killed {victim} at {victim_cell} after {summary['records']} records; a spare took over in "
        f"{detected:.1f} s (TTL 3 s), restored from the snapshot of iteration {restarted.group(1)}; epochs {[t['epoch'] for t in topology]}"
    )


def test_a_frozen_cell_woken_after_its_handover_is_fenced_off_and_told_to_stop(stack: Stack) -> None:
    """Issue 50, the zombie writer: a cell worker frozen (SIGSTOP) past its TTL loses its cell to a
    spare and, thawed, goes on with the iteration it was in, believing it still owns the cell. What
    it sends is refused (the run's records stay each once: the spare restarts from an earlier
    iteration, so an accepted zombie record would be a duplicate), the orchestrator tells it to stop,
    and the run finishes."""
    from faults import pause, resume

    stack.start(cells=5)
    experiment = stack.client.submit(config(stack.tmp_path, checkpoint_every=40, on_failure="replace"))["id"]
    summary = wait_for_records(stack, experiment, 6)
    victim_cell, victim = sorted(summary["cells"].items())[1]
    wait_for_cell_record(Path(summary["run_dir"]), victim_cell)
    name = "cell-" + victim.rsplit("-", 1)[1]
    process = stack.processes[name]
    frozen = pause(process.pid)
    try:
        wait_until(lambda: victim not in stack.client.experiment(experiment)["cells"].values(), timeout=30)
        time.sleep(1.0)  # the spare at work
    finally:
        resume(frozen)
    wait_until(lambda: "stop: its cells were handed to spares" in stack.log(name), timeout=60)
    final = stack.client.wait(experiment, timeout=240)
    assert final["state"] == "finished", final
    check_finished_run(Path(final["run_dir"]), cells=4, iterations=ITERATIONS)
    counters = httpx.get(f"http://127.0.0.1:{stack.port}/metrics", timeout=10).text
    assert 'palomino_orchestrator_total{name="stale_owners_stopped"} 1.0' in counters, counters
    assert process.poll() is None  # it lives on, a spare again


def waiting_for_the_orchestrator(stack: Stack, servers: Servers) -> int:
    """How many messages wait in the stack's orchestrator queue (palomino.orchestrator.<namespace>)."""
    listed = servers.rabbitmq.ctl("-q", "list_queues", "name", "messages").stdout.split("\n")
    queue = f"palomino.orchestrator.test-{stack.port}"
    return sum(int(fields[1]) for fields in map(str.split, listed) if len(fields) == 2 and fields[0] == queue)


def test_an_orchestrator_killed_and_restarted_finishes_its_experiment(stack: Stack, servers: Servers) -> None:
    # Its experiments lived only in memory: after kill -9 the experiment answered 404 and never ended.
    stack.start(cells=4)
    experiment = stack.client.submit(config(stack.tmp_path))["id"]
    before = wait_for_records(stack, experiment, 6)
    assert before["state"] == "running"
    stack.processes["orchestrator"].send_signal(signal.SIGKILL)
    stack.processes["orchestrator"].wait()
    # The cells train on, and their Metrics wait in the durable queue for the next orchestrator.
    wait_until(lambda: waiting_for_the_orchestrator(stack, servers) >= 4, timeout=60)
    stack.start_orchestrator("orchestrator-2")
    again = stack.client.experiment(experiment)
    # Known again, with its layout; already finished if the cells' Done messages were all waiting
    # in the queue (a fast tile finishes the few iterations while the orchestrator is down).
    assert again["state"] in ("running", "finished") and again["cells"] == before["cells"], again
    final = stack.client.wait(experiment, timeout=240)
    assert final["state"] == "finished" and final["failures"] == [], final
    check_finished_run(Path(final["run_dir"]), cells=4, iterations=ITERATIONS)
    assert "reloaded" in stack.log("orchestrator-2")


def test_a_killed_cell_shrinks_the_grid(stack: Stack) -> None:
    stack.start(cells=4)
    experiment = stack.client.submit(config(stack.tmp_path, on_failure="shrink", min_cells=2))["id"]
    summary = wait_for_records(stack, experiment, 6)
    _, victim = sorted(summary["cells"].items())[3]
    stack.kill(victim)
    killed_at = time.monotonic()
    while stack.client.experiment(experiment)["epoch"] == 0:
        assert time.monotonic() - killed_at < 30, "no shrink within 30 s"
        time.sleep(0.2)
    detected = time.monotonic() - killed_at
    final = stack.client.wait(experiment, timeout=240)
    assert final["state"] == "finished", final
    assert (final["rows"], final["cols"]) == (1, 3) and final["epoch"] == 1
    topology = [json.loads(line) for line in (Path(final["run_dir"]) / "topology.jsonl").read_text().splitlines()]
    assert [(t["rows"], t["cols"]) for t in topology] == [(2, 2), (1, 3)]
    assert victim not in topology[1]["cells"].values()
    # As few moves as possible: the survivors at 0-0 and 0-1 keep their coordinates.
    assert topology[1]["cells"]["0-0"] == topology[0]["cells"]["0-0"]
    assert topology[1]["cells"]["0-1"] == topology[0]["cells"]["0-1"]
    assert len(json.loads((Path(final["run_dir"]) / "result/ranking.json").read_text())["ranking"]) == 3
    print(
        f"[fault] shrink: killed {victim} after {summary['records']} records; 2×2 → 1×3 (epoch 1) in {detected:.1f} s (TTL 3 s)"
    )


def test_multi_cell_workers_killed_one_after_another_are_replaced_then_shrunk_as_blocks(stack: Stack) -> None:
    """Three workers of four cells (`palomino cell --cells 4`), a 2×4 grid: two train a 2×2 patch each
    as one tile, the third waits. One is killed: the spare takes its patch whole. Then another: no
    spare is left, so the grid shrinks to the survivors' 2×2 and the moved cells go on where they are."""
    stack.start_orchestrator()
    for i in range(3):
        stack.spawn(f"block-{i}", "cell", "--worker-id", f"b{stack.port}-{i}", "--cells", "4")
    cfg = yaml.safe_load(config(stack.tmp_path, checkpoint_every=40, min_cells=4))
    cfg["grid"] = {"rows": 2, "cols": 4}
    experiment = stack.client.submit(yaml.safe_dump(cfg))["id"]
    summary = wait_for_records(stack, experiment, 16)
    assert summary["state"] == "running", summary

    def patches(cells: dict[str, str]) -> dict[str, list[tuple[int, int]]]:
        out: dict[str, list[tuple[int, int]]] = {}
        for cell, slot in cells.items():
            out.setdefault(slot.rsplit("/", 1)[0], []).append(tuple(map(int, cell.split("-"))))
        return out

    def kill(worker: str) -> None:
        stack.processes[f"block-{worker.rsplit('-', 1)[1]}"].send_signal(signal.SIGKILL)

    first = patches(summary["cells"])
    assert len(first) == 2 and all(len({r for r, _ in p}) == len({c for _, c in p}) == 2 for p in first.values())
    victim = summary["cells"]["0-0"].rsplit("/", 1)[0]
    wait_for_cell_record(Path(summary["run_dir"]), "0-0")
    kill(victim)
    deadline = time.monotonic() + 30
    while victim in patches(cells := stack.client.experiment(experiment)["cells"]):
        assert time.monotonic() < deadline, "no spare took the patch over"
        time.sleep(0.2)
    taker = next(w for w in patches(cells) if w not in first)
    second = next(w for w in first if w != victim)
    kill(second)
    final = stack.client.wait(experiment, timeout=300)
    assert final["state"] == "finished", final
    replaced = [f for f in final["failures"] if f["action"] == "replace"]
    assert sorted(f["cell"] for f in replaced) == sorted(f"{r}-{c}" for r, c in first[victim])
    assert {f["by"].rsplit("/", 1)[0] for f in replaced} == {taker}
    assert [f["action"] for f in final["failures"]] == ["replace"] * 4 + ["shrink"] * 4, final["failures"]
    assert (final["rows"], final["cols"]) == (2, 2) and set(patches(final["cells"])) == {taker}
    check_finished_run(Path(final["run_dir"]), cells=4, iterations=ITERATIONS)
    records = [json.loads(line) for line in (Path(final["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("tile") == 4 for r in records)  # the blocks trained as tiles
    print(f"[fault] blocks of 4 killed in turn: {victim} replaced by {taker}, then {second}: shrunk to 2×2")


def test_below_min_cells_the_experiment_fails_with_its_reason(stack: Stack) -> None:
    stack.start(cells=2)
    experiment = stack.client.submit(
        config(stack.tmp_path, on_failure="shrink", min_cells=2).replace("rows: 2", "rows: 1")
    )["id"]
    summary = wait_for_records(stack, experiment, 4)
    stack.kill(sorted(summary["cells"].values())[0])
    final = stack.client.wait(experiment, timeout=120)
    assert final["state"] == "failed" and "min_cells is 2" in final["reason"]
    assert any((Path(final["run_dir"]) / "checkpoints").iterdir()), "checkpoints are kept"


def test_a_cell_with_a_bad_broker_url_exits_with_a_clear_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "palomino", "cell", "--broker", "amqp://guest:guest@127.0.0.1:1/"],
        capture_output=True,
        text=True,
        env={**env(), "PALOMINO_CONNECT_DEADLINE": "1"},  # refused: tried again for a second, then given up
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:1/" in result.stderr
    assert "trying again for up to 1 s" in result.stderr and " tries in " in result.stderr
    assert "Traceback" not in result.stderr


def test_the_run_survives_a_rabbitmq_restart(stack: Stack, servers: Servers) -> None:
    stack.start(cells=4)
    experiment = stack.client.submit(config(stack.tmp_path))["id"]
    wait_for_records(stack, experiment, 8)
    # The broker application restarts (the session's own node, same port): every connection drops,
    # non-durable queues go.
    servers.rabbitmq.restart_app()
    final = stack.client.wait(experiment, timeout=300)
    assert final["state"] == "finished", final
    check_finished_run(Path(final["run_dir"]), cells=4, iterations=ITERATIONS)
    assert final["failures"] == [], "nobody should have been declared dead"


def test_the_run_survives_a_redis_restart(stack: Stack, servers: Servers) -> None:
    stack.start(cells=4)
    experiment = stack.client.submit(config(stack.tmp_path))["id"]
    wait_for_records(stack, experiment, 8)
    # The session's Redis keeps nothing on disk: every heartbeat key vanishes with the restart.
    servers.redis.stop()
    time.sleep(2)
    servers.redis.start()
    final = stack.client.wait(experiment, timeout=300)
    assert final["state"] == "finished", final
    assert final["failures"] == [], "no worker may be declared dead because Redis restarted"
    check_finished_run(Path(final["run_dir"]), cells=4, iterations=ITERATIONS)


def test_garbage_on_the_snapshot_exchange_does_not_stop_training(stack: Stack) -> None:
    import asyncio

    from conftest import raw_publish

    from palomino.grid import Coord
    from palomino.transport.rabbitmq import routing_key

    stack.start(cells=4)
    experiment = stack.client.submit(config(stack.tmp_path))["id"]
    wait_for_records(stack, experiment, 4)
    key = routing_key(experiment, Coord(0, 1))
    bodies = [b"garbage", b"\x00" * 7, (10**9).to_bytes(8, "little") + b"{}", b"{" * 70_000_000]
    for body in bodies:
        asyncio.run(raw_publish(body, key))
    final = stack.client.wait(experiment, timeout=300)
    assert final["state"] == "finished", final
    check_finished_run(Path(final["run_dir"]), cells=4, iterations=ITERATIONS)
    logs = "".join(stack.log(f"cell-{i}") for i in range(4))
    assert logs.count("dead-lettering a message") >= 2 * len(bodies)  # both neighbours of 0-1 rejected each


# --- class-partitioned runs: one sub-grid per class, failures handled within a class ----------------


def partitioned(tmp_path: Path, classes: list[int], per_class: str, **distributed) -> str:
    cfg = yaml.safe_load(config(tmp_path, **distributed))
    del cfg["grid"]["rows"], cfg["grid"]["cols"]
    cfg["grid"]["per_class"] = per_class
    cfg["data"].update(classes=classes, partition="labels", size=900)
    cfg["training"]["iterations"] = 30
    return yaml.safe_dump(cfg)


def test_a_partitioned_run_trains_one_sub_grid_per_class(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(partitioned(tmp_path, [0, 3, 5], "1x1"))
    result = subprocess.run(
        [sys.executable, "-m", "palomino", "up", str(path), "--cells", "3", "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = Path(result.stdout.strip().splitlines()[-1])
    topology = [json.loads(line) for line in (run_dir / "topology.jsonl").read_text().splitlines()]
    assert topology[0]["classes"] == {
        "0": {"rows": 1, "cols": 1, "row_offset": 0},
        "3": {"rows": 1, "cols": 1, "row_offset": 1},
        "5": {"rows": 1, "cols": 1, "row_offset": 2},
    }
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {(tuple(r["cell"]), r["class"]) for r in records} == {((0, 0), 0), ((1, 0), 3), ((2, 0), 5)}
    assert all(not r["neighbours"] and list(r["mixture"]) == ["-".join(map(str, r["cell"]))] for r in records), (
        "1×1 sub-grids: no neighbours"
    )
    mixture = json.loads((run_dir / "result/mixture.json").read_text())
    assert sorted(mixture["classes"]) == ["0", "3", "5"]
    assert abs(sum(c["prior"] for c in mixture["classes"].values()) - 1) < 1e-9
    assert all((run_dir / "result/classes" / c / "mixture.safetensors").is_file() for c in ("0", "3", "5"))
    scores = json.loads((run_dir / "scores.json").read_text())  # every cell scored by the scorer `up` started
    assert set(scores["cells"]) == {"0-0", "1-0", "2-0"}


def test_a_partitioned_run_shrinks_only_the_class_that_lost_a_cell(stack: Stack) -> None:
    stack.start(cells=4)
    experiment = stack.client.submit(partitioned(stack.tmp_path, [1, 2], "1x2", on_failure="shrink", min_cells=2))["id"]
    summary = wait_for_records(stack, experiment, 6)
    assert summary["state"] == "running" and summary["classes"]["2"] == {"rows": 1, "cols": 2, "row_offset": 1}
    victim = summary["cells"]["1-1"]  # class 2's second cell
    stack.kill(victim)
    final = stack.client.wait(experiment, timeout=240)
    assert final["state"] == "finished", final
    assert final["classes"] == {
        "1": {"rows": 1, "cols": 2, "row_offset": 0},
        "2": {"rows": 1, "cols": 1, "row_offset": 1},
    }
    assert final["failures"][0]["to"] == "class 2: 1x1"
    topology = [json.loads(line) for line in (Path(final["run_dir"]) / "topology.jsonl").read_text().splitlines()]
    assert (
        topology[1]["cells"]["0-0"] == topology[0]["cells"]["0-0"]
        and topology[1]["cells"]["0-1"] == topology[0]["cells"]["0-1"]
    )
    assert set(topology[1]["cells"]) == {"0-0", "0-1", "1-0"}


def test_a_class_that_loses_every_cell_fails_the_experiment(stack: Stack) -> None:
    stack.start(cells=2)
    experiment = stack.client.submit(partitioned(stack.tmp_path, [0, 1], "1x1", on_failure="shrink", min_cells=1))["id"]
    summary = wait_for_records(stack, experiment, 4)
    stack.kill(summary["cells"]["1-0"])
    final = stack.client.wait(experiment, timeout=120)
    assert final["state"] == "failed" and "class 1: every cell of its sub-grid was lost" in final["reason"], final


@pytest.mark.parametrize("service", ["scorer", "cell"])
def test_sigterm_while_the_broker_does_not_answer_stops_the_service(tmp_path: Path, service: str) -> None:
    # The robust connection went on reconnecting after the signal: the process never exited.
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: [accepted.append(listener.accept()[0]) for _ in range(8)], daemon=True).start()
    url = f"amqp://guest:secret-pw@127.0.0.1:{listener.getsockname()[1]}/"
    log = open(tmp_path / "service.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "palomino", "-v", service], stdout=log, stderr=subprocess.STDOUT,
                               env=env(PALOMINO_BROKER_URL=url))  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "connecting to RabbitMQ" not in (tmp_path / "service.log").read_text(
            errors="replace"
        ):  # signal handlers are in place
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "service.log").read_text()
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=8) == 0  # well inside the 10 s connect timeout
        text = (tmp_path / "service.log").read_text(errors="replace")
        assert "stopped before it was connected" in text and "secret-pw" not in text
    finally:
        if process.poll() is None:
            process.kill()
        listener.close()
