"""Chaos (issue 36): a soak that SIGKILLs one service at random every `--period` seconds, and a
verdict of what was lost.

    python benchmarks/chaos.py --duration 1800 --period 120 --seed 1 --out chaos-1.json
    python benchmarks/chaos.py --duration 180 --period 30           # the slow test's short form

It starts a RabbitMQ and a Redis of its own (throwaway, as the tests start them: the machine's own
are never contacted), an orchestrator, a scorer, a dashboard and cell workers (`--blocks` of
`--cells-per-block` cells each, and `--singles` of one), and submits experiments one after another
— ring 3×3 and grid 4×4 in turn, `on_failure: auto` with a `min_cells`, each `--iterations` long —
until `--duration` has passed. Every `--period` seconds it SIGKILLs one service — a cell worker
(one training a cell when there is one), the orchestrator, the scorer, the dashboard, Redis or
RabbitMQ; each kind once a round, in an order the seed draws — and starts it again, as a
Deployment or a systemd unit would: the servers on their port with their data folder (RabbitMQ
keeps its durable queues, Redis keeps nothing), the services with their arguments, a cell worker
under a new id (the orchestrator sees a new spare; spares and shrinking stand in for the dead
one). Then it lets the last experiment finish and judges:

- experiments submitted / finished / failed (with the reason), each with its epochs and failures;
- iterations recorded per cell: none twice, none missing in the final layout since its epoch began;
- every checkpoint on disk loads; each finished run has its result, samples and the scorer's scores;
- messages dead-lettered, by queue and reason;
- the longest stall: no metrics record written anywhere while an experiment was due;
- each service's memory at the end against its memory once a run it took part in had finished
  and been scored (the scorer and the cells load torch and data on their first job).

`--faults kill,partition,pause` (issue 50) draws, each period, what befalls the service drawn: a
kill as above; a partition (`--partition-seconds`, 30: the service's links to RabbitMQ and Redis —
TCP forwarders of tests/faults.py, one pair a service — drop every byte both ways while both ends
live; for a server, everyone's links to it); or a pause (SIGSTOP of its process tree for
`--pause-seconds`, three heartbeat TTLs by default, then SIGCONT); or a half-open link (the
servers' side of the service's connections closed, its own left open and unanswered, until its
AMQP heartbeat or Redis timeout notices; for a server, everyone's). A cell worker cut off or frozen
past its TTL has its cells handed to spares and comes back a stale owner: its snapshots (older
epoch), records, checkpoints and Done are refused, and the orchestrator tells it to stop (the
verdict reports the orchestrator's counters).

The schedule is drawn from `--seed`: the same seed strikes the same services at the same times.
Exit 0 when the verdict holds (every experiment finished, nothing lost or twice, every checkpoint
loads, no stall longer than twice the longest restart or two TTLs, no service past twice its memory), else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the throwaway servers the tests use (standard library only)

from control_plane import wait  # noqa: E402 — a sibling script: benchmarks/ is on the path
from faults import Link, pause, resume  # noqa: E402
from faults import tree as descendants  # noqa: E402
from servers import Servers, free_port, listening  # noqa: E402

KINDS = ("cell", "orchestrator", "scorer", "dashboard", "redis", "rabbitmq")
FAULTS = ("kill", "partition", "pause", "half-open")


# ---- processes --------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    """Resident memory of pid and its descendants, MiB (0 once gone)."""
    total = 0
    for one in descendants(pid):
        try:
            for line in Path(f"/proc/{one}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return round(total / 1024, 1)


def kill_tree(pid: int) -> None:
    """SIGKILL pid and its descendants, and wait until each is gone: a broker whose beam.smp has
    not yet exited still holds its port, and its restart would take that for itself."""
    tree = descendants(pid)
    for one in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(one, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(running(one) for one in tree) and time.monotonic() < deadline:
        time.sleep(0.05)


def running(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class Instance:
    """One life of a service: from its start to its kill (or the end of the soak)."""

    name: str
    kind: str
    pid: int
    started: float
    worker: str = ""  # a cell worker's id
    rss: dict[str, float] = field(default_factory=dict)  # MiB: "start", "first_scored", "end"
    # (seconds into its life, MiB) once a minute: where a growth happened, against the soak's faults
    rss_series: list[tuple[int, float]] = field(default_factory=list)


class Fleet:
    """The services of the soak, each started again after it is killed."""

    def __init__(self, work: Path, servers: Servers, args: argparse.Namespace) -> None:
        self.work, self.servers, self.args = work, servers, args
        self.port, self.dashboard_port = free_port(), free_port()
        self.runs = work / "runs"
        # Two malloc arenas, as every deployment form sets (`palomino up`, the images, Apptainer,
        # Slurm): seeds 1–3 of the faults' table ran without, glibc's default of eight a core.
        self.env = {**os.environ, **servers.env, "PALOMINO_NAMESPACE": f"chaos{self.port}",
                    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2")}  # fmt: skip
        self.processes: dict[str, subprocess.Popen] = {}
        self.workers: dict[str, tuple[int, int]] = {}  # cell worker's name → (cells, generation)
        self.instances: list[Instance] = []
        self.lock = threading.Lock()
        # With partitions among the faults: each service reaches RabbitMQ and Redis through links of
        # its own (tests/faults.py), which the driver can cut; kept across its restarts.
        self.links: dict[str, dict[str, Link]] = {}
        self.partitions = bool({"partition", "half-open"} & set(args.faults))

    # -- starting --

    def spawn(self, name: str, kind: str, *args: str, worker: str = "") -> None:
        from servers import _die_with_parent

        log = open(self.work / "logs" / f"{name}.log", "ab")
        env = {**self.env, "PALOMINO_BROKER_URL": self.broker_url(name), "PALOMINO_REDIS_URL": self.redis_url(name)}
        process = subprocess.Popen(
            [sys.executable, "-m", "palomino", *args], stdout=log, stderr=subprocess.STDOUT,
            env=env, preexec_fn=_die_with_parent,
        )  # fmt: skip
        with self.lock:
            self.processes[name] = process
            self.instances.append(Instance(name, kind, process.pid, time.time(), worker))

    def start(self, name: str) -> None:
        """Start `name` (a service or a cell worker) and wait until it serves."""
        (self.work / "logs").mkdir(exist_ok=True)
        if name == "orchestrator":
            self.spawn(name, name, "orchestrator", "--runs", str(self.runs), "--port", str(self.port))
            self.serving(name)
        elif name == "scorer":
            self.spawn(name, name, "scorer", "--name", "chaos-scorer")
        elif name == "dashboard":
            self.spawn(name, name, "dashboard", "--orchestrator", self.url, "--broker", self.broker_url(name),
                       "--runs", str(self.runs), "--port", str(self.dashboard_port))  # fmt: skip
            self.serving(name)
        elif name in ("redis", "rabbitmq"):
            server = getattr(self.servers, name)
            server.start()  # same port, same folder: RabbitMQ keeps its durable queues, Redis nothing
            with self.lock:
                self.instances.append(Instance(name, name, server.process.pid, time.time()))
        else:
            cells, generation = self.workers[name]
            self.workers[name] = (cells, generation + 1)
            # A new id, as a restarted pod gets: the orchestrator sees a new spare, never the dead worker back.
            worker = f"{name}-g{generation + 1}"
            self.spawn(name, "cell", "cell", "--worker-id", worker, "--cells", str(cells), worker=worker)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _links(self, name: str) -> dict[str, Link]:
        if name not in self.links:
            self.links[name] = {
                "rabbitmq": Link(("127.0.0.1", self.servers.rabbitmq.port)).start(),
                "redis": Link(("127.0.0.1", self.servers.redis.port)).start(),
            }
        return self.links[name]

    def broker_url(self, name: str) -> str:
        url = self.servers.broker_url
        return self._links(name)["rabbitmq"].url(url) if self.partitions else url

    def redis_url(self, name: str) -> str:
        url = self.servers.redis_url
        return self._links(name)["redis"].url(url) if self.partitions else url

    def links_of(self, name: str) -> list[Link]:
        """`name`'s links to both servers, or, for a server, everyone's links to it."""
        if name in ("rabbitmq", "redis"):
            return [service[name] for service in self.links.values()]
        return list(self._links(name).values())

    def cut(self, name: str, heal: bool = False) -> None:
        """Partition `name` from both servers (or, for a server, everyone from it); `heal` mends."""
        for link in self.links_of(name):
            if heal:
                link.heal()
            else:
                link.cut()

    def half_open(self, name: str) -> int:
        """The servers' side of `name`'s connections closed, its own left open and unanswered (for a
        server, everyone's connections to it); returns how many."""
        return sum(link.half_open() for link in self.links_of(name))

    def start_all(self) -> None:
        for i in range(self.args.blocks):
            self.workers[f"block{i}"] = (self.args.cells_per_block, 0)
        for i in range(self.args.singles):
            self.workers[f"single{i}"] = (1, 0)
        for name in ("orchestrator", "scorer", "dashboard", *self.workers):
            self.start(name)

    # -- killing --

    def pid(self, name: str) -> int:
        if name in ("redis", "rabbitmq"):
            return getattr(self.servers, name).process.pid
        return self.processes[name].pid

    def kill(self, name: str) -> None:
        """SIGKILL, with every process it started (nothing is asked to stop)."""
        pid = self.pid(name)
        kill_tree(pid)
        if name in ("redis", "rabbitmq"):
            server = getattr(self.servers, name)
            server.process.wait()
            server.process = None
            # Its threads may still hold the port after the process reads as exited (a zombie leader).
            wait(lambda: not listening(server.port), 30, f"{name}'s port to close")
        else:
            self.processes[name].wait()

    def serving(self, name: str) -> None:
        """Wait until `name` answers: started, or back from a pause or a partition (its health; a server's port)."""
        import httpx

        if name == "orchestrator":
            wait(lambda: httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200, 120, "the orchestrator")
        elif name == "dashboard":
            wait(lambda: httpx.get(f"http://127.0.0.1:{self.dashboard_port}/healthz", timeout=2).status_code == 200,
                 120, "the dashboard")  # fmt: skip
        elif name in ("redis", "rabbitmq"):
            wait(lambda: listening(getattr(self.servers, name).port), 120, name)

    def live(self) -> list[Instance]:
        with self.lock:
            current = {}
            for instance in self.instances:  # the newest instance of each name
                current[instance.name] = instance
            return [i for i in current.values() if self.alive(i)]

    def alive(self, instance: Instance) -> bool:
        try:
            return self.pid(instance.name) == instance.pid and Path(f"/proc/{instance.pid}").exists()
        except (KeyError, AttributeError):
            return False

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        self.servers.stop()
        for links in self.links.values():
            for link in links.values():
                link.stop()


# ---- experiments --------------------------------------------------------------------------------


def experiment_config(kind: str, number: int, args: argparse.Namespace) -> str:
    """The example of `kind` (examples/ring-3x3.yaml, grid-4x4.yaml) as a soak runs it: `--iterations`
    long, checkpoints often (there are some to restore and to check), shrinking allowed."""
    import yaml

    config = yaml.safe_load((ROOT / "examples" / f"{kind}.yaml").read_text())
    config["name"] = f"chaos-{kind}-{number}"
    config["seed"] = number
    training = config["training"]
    training.update(
        iterations=args.iterations, checkpoint_every=args.checkpoint_every, sample_every=args.iterations // 2
    )
    training["batches_per_iteration"] = args.batches
    cells = config["grid"]["rows"] * config["grid"]["cols"]
    config["distributed"] = {"heartbeat_ttl": args.ttl, "min_cells": cells // 2, "on_failure": "auto"}
    return yaml.safe_dump(config)


@dataclass
class Soak:
    """What the driver saw: the experiments, the kills, the progress."""

    experiments: list[dict[str, Any]] = field(default_factory=list)  # {id, kind, submitted, ended, state}
    kills: list[dict[str, Any]] = field(default_factory=list)
    longest_stall: float = 0.0
    stall_at: float = 0.0
    started: float = field(default_factory=time.time)


class Monitor(threading.Thread):
    """Once a second: has any metrics record been written (the stall clock), and each service's memory."""

    def __init__(self, fleet: Fleet, soak: Soak) -> None:
        super().__init__(daemon=True)
        self.fleet, self.soak = fleet, soak
        self.due = False  # an experiment has recorded and not ended: records are expected
        self.last_progress, self.last_size = time.time(), -1
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(1.0):
            self.sample()

    def sample(self) -> None:
        now = time.time()
        size = sum(p.stat().st_size for p in self.fleet.runs.glob("*/metrics.jsonl") if p.exists())
        if size != self.last_size or not self.due:
            self.last_size, self.last_progress = size, now
        elif now - self.last_progress > self.soak.longest_stall:
            self.soak.longest_stall, self.soak.stall_at = now - self.last_progress, self.last_progress
        for instance in self.fleet.live():
            memory = rss_mib(instance.pid)
            if memory:
                instance.rss.setdefault("start", memory)
                instance.rss["end"] = memory
                age = int(now - instance.started)
                if not instance.rss_series or age - instance.rss_series[-1][0] >= 60:
                    instance.rss_series.append((age, round(memory, 1)))

    def mark(self, point: str, workers: set[str]) -> None:
        """Each live service's memory now, at `point` (the first time only); a cell worker's only
        once it has trained in a run (`workers`): a spare has not loaded torch and data yet."""
        for instance in self.fleet.live():
            if instance.kind != "cell" or instance.worker in workers:
                instance.rss.setdefault(point, rss_mib(instance.pid))


def state_of(client: Any, experiment: str) -> dict[str, Any] | None:
    try:
        return client.experiment(experiment)
    except Exception:  # noqa: BLE001 — the orchestrator is down or restarting: ask again next time
        return None


def scored(run_dir: Path) -> bool:
    """Whether the scorer's "best" result has reached the run's scores.json."""
    scores = run_dir / "scores.json"
    try:
        return "best" in json.loads(scores.read_text())
    except (OSError, ValueError):
        return False


# ---- the soak -----------------------------------------------------------------------------------


class Driver:
    """Submits experiments one after another and kills a service every period, as the seed says."""

    def __init__(self, fleet: Fleet, soak: Soak, monitor: Monitor, args: argparse.Namespace) -> None:
        from palomino.services.common.client import OrchestratorClient

        self.fleet, self.soak, self.monitor, self.args = fleet, soak, monitor, args
        self.client = OrchestratorClient(fleet.url, timeout=10)
        self.rng = random.Random(args.seed)
        self.current: dict[str, Any] | None = None
        self.deck: list[str] = []
        self.fault_deck: list[str] = []
        self.lasting: threading.Thread | None = None  # a partition or pause under way

    def run(self) -> None:
        end_kills = self.soak.started + self.args.duration
        next_kill = self.soak.started + self.args.period
        while True:
            now = time.time()
            if self.current is None or "ended" in self.current:
                if now >= end_kills:
                    break
                self.submit()
            else:
                self.follow()
            self.note_scores()
            if now >= next_kill and now < end_kills:
                self.wait_lasting()
                self.fault_one()
                next_kill += self.args.period
            time.sleep(1.0)
        self.wait_lasting()
        self.drain(time.time() + self.args.drain)

    def submit(self) -> None:
        number = len(self.soak.experiments)
        kind = ("ring-3x3", "grid-4x4")[number % 2]
        try:
            summary = self.client.submit(experiment_config(kind, number, self.args))
        except Exception as error:  # noqa: BLE001 — the orchestrator is down: the next tick tries again
            log(f"submit {kind}: {error}")
            return
        self.current = {"id": summary["id"], "kind": kind, "submitted": time.time()}
        self.soak.experiments.append(self.current)
        log(f"submitted {kind} as {summary['id']}")

    def follow(self) -> None:
        assert self.current is not None
        summary = state_of(self.client, self.current["id"])
        if summary is None:
            return
        if summary["records"] > 0:
            self.monitor.due = True
        if summary["state"] in ("finished", "failed"):
            self.current.update(ended=time.time(), state=summary["state"], run_dir=summary["run_dir"])
            self.monitor.due = False
            log(f"{self.current['id']} {summary['state']} (epoch {summary['epoch']}) {summary.get('reason', '')}")

    def note_scores(self) -> None:
        """Memory is compared between like moments: an experiment finished and scored."""
        for experiment in self.soak.experiments:
            run_dir = Path(experiment.get("run_dir", "."))
            if experiment.get("state") == "finished" and "scored" not in experiment and scored(run_dir):
                experiment["scored"] = time.time()
                self.monitor.mark("first_scored", trained_in(run_dir))

    def fault_one(self) -> None:
        if not self.deck:  # every kind once a round, in an order the seed draws
            self.deck = self.rng.sample(self.args.kinds, len(self.args.kinds))
        kind = self.deck.pop()
        fault = "kill"
        if len(self.args.faults) > 1:  # drawn only then: a kill-only soak keeps its schedule
            if not self.fault_deck:
                self.fault_deck = self.rng.sample(self.args.faults, len(self.args.faults))
            fault = self.fault_deck.pop()
        elif self.args.faults:
            fault = self.args.faults[0]
        before = state_of(self.client, self.current["id"]) if self.current and "ended" not in self.current else None
        name = self.rng.choice(self.cell_victims(before)) if kind == "cell" else kind
        entry: dict[str, Any] = {"t": round(time.time() - self.soak.started, 1), "fault": fault, "kind": kind, "service": name}  # fmt: skip
        if fault == "kill":
            self.kill_one(entry, before)
            self.soak.kills.append(entry)
            return

        # A partition or a pause lasts: the driver goes on following and submitting meanwhile (an
        # experiment that ends during it is seen to end, and the next one submitted).
        def lasting() -> None:
            self.cut_off(entry, before)
            self.soak.kills.append(entry)

        self.lasting = threading.Thread(target=lasting, daemon=True)
        self.lasting.start()

    def wait_lasting(self) -> None:
        """The partition or pause under way, to its end (before the next fault, and the verdict)."""
        if self.lasting is not None:
            self.lasting.join()
            self.lasting = None

    def cut_off(self, entry: dict[str, Any], before: dict[str, Any] | None) -> None:
        """A pause (SIGSTOP for --pause-seconds, then SIGCONT) or a partition (its links to both
        servers drop every byte for --partition-seconds, then carry again): the service lives on,
        and when it comes back a cell worker finds its cells handed to spares (a stale owner)."""
        name, fault = entry["service"], entry["fault"]
        seconds = {"partition": self.args.partition_seconds, "half-open": 0.0}.get(
            fault, self.args.pause_seconds or 3 * self.args.ttl
        )
        worker = ""
        if entry["kind"] == "cell":
            _cells, generation = self.fleet.workers[name]
            worker = f"{name}-g{generation}"
        held = self.held(before, worker) if worker else []
        started = time.time()
        frozen: list[int] = []
        if fault == "pause":
            frozen = pause(self.fleet.pid(name))
        elif fault == "half-open":
            entry["connections"] = self.fleet.half_open(name)
        else:
            self.fleet.cut(name)
        try:
            if held and seconds:  # its cells go to spares once its heartbeat expires, while it is away
                entry["handed_over_s"] = self.replaced(worker, started, started + seconds, before["id"])
            time.sleep(max(0.0, started + seconds - time.time()))
        finally:
            if fault == "pause":
                resume(frozen)
            elif fault == "partition":
                self.fleet.cut(name, heal=True)
        entry.update(seconds=seconds, worker=worker, cells_lost=len(held))
        # Back: the fault's length plus the time it takes to serve again (a service's health).
        try:
            self.fleet.serving(name)
            entry["restart_s"] = round(time.time() - started, 1)
        except Exception as error:  # noqa: BLE001 — reported: a service that does not come back is a finding
            entry.update(restart_s=None, error=str(error))
        log(f"{fault} of {name} for {seconds:g} s: back in {entry['restart_s']} s"
            + (f", {len(held)} cells handed over in {entry.get('handed_over_s')} s" if held else ""))  # fmt: skip

    def kill_one(self, entry: dict[str, Any], before: dict[str, Any] | None) -> None:
        kind, name = entry["kind"], entry["service"]
        killed = time.time()
        if kind == "cell":
            _cells, generation = self.fleet.workers[name]
            worker = f"{name}-g{generation}"
            self.fleet.kill(name)
            self.fleet.start(name)  # a new spare at once, as a restarted pod
            held = self.held(before, worker)
            entry.update(worker=worker, cells_lost=len(held))
            if held:
                entry["restart_s"] = self.replaced(worker, killed)
            else:
                entry["restart_s"] = 0.0  # a spare (or between experiments): nothing to replace
        else:
            self.fleet.kill(name)
            try:
                self.fleet.start(name)
                entry["restart_s"] = round(time.time() - killed, 1)
            except Exception as error:  # noqa: BLE001 — reported: a service that does not come back is a finding
                entry.update(restart_s=None, error=str(error))
        log(f"killed {name}: back in {entry['restart_s']} s" + (f", {entry['cells_lost']} cells lost" if kind == "cell" else ""))  # fmt: skip

    def cell_victims(self, summary: dict[str, Any] | None) -> list[str]:
        """The cell workers training a cell now (a spare's death tests little), else all of them."""
        busy = [name for name, (_, generation) in sorted(self.fleet.workers.items()) if self.held(summary, f"{name}-g{generation}")]  # fmt: skip
        return busy or sorted(self.fleet.workers)

    @staticmethod
    def held(summary: dict[str, Any] | None, worker: str) -> list[str]:
        """The cells `worker` held and had not finished (a finished one's result is collected)."""
        if summary is None:
            return []
        collected = Path(summary["run_dir"]) / "collected"
        return [cell for cell, slot in summary["cells"].items()
                if slot.rsplit("/", 1)[0] == worker and not (collected / cell).exists()]  # fmt: skip

    def replaced(self, worker: str, killed: float, until: float | None = None, experiment: str = "") -> float | None:
        """Seconds from the kill until no cell of the experiment (the current one) is held by `worker`."""
        from palomino.services.common.client import OrchestratorClient

        client = OrchestratorClient(self.fleet.url, timeout=10)  # its own: a lasting fault's thread asks too
        experiment = experiment or (self.current["id"] if self.current else "")
        deadline = until or killed + self.args.ttl + 120
        while time.time() < deadline:
            summary = state_of(client, experiment) if experiment else None
            if summary is not None:
                holders = {slot.rsplit("/", 1)[0] for slot in summary["cells"].values()}
                if worker not in holders or summary["state"] != "running":
                    return round(time.time() - killed, 1)
            time.sleep(0.2)
        return None

    def drain(self, deadline: float) -> None:
        """No more kills: the running experiment finishes and every finished one is scored."""
        while time.time() < deadline:
            if self.current is not None and "ended" not in self.current:
                self.follow()
            self.note_scores()
            if all("ended" in e and (e.get("state") != "finished" or "scored" in e) for e in self.soak.experiments):
                return
            time.sleep(1.0)
        log("drain: out of time")


def trained_in(run_dir: Path) -> set[str]:
    """The cell workers that held a cell of the run in any of its epochs."""
    held = set()
    for line in (run_dir / "topology.jsonl").read_text().splitlines():
        held.update(slot.rsplit("/", 1)[0] for slot in json.loads(line)["cells"].values())
    return held


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- the verdict --------------------------------------------------------------------------------


def judge_run(run_dir: Path, summary: dict[str, Any], iterations: int) -> dict[str, Any]:
    """Records (each once; the final layout's cells complete since their epoch began), checkpoints
    (each loads), result, samples and scores of one experiment."""
    from palomino.runs.checkpoints import list_iterations, read_checkpoint

    metrics = run_dir / "metrics.jsonl"  # absent where no cell ever recorded: every iteration is then missing
    records = (
        [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    )
    keys = [(f"{r['cell'][0]}-{r['cell'][1]}", r["iteration"]) for r in records]
    missing = 0
    for cell in summary["cells"]:
        last_epoch = [r["iteration"] for r in records if f"{r['cell'][0]}-{r['cell'][1]}" == cell and r.get("epoch") == summary["epoch"]]  # fmt: skip
        since = min(last_epoch, default=iterations if summary["state"] != "finished" else 0)
        missing += len(set(range(since, iterations)) - {i for c, i in keys if c == cell})
    loaded, corrupt = 0, []
    for folder in sorted((run_dir / "checkpoints").glob("*")):
        for iteration in list_iterations(folder):
            try:
                read_checkpoint(folder, iteration)
                loaded += 1
            except ValueError as error:
                corrupt.append(str(error))
    try:
        scores = json.loads((run_dir / "scores.json").read_text()).get("best", {})
    except (OSError, ValueError):
        scores = {}
    epochs = len((run_dir / "topology.jsonl").read_text().splitlines()) if (run_dir / "topology.jsonl").exists() else 0
    return {
        "epochs": epochs,
        "records": len(keys),
        "records_twice": len(keys) - len(set(keys)),
        "records_missing": missing,
        "checkpoints_loaded": loaded,
        "checkpoints_corrupt": corrupt,
        "result": (run_dir / "result" / "mixture.safetensors").is_file(),
        "samples": len(list((run_dir / "samples").rglob("*.png"))),
        "scored": bool(scores) and "error" not in scores,
    }


def dead_letters(broker_url: str) -> dict[str, int]:
    """Every dead-lettered message, counted by the queue it left and why (`x-death`)."""
    import asyncio

    import aio_pika

    from palomino.transport.broker import DEAD_QUEUE

    async def count() -> dict[str, int]:
        counts: dict[str, int] = {}
        connection = await aio_pika.connect(broker_url)
        async with connection:
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(DEAD_QUEUE, passive=True)
            except aio_pika.exceptions.ChannelClosed:
                return counts  # nothing was ever dead-lettered
            while (message := await queue.get(fail=False, no_ack=True)) is not None:
                death = (message.headers.get("x-death") or [{}])[0]
                key = f"{death.get('queue', '?')}: {death.get('reason', '?')}"
                counts[key] = counts.get(key, 0) + 1
        return counts

    return asyncio.run(count())


def orchestrator_counters(url: str) -> dict[str, float]:
    """The orchestrator's counters (its /metrics) since its last start: messages refused as
    untrusted, stale owners told to stop, results scored twice..."""
    import httpx

    counters: dict[str, float] = {}
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return counters  # down at the end: the verdict says so elsewhere
    for line in text.splitlines():
        if line.startswith("palomino_orchestrator_total{"):
            name = line.split('name="', 1)[1].split('"', 1)[0]
            counters[name] = float(line.rsplit(" ", 1)[1])
    return counters


def waiting(servers: Servers) -> dict[str, int]:
    """Queues that still hold messages at the end (one growing without bound shows here)."""
    listed = servers.rabbitmq.ctl("-q", "list_queues", "name", "messages", check=False).stdout
    pairs = (line.split() for line in listed.splitlines())
    return {name: int(n) for name, n in (p for p in pairs if len(p) == 2 and p[1].isdigit()) if int(n)}


def memory(fleet: Fleet, origin: float) -> dict[str, dict[str, Any]]:
    """Each long-lived service's newest life: MiB at its start, when an experiment had first
    finished and been scored in it, and at the end; growth is end against that middle moment (a
    scorer or cell loads torch and data on its first job, which is not growth)."""
    newest: dict[str, Instance] = {}
    for instance in fleet.instances:
        newest[instance.name] = instance
    out = {}
    for name, instance in sorted(newest.items()):
        middle = instance.rss.get("first_scored")
        out[name] = {**instance.rss, "lived_s": round(time.time() - instance.started),
                     "growth": round(instance.rss["end"] / middle, 2) if middle and "end" in instance.rss else None,
                     "started_t": round(instance.started - origin, 1), "series": instance.rss_series}  # fmt: skip
    return out


def verdict(soak: Soak, fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    from palomino.services.common.client import OrchestratorClient

    client = OrchestratorClient(fleet.url, timeout=30)
    experiments = []
    for experiment in soak.experiments:
        summary = client.experiment(experiment["id"])
        entry = {"id": experiment["id"], "kind": experiment["kind"], "state": summary["state"],
                 "reason": summary.get("reason", ""), "failures": len(summary.get("failures", [])),
                 "grid": f"{summary['rows']}×{summary['cols']}"}  # fmt: skip
        entry.update(judge_run(Path(summary["run_dir"]), summary, args.iterations))
        experiments.append(entry)
    restarts = [k["restart_s"] for k in soak.kills if k.get("restart_s") is not None]
    longest_restart = max(restarts, default=0.0)
    report: dict[str, Any] = {
        "seed": args.seed, "duration_s": args.duration, "period_s": args.period,
        "kills": soak.kills, "experiments": experiments,
        "longest_restart_s": longest_restart,
        "longest_stall_s": round(soak.longest_stall, 1),
        "stall_at_s": round(soak.stall_at - soak.started, 1) if soak.stall_at else None,
        "faults": args.faults,
        "orchestrator_counters": orchestrator_counters(fleet.url),
        "dead_letters": dead_letters(fleet.servers.broker_url),
        "queues_waiting": waiting(fleet.servers),
        "memory_mib": memory(fleet, soak.started),
    }  # fmt: skip
    problems = []
    for e in experiments:
        if e["state"] != "finished":
            problems.append(f"{e['id']} {e['state']}: {e['reason']}")
        for what in ("records_twice", "records_missing"):
            if e[what]:
                problems.append(f"{e['id']}: {e[what]} {what.replace('_', ' ')}")
        if e["checkpoints_corrupt"]:
            problems.append(f"{e['id']}: checkpoints that do not load: {e['checkpoints_corrupt']}")
        if e["state"] == "finished" and not (e["result"] and e["samples"] and e["scored"]):
            problems.append(f"{e['id']}: result {e['result']}, samples {e['samples']}, scored {e['scored']}")
    if any(k.get("restart_s") is None for k in soak.kills):
        problems.append("a killed service did not come back (see kills)")
    # Twice the longest restart, and never under two heartbeat TTLs: with no kill (a soak for memory,
    # --period past --duration) the restart is 0 s, and an experiment's own start is a gap of seconds.
    if soak.longest_stall > max(2 * longest_restart, 2 * args.ttl):
        problems.append(
            f"a stall of {soak.longest_stall:.0f} s, over twice the longest restart ({longest_restart} s)"
            f" and two heartbeat TTLs ({2 * args.ttl:g} s)"
        )
    for name, m in report["memory_mib"].items():
        if m["growth"] is not None and m["growth"] > 2:
            problems.append(f"{name}'s memory grew {m['growth']}×")
    if not experiments:
        problems.append("no experiment was submitted")
    report["problems"] = problems
    report["ok"] = not problems
    return report


def print_verdict(report: dict[str, Any]) -> None:
    print(
        f"\nchaos soak, seed {report['seed']}: {report['duration_s']} s, a fault every {report['period_s']} s ({', '.join(report.get('faults', ['kill']))})"
    )
    print("\n| t (s) | fault | service | back in (s) | cells lost |\n| ---: | --- | --- | ---: | ---: |")
    for k in report["kills"]:
        print(f"| {k['t']} | {k.get('fault', 'kill')} | {k['service']} | {k.get('restart_s')} | {k.get('cells_lost', '')} |")  # fmt: skip
    print("\n| experiment | state | grid | epochs | records | twice | missing | checkpoints (corrupt) | result | samples | scored |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |")
    for e in report["experiments"]:
        print(f"| {e['kind']} {e['id']} | {e['state']} | {e['grid']} | {e['epochs']} | {e['records']} | "
              f"{e['records_twice']} | {e['records_missing']} | {e['checkpoints_loaded']} ({len(e['checkpoints_corrupt'])}) | "
              f"{e['result']} | {e['samples']} | {e['scored']} |")  # fmt: skip
    print(f"\norchestrator counters (since its last start): {report['orchestrator_counters']}")
    print(f"longest stall {report['longest_stall_s']} s (at {report['stall_at_s']} s); longest restart {report['longest_restart_s']} s")  # fmt: skip
    print(
        f"dead-lettered: {report['dead_letters'] or 'none'}; waiting at the end: {report['queues_waiting'] or 'none'}"
    )
    print(
        "\n| service | MiB at start | after first scored run | at end | growth |\n| --- | ---: | ---: | ---: | ---: |"
    )
    for name, m in report["memory_mib"].items():
        print(f"| {name} | {m.get('start')} | {m.get('first_scored')} | {m.get('end')} | {m['growth']} |")
    print("\nverdict: " + ("ok" if report["ok"] else "FAILED\n- " + "\n- ".join(report["problems"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800, help="seconds of kills (then the last experiment finishes)")  # fmt: skip
    parser.add_argument("--period", type=float, default=120, help="seconds between kills")
    parser.add_argument("--seed", type=int, default=1, help="draws the kill schedule")
    parser.add_argument("--kinds", type=lambda text: text.split(","), default=list(KINDS), help=f"what may be killed, of {','.join(KINDS)}")  # fmt: skip
    parser.add_argument("--faults", type=lambda text: text.split(","), default=["kill"], help=f"what befalls the service drawn each period, of {','.join(FAULTS)} (drawn in turn, seeded)")  # fmt: skip
    parser.add_argument("--partition-seconds", type=float, default=30.0, help="how long a partition lasts")
    parser.add_argument("--pause-seconds", type=float, default=0.0, help="how long a pause lasts (default: three heartbeat TTLs)")  # fmt: skip
    parser.add_argument("--blocks", type=int, default=3, help="cell workers with several cells")
    parser.add_argument("--cells-per-block", type=int, default=4)
    parser.add_argument("--singles", type=int, default=6, help="cell workers with one cell")
    parser.add_argument("--iterations", type=int, default=100, help="of each experiment")
    parser.add_argument("--batches", type=int, default=50, help="batches per iteration")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=5.0, help="heartbeat TTL, seconds")
    parser.add_argument("--drain", type=float, default=900, help="seconds the last experiment may take after the kills")  # fmt: skip
    parser.add_argument("--out", type=Path, help="the verdict as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the servers' and runs' folder")
    args = parser.parse_args()
    if unknown := set(args.kinds) - set(KINDS):
        parser.error(f"--kinds: {', '.join(sorted(unknown))} is none of {', '.join(KINDS)}")
    if unknown := set(args.faults) - set(FAULTS):
        parser.error(f"--faults: {', '.join(sorted(unknown))} is none of {', '.join(FAULTS)}")
    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    servers = Servers(work / "servers").start()
    fleet = Fleet(work, servers, args)
    soak = Soak()
    monitor = Monitor(fleet, soak)
    try:
        fleet.start_all()
        soak.started = time.time()
        monitor.start()
        Driver(fleet, soak, monitor, args).run()
        monitor.halt.set()
        monitor.sample()
        report = verdict(soak, fleet, args)
    finally:
        monitor.halt.set()
        fleet.stop()
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print_verdict(report)
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
