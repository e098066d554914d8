"""The control plane at cluster scale (issue 35): N simulated cell workers against the real
orchestrator, over a RabbitMQ and a Redis of its own (throwaway, as the tests start them).

    python benchmarks/control_plane.py --workers 64                       # ~1 min; the slow test's form
    python benchmarks/control_plane.py --workers 256 --period 2
    python benchmarks/control_plane.py --workers 1024 --processes 4 --period 5
    python benchmarks/control_plane.py --workers 1024 --cells-per-worker 4 --period 5   # 4,096 slots

A simulated worker is the real `palomino cell` worker (services/cell/worker.py: its registrations,
heartbeats, control messages, Done re-sends) whose block trains nothing: every `--period` seconds
each of its cells publishes a snapshot of `--snapshot-bytes` to the snapshot exchange (its
neighbours' queues and its last-value queue take it, and it consumes its neighbours'), sends
the iteration's metrics record (the shape a real cell sends), a checkpoint every
`training.checkpoint_every` iterations (`--checkpoint-bytes`) and, at the end, its Done with a real
mixture. Each simulated worker has its own connection, as a deployment's workers would; they run
`--processes` to an OS process. `--kill` of the workers (default 10 %) live in a process of their
own that is SIGKILLed a third of the way through, with as many spares standing by.

It prints and writes (`--out`, JSON) what issue 35 asks of the control plane: submit to all
assigned, the orchestrator's CPU idle and while training, messages and bytes a second sent to
the broker, death to replacement, epochs for the one mass failure, iterations recorded (each
once, none missing), Dones taken, and whether the experiment finished.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# ---- the simulated workers (the child processes) ---------------------------------------------


@dataclass
class Plan:
    """What every simulated cell sends, read from the driver's plan folder."""

    folder: Path
    period: float
    snapshot_bytes: int
    checkpoint_bytes: int
    fail_at: int = 0  # a fault to test the harness with: the first cell reports it cannot go on here
    record: dict[str, Any] = field(default_factory=dict)
    done: dict[str, Any] = field(default_factory=dict)
    mixture: bytes = b""
    sent: dict[str, list[int]] = field(default_factory=dict)  # kind → [messages, bytes]

    @classmethod
    def read(cls, folder: Path) -> Plan:
        settings = json.loads((folder / "plan.json").read_text())
        plan = cls(
            folder, settings["period"], settings["snapshot_bytes"], settings["checkpoint_bytes"], settings["fail_at"]
        )
        plan.record, plan.done = settings["record"], settings["done"]
        plan.mixture = (folder / "mixture.safetensors").read_bytes()
        return plan

    def count(self, kind: str, size: int) -> None:
        entry = self.sent.setdefault(kind, [0, 0])
        entry[0] += 1
        entry[1] += size

    def event(self, log: Any, **what: Any) -> None:
        log.write(json.dumps({"t": time.time(), **what}) + "\n")
        log.flush()


@dataclass
class SimulatedCell:
    coord: tuple[int, int]
    rows: int
    cols: int
    epoch: int
    iteration: int


class SimulatedBlock:
    """Stands where services/cell/block.py's Block does: the same messages, no training."""

    def __init__(self, links: Any, experiment: str, assigns: dict[str, tuple[Any, bytes]], plan: Plan, log: Any):
        self.links, self.experiment, self.assigns, self.plan, self.log = links, experiment, assigns, plan, log
        self.stop = asyncio.Event()
        self.cells: dict[str, SimulatedCell] = {}
        self.holds = set(assigns)

    @property
    def slots(self) -> list[str]:
        return list(self.assigns)

    async def report_failure(
        self, slot: str, reason: str, restore_failed: bool = False, transient: bool = False
    ) -> None:
        await self.links.outbox.failed(
            experiment=self.experiment, worker=slot, reason=reason, restore_failed=restore_failed, transient=transient
        )

    async def run(self) -> None:
        from palomino.transport.rabbitmq import RabbitSnapshotBus

        config = next(iter(self.assigns.values()))[0].config
        iterations = config["training"]["iterations"]
        for slot, (assign, _) in self.assigns.items():
            start = int((assign.restore_meta or {}).get("iteration", 0))
            self.cells[slot] = SimulatedCell(tuple(assign.coord), assign.rows, assign.cols, assign.epoch, start)
            self.links.set_ttl(slot, config["distributed"]["heartbeat_ttl"])
            self.plan.event(self.log, kind="assigned", slot=slot, coord=list(assign.coord), epoch=assign.epoch, start=start)  # fmt: skip
        settings = self.links.settings
        bus = RabbitSnapshotBus(
            settings.broker_url, self.experiment, key=settings.signer, connection=self.links.outbox.connection
        )
        await bus.connect()
        try:
            await self._bind(bus, config)
            while not self.stop.is_set() and any(c.iteration < iterations for c in self.cells.values()):
                await asyncio.sleep(self.plan.period)
                if self._apply_resizes():
                    await self._bind(bus, config)
                for slot, cell in list(self.cells.items()):
                    if self.plan.fail_at and cell.iteration == self.plan.fail_at and cell.coord == (0, 0):
                        await self.report_failure(slot, f"{slot}: a fault injected at iteration {cell.iteration}")
                        return
                    if cell.iteration < iterations:
                        await self._iterate(slot, cell, config, bus)
            if not self.stop.is_set():
                for slot, cell in self.cells.items():
                    await self._done(slot, cell)
        finally:
            await bus.close()

    async def _bind(self, bus: Any, config: dict[str, Any]) -> None:
        from palomino.grid import Topology

        kind = config["grid"]["neighbourhood"]
        wanted = set()
        for cell in self.cells.values():
            wanted.update(Topology(cell.rows, cell.cols, kind, cell.epoch).neighbours(cell.coord))
        await bus.bind(wanted, max((c.epoch for c in self.cells.values()), default=0))

    def _apply_resizes(self) -> bool:
        changed = False
        for slot in list(self.cells):
            resize = self.links.take_resize(slot)
            if resize is None or resize.experiment != self.experiment:
                continue
            changed = True
            if resize.coord is None:
                del self.cells[slot]
                self.holds.discard(slot)
                continue
            cell = self.cells[slot]
            cell.coord, cell.rows, cell.cols, cell.epoch = tuple(resize.coord), resize.rows, resize.cols, resize.epoch
            self.plan.event(self.log, kind="moved", slot=slot, coord=list(cell.coord), epoch=cell.epoch)
        return changed

    async def _iterate(self, slot: str, cell: SimulatedCell, config: dict[str, Any], bus: Any) -> None:
        import torch

        from palomino.runs.checkpoints import encode_tensors
        from palomino.wire import IndividualMeta, Snapshot, SnapshotHeader, encode_snapshot
        from palomino.wire.control_messages import Checkpoint, Metrics

        meta = IndividualMeta(learning_rate=2e-4, fitness=0.5, loss="minimax")
        header = SnapshotHeader(
            experiment=self.experiment, cell=cell.coord, epoch=cell.epoch, iteration=cell.iteration,
            generator=meta, discriminator=meta, mixture={f"{cell.coord[0]}-{cell.coord[1]}": 1.0}, score=0.1,
        )  # fmt: skip
        weights = torch.zeros(max(1, self.plan.snapshot_bytes // 4))
        await bus.publish(Snapshot(header, {"generator.net.w": weights}))
        self.plan.count("snapshot", len(encode_snapshot(Snapshot(header, {}))) + weights.numel() * 4)
        record = {**self.plan.record, "cell": list(cell.coord), "iteration": cell.iteration, "epoch": cell.epoch}
        await self._send(Metrics(experiment=self.experiment, worker=slot, record=record))
        cell.iteration += 1
        every = config["training"]["checkpoint_every"]
        if every and cell.iteration % every == 0:
            payload = encode_tensors({"state": torch.zeros(max(1, self.plan.checkpoint_bytes // 4))})
            meta = {"cell": list(cell.coord), "iteration": cell.iteration, "epoch": cell.epoch}
            message = Checkpoint(experiment=self.experiment, worker=slot, coord=cell.coord, iteration=cell.iteration, meta=meta)  # fmt: skip
            await self._send(message, payload)

    async def _send(self, message: Any, payload: bytes = b"") -> None:
        from palomino.wire.control_messages import encode_control

        if message.kind == "checkpoint":
            await self.links.outbox.checkpoint(message, payload)
        else:
            await self.links.outbox.send(message, payload)
        self.plan.count(message.kind, len(encode_control(message, payload)))

    async def _done(self, slot: str, cell: SimulatedCell) -> None:
        from palomino.wire.control_messages import Done

        name = f"{cell.coord[0]}-{cell.coord[1]}"
        description = {**self.plan.done["description"], "components": [name]}
        done = Done(
            experiment=self.experiment, worker=slot, coord=cell.coord, iteration=cell.iteration,
            score=self.plan.done["score"], components=[name], weights=[1.0], mixture=description,
        )  # fmt: skip
        await self.links.outbox.done(done, self.plan.mixture)
        self.plan.count("done", len(self.plan.mixture))
        self.plan.event(self.log, kind="done", slot=slot, coord=list(cell.coord))


async def simulate(prefix: str, workers: int, cells: int, plan_dir: Path, log: Any) -> None:
    """`workers` simulated workers of `cells` slots each, until SIGTERM (or SIGKILL); events to `log`."""
    from palomino.io import atomic_write
    from palomino.services.cell.worker import CellWorker
    from palomino.services.common.service_settings import ServiceSettings

    plan = Plan.read(plan_dir)

    class SimulatedWorker(CellWorker):
        def make_block(self, links: Any, experiment: str, assigns: dict[str, tuple[Any, bytes]]) -> Any:
            return SimulatedBlock(links, experiment, assigns, plan, log)

    settings = ServiceSettings()
    fleet = [SimulatedWorker(settings, f"{prefix}-{i}", cells=cells) for i in range(workers)]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [w.request_shutdown() for w in fleet])

    async def write_counts() -> None:
        while True:
            atomic_write(plan_dir / f"sent-{prefix}.json", json.dumps(plan.sent).encode())  # the driver reads it
            await asyncio.sleep(1.0)

    async def watch_lag() -> None:
        """This process's event loop late by over a second (its workers' heartbeats late with it): an event."""
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.5)
            if (late := loop.time() - before - 0.5) > 1.0:
                plan.event(log, kind="stall", process=prefix, seconds=round(late, 2))

    counting, watching = asyncio.create_task(write_counts()), asyncio.create_task(watch_lag())
    try:
        await asyncio.gather(*(w.run() for w in fleet))
    finally:
        counting.cancel()
        watching.cancel()
        atomic_write(plan_dir / f"sent-{prefix}.json", json.dumps(plan.sent).encode())


# ---- the driver -------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    from dashboard_load import proc_stat  # a sibling script: benchmarks/ is on the path

    stat = proc_stat(pid)
    if stat is None:
        raise ProcessLookupError(f"process {pid} is gone")
    return stat[1]


def prepare(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A real metrics record and a real final mixture, from one real cell of a tiny toy, and the
    experiment the simulated workers are assigned."""
    from palomino.coevolution import Cell
    from palomino.config import parse_config
    from palomino.data import load_dataset
    from palomino.grid import Coord, Topology
    from palomino.runs.finish import cell_result

    rows, cols = args.shape
    experiment = {
        "name": "control-plane",
        "grid": {"rows": rows, "cols": cols},
        "training": {"iterations": args.iterations, "checkpoint_every": args.checkpoint_every, "batch_size": 32,
                     "batches_per_iteration": 1, "fitness": {"sample_size": 32}, "mixture": {"score_samples": 64}},
        "data": {"name": "gaussian_ring", "size": 500},
        "network": {"name": "mlp", "hidden": 16},
        "scoring": {"final": False},  # no scorer here: the control plane only
        "distributed": {"heartbeat_ttl": args.ttl, "neighbour_timeout": 60.0, "start_timeout": 600.0,
                        "min_cells": rows * cols, "max_cells": rows * cols, "on_failure": "auto"},
    }  # fmt: skip
    config = parse_config({**experiment, "grid": {"rows": 1, "cols": 1}})
    dataset = load_dataset(config.data, 0)
    cell = Cell(Coord(0, 0), Topology(1, 1), config, dataset, experiment="template")
    record = cell.iterate({}).to_json()
    result = cell_result(cell, {}, dataset, "template")
    (folder / "mixture.safetensors").write_bytes(result.payload)
    plan = {
        "period": args.period,
        "snapshot_bytes": args.snapshot_bytes,
        "checkpoint_bytes": args.checkpoint_bytes,
        "fail_at": args.fail_at,
        "record": record,
        "done": {"score": result.score, "description": result.description},
    }
    (folder / "plan.json").write_text(json.dumps(plan))
    return experiment


def events(folder: Path) -> list[dict[str, Any]]:
    out = []
    for path in folder.glob("events-*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by the kill
    return sorted(out, key=lambda e: e["t"])


def sent(folder: Path) -> dict[str, list[int]]:
    total: dict[str, list[int]] = {}
    for path in folder.glob("sent-*.json"):
        for kind, (n, size) in json.loads(path.read_text()).items():
            entry = total.setdefault(kind, [0, 0])
            entry[0] += n
            entry[1] += size
    return total


def shape(cells: int) -> tuple[int, int]:
    rows = int(cells**0.5)
    while cells % rows:
        rows -= 1
    return rows, cells // rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx
    import yaml

    sys.path.insert(0, str(ROOT / "tests"))
    from servers import Servers, free_port

    from palomino.errors import PalominoError
    from palomino.services.common.client import OrchestratorClient

    slots = args.workers * args.cells_per_worker
    args.shape = shape(slots)
    victims = max(1, round(args.workers * args.kill)) if args.kill > 0 else 0
    work = Path(tempfile.mkdtemp(prefix="control-plane-", dir=args.work))
    processes: list[subprocess.Popen] = []

    def stop(signum: int, frame: Any) -> None:  # SIGTERM/SIGINT: `finally` below stops all it started
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    servers = Servers(work / "servers")
    experiment_id = ""
    report: dict[str, Any] = {"workers": args.workers, "slots": slots, "grid": "×".join(map(str, args.shape))}
    try:
        servers.start()  # inside: a signal while they start still stops what started
        port = free_port()
        env = {**os.environ, "PALOMINO_BROKER_URL": servers.broker_url, "PALOMINO_REDIS_URL": servers.redis_url,
               "PALOMINO_NAMESPACE": f"bench{port}", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
        os.environ.update(env)
        plan = work / "plan"
        plan.mkdir()
        experiment = prepare(plan, args)
        logs = open(work / "orchestrator.log", "wb")
        orchestrator = subprocess.Popen(
            [sys.executable, "-m", "palomino", "orchestrator", "--runs", str(work / "runs"), "--port", str(port)],
            stdout=logs, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        processes.append(orchestrator)
        client = OrchestratorClient(f"http://127.0.0.1:{port}", timeout=30)
        wait(lambda: client.healthy(), 60, "the orchestrator to start")
        by_name: dict[str, subprocess.Popen] = {}

        def start(name: str, count: int) -> None:
            command = [sys.executable, __file__, "--simulate", name, "--workers", str(count),
                       "--cells-per-worker", str(args.cells_per_worker), "--plan", str(plan)]  # fmt: skip
            out = open(work / f"{name}.log", "wb")
            by_name[name] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
            processes.append(by_name[name])

        # The survivors split over --processes, the victims in one of their own; the spares come
        # once the grid is laid out (the orchestrator would take them as any other idle worker).
        for i, count in enumerate(split(args.workers - victims, args.processes)):
            start(f"p{i}", count)
        if victims:
            start("victims", victims)
        health = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

        def alive() -> int:
            return health.get("/healthz").json().get("workers_alive", 0)

        def ended() -> dict[str, Any] | None:
            """The experiment, once it failed or was stopped: no wait outlasts that."""
            now = client.experiment(experiment_id) if experiment_id else {}
            return now if now.get("state") in ("failed", "stopped") else None

        try:
            started = time.monotonic()
            wait(lambda: alive() >= slots, 600, f"{slots} live slots")
            report["all_alive_s"] = round(time.monotonic() - started, 1)
            time.sleep(3.0)  # every idle slot registers at least once (every 2 s)
            idle = measure_cpu(orchestrator.pid, args.window)
            report["orchestrator_cpu_idle_pct"] = idle
            submitted = time.time()
            summary = client.submit(yaml.safe_dump(experiment))
            experiment_id = summary["id"]
            wait(lambda: assigned(plan, slots) >= slots, 600, "every cell assigned", ended)
            first = [e for e in events(plan) if e["kind"] == "assigned"]
            report["submit_to_all_assigned_s"] = round(sorted(e["t"] for e in first)[slots - 1] - submitted, 2)
            if victims:
                start("spares", victims)
                wait(lambda: alive() >= slots + victims * args.cells_per_worker, 600, "the spares", ended)
            time.sleep(min(10.0, args.period * 2))  # past the start
            before = sent(plan)
            window_start = time.monotonic()
            report["orchestrator_cpu_training_pct"] = measure_cpu(orchestrator.pid, args.window)
            report["broker_connections"] = broker_connections(servers)
            after, seconds = sent(plan), time.monotonic() - window_start
            report["messages_per_s"] = round(sum(after[k][0] - before.get(k, [0, 0])[0] for k in after) / seconds, 1)
            report["bytes_per_s"] = round(sum(after[k][1] - before.get(k, [0, 0])[1] for k in after) / seconds)
            report["sent_by_kind_per_s"] = {
                k: round((after[k][0] - before.get(k, [0, 0])[0]) / seconds, 1) for k in sorted(after)
            }
            if victims:
                kill_after = slots * args.iterations // 3
                wait(
                    lambda: client.experiment(experiment_id)["records"] >= kill_after,
                    900,
                    "a third of the records",
                    ended,
                )
                now = client.experiment(experiment_id)
                if now["state"] != "running" or now["records"] > slots * args.iterations * 2 // 3:
                    raise TimeoutError("the run was too short to kill workers in its middle: raise --iterations")
                epoch_before = now["epoch"]
                victim_cells = {tuple(e["coord"]) for e in events(plan) if e["kind"] == "assigned" and e["slot"].startswith("victims")}  # fmt: skip
                killed_at = time.time()
                by_name["victims"].send_signal(signal.SIGKILL)
                by_name["victims"].wait()

                def replaced() -> list[dict[str, Any]]:
                    return [e for e in events(plan) if e["kind"] == "assigned" and e["t"] > killed_at and tuple(e["coord"]) in victim_cells]  # fmt: skip

                wait(lambda: {tuple(e["coord"]) for e in replaced()} >= victim_cells, args.ttl + 120, "the lost cells replaced", ended)  # fmt: skip
                report["killed_workers"] = victims
                report["death_to_replacement_s"] = round(max(e["t"] for e in replaced()) - killed_at, 2)
                report["ttl_s"] = args.ttl
                time.sleep(args.ttl + 2)
                report["epochs_for_the_failure"] = client.experiment(experiment_id)["epoch"] - epoch_before
            final = client.wait(experiment_id, timeout=args.finish_timeout, period=2.0)
            report["state"] = final["state"]
            report["reason"] = final.get("reason", "")
            report.update(check_records(Path(final["run_dir"]), final, args.iterations))
            report["dones_taken"] = len(list((Path(final["run_dir"]) / "result" / "cells").glob("*/mixture.json")))
            report["orchestrator_cpu_total_s"] = round(cpu_seconds(orchestrator.pid), 1)
        except Ended as error:  # its verdict, at once
            report["error"] = str(error)
            report["state"], report["reason"] = error.summary["state"], error.summary.get("reason", "")
        except (TimeoutError, PalominoError, httpx.HTTPError) as error:  # what was measured so far still counts
            report["error"] = str(error)
            if experiment_id:
                report["at_error"] = {k: client.experiment(experiment_id)[k] for k in ("state", "records", "epoch")}
        report.update(connects(work))
        stalls: dict[str, float] = {}
        for event in events(plan):
            if event["kind"] == "stall":
                stalls[event["process"]] = max(stalls.get(event["process"], 0.0), event["seconds"])
        report["event_loop_stalls_s"] = stalls  # the longest late wake-up of each process, where over 1 s
        return report
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        servers.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept: {work}")


def broker_connections(servers: Any) -> int:
    """Connections open on the harness's own broker now (one a worker, since a worker's snapshot bus
    and score queue share its control connection; the orchestrator's few)."""
    listed = servers.rabbitmq.ctl("list_connections", "-q", "--no-table-headers", "pid", timeout=60)
    return len([line for line in listed.stdout.splitlines() if line.strip()])


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def assigned(plan: Path, slots: int) -> int:
    return len({tuple(e["coord"]) for e in events(plan) if e["kind"] == "assigned"})


def measure_cpu(pid: int, seconds: float) -> float:
    start, wall = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return round(100 * (cpu_seconds(pid) - start) / (time.monotonic() - wall), 1)


class Ended(Exception):
    def __init__(self, summary: dict[str, Any], what: str) -> None:
        super().__init__(f"the experiment {summary['state']} while waiting for {what}: {summary.get('reason', '')}")
        self.summary = summary


def connects(work: Path) -> dict[str, int]:
    """Broker connects the processes tried again (a storm) and gave up on, from their logs."""
    logs = [path.read_text(errors="replace") for path in work.glob("*.log")]
    return {
        "connects_retried": sum(text.count("trying again for up to") for text in logs),
        "connects_failed": sum(text.count("cannot connect to RabbitMQ") for text in logs),
    }


def wait(condition: Any, timeout: float, what: str, ended: Any = None) -> None:
    """Until `condition()`; TimeoutError past `timeout`, Ended as soon as `ended()` returns the experiment."""
    import httpx

    from palomino.errors import PalominoError

    deadline, last = time.monotonic() + timeout, ""
    while True:
        try:
            if condition():
                return
            if ended is not None and (summary := ended()):
                raise Ended(summary, what)
        except (httpx.HTTPError, PalominoError, OSError, ValueError, KeyError) as error:  # still starting: ask again
            last = f" (last: {error})"
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}{last}")
        time.sleep(0.25)


def check_records(run_dir: Path, summary: dict[str, Any], iterations: int) -> dict[str, Any]:
    """Every (cell, iteration) of the final layout recorded exactly once."""
    keys = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        keys.append((f"{record['cell'][0]}-{record['cell'][1]}", record["iteration"]))
    cells = list(summary["cells"])
    expected = {(c, i) for c in cells for i in range(iterations)}
    return {
        "records": len(keys),
        "records_twice": len(keys) - len(set(keys)),
        "records_missing": len(expected - set(keys)),
    }


def print_report(report: dict[str, Any]) -> None:
    width = max(map(len, report))
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=64, help="simulated worker processes' workers (cells: × --cells-per-worker)")  # fmt: skip
    parser.add_argument("--cells-per-worker", type=int, default=1)
    parser.add_argument("--processes", type=int, default=2, help="OS processes the surviving workers run in")
    parser.add_argument("--period", type=float, default=1.0, help="seconds a simulated iteration")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--snapshot-bytes", type=int, default=16 * 1024)
    parser.add_argument("--checkpoint-bytes", type=int, default=64 * 1024)
    parser.add_argument("--kill", type=float, default=0.1, help="share of workers SIGKILLed at once, a third of the way")  # fmt: skip
    parser.add_argument("--ttl", type=float, default=5.0, help="distributed.heartbeat_ttl")
    parser.add_argument("--window", type=float, default=10.0, help="seconds each CPU and rate measurement takes")
    parser.add_argument("--finish-timeout", type=float, default=900.0, help="seconds the run may take after the kill")  # fmt: skip
    parser.add_argument("--out", type=Path, help="write the report here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs, run directory)")
    parser.add_argument("--work", type=Path, help="make the working folder in this folder (default: the temp dir)")
    parser.add_argument("--fail-at", type=int, default=0, help="cell 0-0 reports it cannot go on at this iteration (0: never)")  # fmt: skip
    parser.add_argument("--simulate", help=argparse.SUPPRESS)  # a child: this process's name
    parser.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simulate:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        with open(args.plan / f"events-{args.simulate}.jsonl", "a") as log:
            asyncio.run(simulate(args.simulate, args.workers, args.cells_per_worker, args.plan, log))
        return
    try:
        report = run(args)
    except KeyboardInterrupt as signal_name:
        print(f"stopped ({signal_name}): every process and server it started is stopped", file=sys.stderr)
        sys.exit(130)
    print_report(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    if "error" in report or report.get("state") != "finished":
        sys.exit(1)


if __name__ == "__main__":
    main()
