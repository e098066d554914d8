"""`palomino orchestrator`: experiments, worker registry, liveness, layout, failures, results.

It owns the run directories (same layout as `palomino train`), imports no torch, and talks
to cells only through the control plane; liveness comes from Redis heartbeats.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiormq.exceptions import AMQPError
from palomino.services.common.settings import ServiceSettings
from palomino.services.orchestrator.experiment_store import read_collected, read_states, write_collected, write_state

from palomino.config import ExperimentConfig
from palomino.errors import PalominoError
from palomino.grid import Coord, Topology, parse_coord, rectangle, relayout
from palomino.grid.partition import Partition, class_rectangle, partition_grid
from palomino.runs.checkpoints import newest_valid, write_checkpoint_bytes
from palomino.runs.directory import LineIndex, RunDirectory, finite_json
from palomino.runs.result import CellResult, grid_components, save_encoded, write_ensemble, write_result
from palomino.transport.control import ControlChannel, cell_address, orchestrator_address
from palomino.transport.rabbitmq import forget_published, newest_published
from palomino.transport.redis_liveness import RedisLiveness, liveness_prefix
from palomino.transport.score_queue import RESULTS_QUEUE, ScoreQueue, score_queue_name
from palomino.wire import frame
from palomino.wire.control import Assign, Checkpoint, Done, Failed, Metrics, Register, Resize, Samples, Stop
from palomino.wire.score import ScoreJob, ScoreResult
from palomino.wire.snapshot import SnapshotHeader

log = logging.getLogger(__name__)
State = Literal["waiting", "running", "finished", "failed", "stopped"]
TICK = 0.5
MAX_BACKOFF = 5.0  # seconds between liveness queries while Redis refuses them
BROKER_CALL_TIMEOUT = 10.0  # seconds for a broker call made under the lock


@dataclass
class Worker:
    id: str
    host: str = ""
    device: str = "cpu"
    last_seen: float = field(default_factory=time.monotonic)  # last time Redis showed its heartbeat
    experiment: str | None = None
    coord: Coord | None = None
    idle: bool = True  # said so by its last Register; a freed worker is no spare until it does

    def free(self) -> None:
        self.experiment, self.coord = None, None


def adopt_ensemble(run: RunDirectory, result: ScoreResult) -> None:
    """result/grid/ (every cell's generator) with the weights a scorer optimised becomes result/.
    The weights are checked against the components: a forged or stale result changes nothing."""
    summary = result.ensemble or {}
    folder = run.result_dir / "grid"
    description = json.loads((folder / "mixture.json").read_text())
    weights = summary["weights"]
    if (
        not isinstance(weights, list)
        or len(weights) != len(description["components"])
        or summary.get("cells") != description["components"]
        or not all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in weights)
        or sum(weights) <= 0
    ):
        raise ValueError(
            f"weights {str(weights)[:80]} do not fit the grid's {len(description['components'])} components"
        )
    summary = {**summary, "weights": [w / sum(weights) for w in weights]}
    png = base64.b64decode(result.samples_png) if result.samples_png else b""
    write_ensemble(run, (folder / "mixture.safetensors").read_bytes(), description, summary, png)


@dataclass
class Experiment:
    id: str
    config: ExperimentConfig
    run: RunDirectory
    state: State = "waiting"
    reason: str = ""
    created: float = field(default_factory=time.monotonic)
    topology: Topology | None = None
    cells: dict[Coord, str] = field(default_factory=dict)
    done: dict[Coord, CellResult] = field(default_factory=dict)
    recorded: set[tuple[str, int]] = field(default_factory=set)  # (cell, iteration) in metrics.jsonl
    failures: list[dict[str, Any]] = field(default_factory=list)
    laid_out: set[Coord] = field(default_factory=set)  # every coordinate of every layout (their last-value queues)
    partition: Partition | None = None  # a partitioned run's class sub-grids (cell ids of `topology`'s space)
    # The epoch each coordinate's history began (a shrink gave it another worker): older snapshots
    # and checkpoints of it are a previous occupant's, never restored.
    history_since: dict[Coord, int] = field(default_factory=dict)
    # worker → the coordinate the last shrink moved it from: its Done may already be on the way
    # from there (it finished as the Resize was sent), and then it is the result of where it went.
    moved_from: dict[str, Coord] = field(default_factory=dict)
    # Restoring a coordinate: which saved state went out last, and which did not load in a cell.
    restoring: dict[Coord, tuple[str, int]] = field(default_factory=dict)
    unusable: dict[Coord, set[tuple[str, int]]] = field(default_factory=dict)
    collecting: bool = False  # every cell is done and result/ is being written
    client: str = ""  # who submitted it (the API's peer address): submissions are capped per client
    ended_at: float | None = None  # wall time it ended: listed until the retention has passed
    metrics_index: LineIndex | None = None  # for the API's metrics pages (made on first use)

    @property
    def finished(self) -> bool:
        return self.state in ("finished", "failed", "stopped")

    def summary(self, alive: set[str] | None = None) -> dict[str, Any]:
        topology = self.topology
        return {
            "id": self.id,
            "name": self.config.name,
            "state": self.state,
            "reason": self.reason,
            "run_dir": str(self.run.path),
            "epoch": topology.epoch if topology else None,
            "rows": topology.rows if topology else None,
            "cols": topology.cols if topology else None,
            "iterations": self.config.training.iterations,
            "records": len(self.recorded),
            "cells": {str(c): w for c, w in sorted(self.cells.items())},
            "liveness": {w: (alive is None or w in alive) for w in self.cells.values()},
            "failures": self.failures,
            **({"classes": self.partition.describe()} if self.partition else {}),
        }

    def shape_of(self, coord: Coord) -> tuple[int, int]:
        """rows×cols an Assign/Resize tells the cell at `coord`: its class's sub-grid, else the grid."""
        if self.partition is not None:
            grid = self.partition.grid_of(coord)
            return grid.rows, grid.cols
        assert self.topology is not None
        return self.topology.rows, self.topology.cols

    def record_layout(self) -> None:
        assert self.topology is not None
        classes = self.partition.describe() if self.partition else None
        self.run.append_topology(self.topology, {str(c): w for c, w in self.cells.items()}, classes)
        self.persist()

    def persist(self) -> None:
        """orchestrator.json in the run directory: what a restarted orchestrator re-adopts."""
        topology = self.topology
        state = {
            "state": self.state, "reason": self.reason, "partition": None if self.partition is None else self.partition.to_json(),
            "topology": None if topology is None else {"rows": topology.rows, "cols": topology.cols, "kind": topology.kind, "epoch": topology.epoch},
            "cells": {str(c): w for c, w in sorted(self.cells.items())},
            "done": sorted(str(c) for c in self.done),
            "failures": self.failures,
            "laid_out": sorted(str(c) for c in self.laid_out),
            "history_since": {str(c): e for c, e in self.history_since.items()},
            "ended_at": self.ended_at,
        }  # fmt: skip
        try:
            write_state(self.run.path, state)
        except OSError as error:
            log.error("experiment %s: its state cannot be saved (%s); a restart would lose it", self.id, error)

    @classmethod
    def readopt(cls, run_dir: Path, saved: dict[str, Any]) -> Experiment:
        """The experiment as a killed orchestrator left it (ValueError, OSError, KeyError: not re-adoptable)."""
        run = RunDirectory(run_dir)
        experiment = cls(run.experiment, run.load_config(), run, state=saved["state"], reason=saved.get("reason", ""))
        experiment.ended_at = saved.get("ended_at")
        if experiment.finished and experiment.ended_at is None:  # saved before ends were timed
            experiment.ended_at = (Path(run_dir) / "orchestrator.json").stat().st_mtime
        if saved.get("topology"):
            t = saved["topology"]
            experiment.topology = Topology(int(t["rows"]), int(t["cols"]), t["kind"], epoch=int(t["epoch"]))
        experiment.cells = {parse_coord(c): str(w) for c, w in saved.get("cells", {}).items()}
        experiment.failures = list(saved.get("failures", []))
        experiment.laid_out = {parse_coord(c) for c in saved.get("laid_out", [])}
        experiment.history_since = {parse_coord(c): int(e) for c, e in saved.get("history_since", {}).items()}
        collected = read_collected(run.path, list(saved.get("done", [])))
        experiment.done = {parse_coord(c): result for c, result in collected.items()}
        experiment.recorded = {
            ("-".join(map(str, r["cell"])), int(r["iteration"]))
            for r in run.metrics()
            if "cell" in r and "iteration" in r
        }
        if saved.get("partition"):
            experiment.partition = Partition.from_json(saved["partition"])
        return experiment


def class_layout(config: ExperimentConfig, workers: int) -> Partition | None:
    """A partitioned run's sub-grids for `workers` workers: grid.per_class each when all are
    there, else the workers shared out evenly over the classes (None: fewer than one per class)."""
    labels = sorted(config.data.labels or ())
    per_rows, per_cols = config.grid.per_class_shape
    partition = partition_grid(labels, (per_rows, per_cols), config.grid.neighbourhood)
    if workers >= partition.size:
        return partition
    if workers < len(labels):
        return None
    share = [workers // len(labels) + (k < workers % len(labels)) for k in range(len(labels))]
    grids = tuple(g.resized(*class_rectangle(n, per_rows), 0) for g, n in zip(partition.grids, share))
    return Partition(grids, (per_rows, per_cols))


def record_score(folder: Path, result: ScoreResult) -> None:
    """Merge one result into scores.json, laid out as `palomino score` writes it ("best", "cells"),
    plus "periodic": {"r-c@iteration": ...} for `scoring.every`. A failed job's entry is {"error": ...}."""
    import json

    from palomino.runs.checkpoints import atomic_write

    path = folder / "scores.json"
    try:
        scores = json.loads(path.read_text())
    except (OSError, ValueError):
        scores = {}
    scores.setdefault("run", result.experiment)
    entry = {"scorer": result.scorer, **({"error": result.error} if result.error else result.scores)}
    if result.iteration is None and result.target == "best":
        scores["best"] = entry
    elif result.iteration is None:
        scores.setdefault("cells", {})[result.target] = entry
    else:
        scores.setdefault("periodic", {})[f"{result.target}@{result.iteration}"] = {
            "iteration": result.iteration,
            **entry,
        }
    atomic_write(path, json.dumps(finite_json(scores), indent=2, allow_nan=False).encode())


async def preflight(settings: ServiceSettings) -> None:
    """Fail fast, with the URL named, when the broker or Redis cannot be reached."""
    from palomino.transport.rabbitmq import connect

    connection = await connect(settings.broker_url)
    await connection.close()
    liveness = RedisLiveness(settings.redis_url, liveness_prefix(settings.namespace))
    try:
        await liveness.alive()
    finally:
        await liveness.close()


class TooBusy(PalominoError):
    """A client has as many experiments waiting or running as it may."""


class Orchestrator:
    def __init__(self, settings: ServiceSettings, runs: Path) -> None:
        self.settings, self.runs = settings, Path(runs)
        self.experiments: dict[str, Experiment] = {}
        self.workers: dict[str, Worker] = {}
        self.alive: set[str] = set()
        self.counters = {"control_messages": 0, "metrics_records": 0, "failures_handled": 0, "untrusted_messages": 0}
        self._redis_ok = True
        self._lock = asyncio.Lock()

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.runs.mkdir(parents=True, exist_ok=True)
        namespace = self.settings.namespace
        self.control = await ControlChannel(
            self.settings.broker_url, orchestrator_address(namespace), key=self.settings.signer
        ).connect()
        self.liveness = RedisLiveness(self.settings.redis_url, liveness_prefix(self.settings.namespace))
        self._readopt()  # before the first message: Done and Metrics waiting in the queue must find their experiment
        await self.control.listen(self._on_control)
        self.scoring = await ScoreQueue(self.settings.broker_url, namespace, key=self.settings.signer).connect()
        await self.scoring.follow_results(score_queue_name(namespace, RESULTS_QUEUE), self._on_score)
        self._task = asyncio.create_task(self._supervise())
        for experiment in list(self.experiments.values()):  # every cell reported before the restart
            async with self._lock:
                await self._maybe_finish(experiment)

    def _readopt(self) -> None:
        """Experiments a previous orchestrator kept under `runs`, with the workers of the running ones
        (still training: their heartbeats decide, as before the restart)."""
        for run_dir, saved in read_states(self.runs):
            try:
                experiment = Experiment.readopt(run_dir, saved)
            except (OSError, ValueError, KeyError, TypeError, PalominoError) as error:
                log.warning("%s: not re-adopted (%s)", run_dir, error)
                continue
            self.experiments[experiment.id] = experiment
            if experiment.state != "running":
                continue
            for coord, worker in experiment.cells.items():
                if coord not in experiment.done:
                    self.workers[worker] = Worker(worker, experiment=experiment.id, coord=coord, idle=False)
            log.info("experiment %s re-adopted: running on %d×%d (epoch %d), %d of %d cells done", experiment.id,
                     experiment.topology.rows, experiment.topology.cols, experiment.topology.epoch, len(experiment.done), len(experiment.cells))  # fmt: skip

    async def close(self) -> None:
        self._task.cancel()
        await self.control.close()
        await self.scoring.close()
        await self.liveness.close()

    # ---- experiments ----------------------------------------------------------------------

    async def submit(self, config: ExperimentConfig, client: str = "") -> Experiment:
        """A new experiment, unless `client` already has max_active_per_client waiting or running (TooBusy)."""
        active = sum(1 for e in self.experiments.values() if e.client == client and not e.finished)
        if active >= self.settings.max_active_per_client:
            raise TooBusy(
                f"{active} experiments of yours are waiting or running (PALOMINO_MAX_ACTIVE_PER_CLIENT is {self.settings.max_active_per_client}); wait for one or delete it"
            )
        run = RunDirectory.create(self.runs, config)
        experiment = Experiment(run.experiment, config, run, client=client)
        self.experiments[experiment.id] = experiment
        await asyncio.to_thread(experiment.persist)
        log.info("experiment %s submitted: waiting for %d–%d workers", experiment.id, *config.cell_bounds)
        await self._event(experiment, "state", {"state": "waiting"})
        return experiment

    async def cancel(self, experiment: Experiment, reason: str = "deleted") -> None:
        async with self._lock:
            if not experiment.finished:
                await self._end(experiment, "stopped", reason)

    def _working_on(self, experiment: Experiment) -> list[str]:
        """Workers still training a cell of `experiment` (not done, not moved on)."""
        return [
            w
            for c, w in experiment.cells.items()
            if c not in experiment.done and w in self.workers and self.workers[w].experiment == experiment.id
        ]

    async def _end(self, experiment: Experiment, state: State, reason: str = "") -> None:
        experiment.state, experiment.reason, experiment.ended_at = state, reason, time.time()
        await asyncio.to_thread(experiment.persist)
        for worker in self._working_on(experiment):
            await self.control.send(cell_address(worker), Stop(experiment=experiment.id, reason=reason or state))
            self.workers[worker].free()
        log.info("experiment %s %s%s", experiment.id, state, f": {reason}" if reason else "")
        await self._event(experiment, "state", {"state": state, "reason": reason})
        await self._forget_all_published(experiment)

    # ---- control messages -----------------------------------------------------------------

    async def _on_control(self, message: Any, payload: bytes) -> None:
        self.counters["control_messages"] += 1
        if isinstance(message, Register):
            worker = self.workers.setdefault(message.worker, Worker(message.worker))
            worker.host, worker.device, worker.idle = message.host, message.device, True
            if (
                worker.experiment
                and (exp := self.experiments.get(worker.experiment))
                and exp.cells.get(worker.coord) != worker.id
            ):
                worker.free()  # it was replaced while away
            return
        experiment = self.experiments.get(getattr(message, "experiment", ""))
        if experiment is None:
            return
        if not self._trusted(experiment, message):
            return
        if isinstance(message, Checkpoint):  # kept even after a stop or failure: that is when they matter
            keep = experiment.config.training.checkpoint_keep
            folder = experiment.run.checkpoint_dir(Coord(*message.coord))
            await asyncio.to_thread(write_checkpoint_bytes, folder, message.iteration, payload, message.meta, keep)
            return
        if experiment.finished:
            return  # late messages of an ended experiment
        if isinstance(message, Metrics):
            key = ("-".join(map(str, message.record.get("cell", []))), int(message.record.get("iteration", -1)))
            if key in experiment.recorded:
                return  # redelivered after a broker reconnect
            experiment.recorded.add(key)
            experiment.run.append_metrics(message.record)
            self.counters["metrics_records"] += 1
            await self._event(experiment, "metrics", {"record": message.record})
        elif isinstance(message, Samples):
            if message.real:
                if not experiment.run.real_samples_path.exists():
                    experiment.run.write_real_samples(payload)
            else:
                experiment.run.write_samples(Coord(*message.coord), message.iteration, payload)
        elif isinstance(message, Done):
            async with self._lock:
                await self._on_done(experiment, message, payload)
        elif isinstance(message, Failed) and message.worker in experiment.cells.values():
            async with self._lock:
                if experiment.finished:
                    return
                coord = next(c for c, w in experiment.cells.items() if w == message.worker)
                if message.restore_failed and coord in experiment.restoring:
                    # Fall back: the previous checkpoint, the last snapshot, then scratch.
                    experiment.unusable.setdefault(coord, set()).add(experiment.restoring.pop(coord))
                    log.warning("cell %s of %s: %s; trying an older state", coord, experiment.id, message.reason)
                    await self._assign(experiment, coord, message.worker, restore=True)
                    return
                await self._end(experiment, "failed", message.reason)

    def _trusted(self, experiment: Experiment, message: Any) -> bool:
        """Whether a cell's message fits the layout: sent by the worker that holds its coordinate, for
        an iteration the experiment has. Anything else is counted and dropped (stale or forged)."""
        why = ""
        iterations = experiment.config.training.iterations
        if isinstance(message, (Checkpoint, Samples)):
            coord = Coord(*message.coord)
            if message.real if isinstance(message, Samples) else False:
                why = (
                    ""
                    if message.worker in experiment.cells.values()
                    else "real samples from a worker outside the layout"
                )
            elif experiment.cells.get(coord) != message.worker:
                why = f"{message.kind} for {coord} from {message.worker}, which does not hold it"
            elif not 0 <= message.iteration <= iterations:
                why = f"{message.kind} for iteration {message.iteration} of {iterations}"
            elif isinstance(message, Checkpoint) and int(message.meta.get("epoch", 0)) < experiment.history_since.get(
                coord, 0
            ):
                why = "a checkpoint from before the coordinate changed hands"
        elif isinstance(message, Metrics):
            record = message.record
            cell, iteration = record.get("cell"), record.get("iteration")
            if not (isinstance(cell, list) and len(cell) == 2 and all(isinstance(v, int) for v in cell)):
                why = "metrics without a valid cell"
            elif experiment.cells.get(Coord(*cell)) != message.worker:
                why = f"metrics for {tuple(cell)} from {message.worker}, which does not hold it"
            elif not (isinstance(iteration, int) and 0 <= iteration < iterations):
                why = f"metrics for iteration {iteration!r} of {iterations}"
        if why:
            self.counters["untrusted_messages"] += 1
            log.debug("experiment %s: dropped %s", experiment.id, why)
        return not why

    async def _on_done(self, experiment: Experiment, message: Done, payload: bytes) -> None:
        coord = Coord(*message.coord)
        if experiment.cells.get(coord) != message.worker:
            if experiment.moved_from.get(message.worker) != coord:
                return  # a cell that has since been replaced
            coord = next(c for c, w in experiment.cells.items() if w == message.worker)
            log.info(
                "cell %s of %s finished before its move: its result stands for %s", message.coord, experiment.id, coord
            )
        experiment.moved_from.pop(message.worker, None)
        experiment.done[coord] = CellResult(
            str(coord),
            message.score,
            message.components,
            message.weights,
            payload,
            message.mixture,
            base64.b64decode(message.samples_png) if message.samples_png else b"",
            trained_at=str(Coord(*message.coord)),
        )
        await asyncio.to_thread(write_collected, experiment.run.path, experiment.done[coord])
        await asyncio.to_thread(experiment.persist)
        if message.worker in self.workers:
            self.workers[message.worker].free()
        await self._maybe_finish(experiment)

    async def _maybe_finish(self, experiment: Experiment) -> None:
        """Once every cell of the current layout has reported its result, rank them into result/."""
        if (
            experiment.state == "running"
            and not experiment.collecting
            and set(experiment.done) >= set(experiment.cells)
        ):
            experiment.collecting = True  # before the await: a concurrent Done must not write result/ again
            try:
                best = await asyncio.to_thread(write_result, experiment.run, list(experiment.done.values()))
            except (OSError, ValueError) as error:
                log.exception("experiment %s: the result cannot be written", experiment.id)
                await self._end(experiment, "failed", f"the result cannot be written: {error}")
                return
            if experiment.state != "running":
                return  # stopped while result/ was being written
            experiment.state, experiment.ended_at = "finished", time.time()  # only now: result/ is complete
            await asyncio.to_thread(experiment.persist)
            log.info(
                "experiment %s finished: best mixture of cell %s (MMD² %.4g)", experiment.id, best.cell, best.score
            )
            await self._event(
                experiment, "state", {"state": "finished", "best_cell": best.cell, "best_score": best.score}
            )
            await self._enqueue_scoring(experiment, best)
            await self._forget_all_published(experiment)

    async def _enqueue_scoring(self, experiment: Experiment, best: CellResult) -> None:
        """Score jobs for the best mixture and every cell's (scorers may come later: the queue keeps them)."""
        scoring = experiment.config.scoring
        if not scoring.final:
            return
        options = scoring.job_options()
        targets = [
            (str(coord), result.description, result.payload, None) for coord, result in sorted(experiment.done.items())
        ]
        if experiment.partition is None:  # a class mixture has no single payload: `palomino score` scores it
            targets.insert(0, await self._best_target(experiment, best))
        for target, description, payload, ensemble in targets:
            job = ScoreJob(
                job=f"{experiment.id}:{target}",
                experiment=experiment.id,
                target=target,
                mixture=description,
                data=experiment.config.data.model_dump(mode="json"),
                data_seed=experiment.config.seed,
                options=options,
                ensemble=ensemble,
            )
            try:
                await self.scoring.enqueue(job, payload)
            except PalominoError as error:
                log.warning("score job %s not queued: %s", job.job, error)
                return

    async def _best_target(self, experiment: Experiment, best: CellResult) -> tuple[str, dict, bytes, dict | None]:
        """The "best" score job: the best neighbourhood mixture, or — training.ensemble.scope grid — every
        cell's generator, for the scorer to optimise into the grid's ensemble (kept in result/grid/
        until its weights come back)."""
        config = experiment.config
        if not config.grid_ensemble:
            return "best", best.description, best.payload, None
        results = list(experiment.done.values())
        try:
            payload, description = await asyncio.to_thread(grid_components, results, experiment.id)
            await asyncio.to_thread(save_encoded, experiment.run.result_dir / "grid", payload, description)
        except (OSError, ValueError, KeyError) as error:  # the best cell's mixture is still a result
            log.warning("experiment %s: no grid ensemble (%s); scoring the best cell's mixture", experiment.id, error)
            return "best", best.description, best.payload, None
        return "best", description, payload, config.model_dump(mode="json")

    async def _on_score(self, result: ScoreResult) -> None:
        """A scorer's result → the run's scores.json (also for runs this orchestrator no longer holds);
        an ensemble's weights → result/ first."""
        experiment = self.experiments.get(result.experiment)
        folder = experiment.run.path if experiment else self.runs / result.experiment
        if not (folder / "config.yaml").is_file():
            log.info("score for unknown experiment %s dropped", result.experiment)
            return
        if result.target == "best" and result.ensemble is not None:
            try:
                await asyncio.to_thread(adopt_ensemble, RunDirectory(folder), result)
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.warning(
                    "experiment %s: the ensemble's weights are not usable (%s); result/ keeps the best cell's mixture",
                    result.experiment,
                    error,
                )
        await asyncio.to_thread(record_score, folder, result)

    # ---- supervision ----------------------------------------------------------------------

    async def _supervise(self) -> None:
        pause = TICK
        while True:
            known = True
            try:
                async with self._lock:
                    known = await self._refresh_liveness()
                    for experiment in list(self.experiments.values()) if known else []:  # unknown: judge nobody
                        if experiment.state == "waiting":
                            await self._try_start(experiment)
                        elif experiment.state == "running":
                            await self._check_cells(experiment)
            except PalominoError as error:
                log.warning("supervision: %s", error)
            except Exception:
                log.exception("supervision failed; going on")
            self._evict()
            # While Redis cannot say who is alive, ask it less and less often (never a busy loop).
            pause = TICK if known else min(pause * 2, MAX_BACKOFF)
            await asyncio.sleep(pause)

    def _evict(self) -> None:
        """Ended experiments past their retention leave the list (their run directories stay)."""
        cutoff = time.time() - self.settings.retention_seconds
        for experiment_id, experiment in list(self.experiments.items()):
            if experiment.finished and (experiment.ended_at or 0) < cutoff:
                del self.experiments[experiment_id]
                log.info("experiment %s: retention over, no longer listed (its run directory stays)", experiment_id)

    async def _refresh_liveness(self) -> bool:
        """Update who is alive; False while Redis cannot say."""
        try:
            alive = await self.liveness.alive()
        except PalominoError as error:
            if self._redis_ok:
                log.warning("liveness unknown (%s): nobody is declared dead until Redis answers", error)
            self._redis_ok = False
            return False
        now = time.monotonic()
        if not self._redis_ok:
            # Back from an outage: heartbeats could not land meanwhile, so restart every clock.
            for worker in self.workers.values():
                worker.last_seen = now
            self._redis_ok = True
        for worker_id in alive:
            if worker_id in self.workers:
                self.workers[worker_id].last_seen = now
        self.alive = alive
        return True

    def _is_dead(self, worker_id: str, ttl: float) -> bool:
        worker = self.workers.get(worker_id)
        return worker is None or time.monotonic() - worker.last_seen > ttl

    def _spares(self, ttl: float) -> list[str]:
        return sorted(
            w.id
            for w in self.workers.values()
            if w.experiment is None and w.idle and w.id in self.alive and not self._is_dead(w.id, ttl)
        )

    async def _try_start(self, experiment: Experiment) -> None:
        config = experiment.config
        low, high = config.cell_bounds
        spares = self._spares(config.distributed.heartbeat_ttl)
        waited = time.monotonic() - experiment.created
        rows, cols = (
            rectangle(min(len(spares), high), prefer=(config.grid.rows, config.grid.cols)) if spares else (0, 0)
        )
        enough = rows * cols >= low
        if config.partitioned:  # every worker gets a cell of some class, at least one per class
            enough = min(len(spares), high) >= max(low, len(config.data.labels or ()))
        if len(spares) < high and not (waited >= config.distributed.start_timeout and enough):
            if waited >= config.distributed.start_timeout and not enough:
                await self._end(
                    experiment,
                    "failed",
                    f"only {len(spares)} workers after {config.distributed.start_timeout:.0f} s; min_cells is {low}",
                )
            return
        if min(len(spares), high) == config.cells:
            rows, cols = config.grid.rows, config.grid.cols  # exactly the configured grid when it is there
        if config.partitioned:
            experiment.partition = class_layout(config, min(len(spares), high))
            if experiment.partition is None:  # fewer workers than classes, after the start timeout
                await self._end(
                    experiment,
                    "failed",
                    f"only {len(spares)} workers after {config.distributed.start_timeout:.0f} s; "
                    f"a partitioned run needs at least one per class ({len(config.data.labels or ())})",
                )
                return
            rows, cols = experiment.partition.rows, max(g.cols for g in experiment.partition.grids)
        topology = Topology(rows, cols, config.grid.neighbourhood, epoch=0)
        coords = list(experiment.partition.cells() if experiment.partition else topology.cells())
        experiment.topology = topology
        experiment.laid_out.update(coords)
        experiment.cells = dict(zip(coords, spares))
        experiment.state = "running"
        experiment.record_layout()
        log.info(
            "experiment %s starts on %d×%d: %s",
            experiment.id,
            rows,
            cols,
            {str(c): w for c, w in experiment.cells.items()},
        )
        for coord, worker in experiment.cells.items():
            await self._assign(experiment, coord, worker)
        await self._event(experiment, "topology", experiment.summary(self.alive))

    async def _assign(self, experiment: Experiment, coord: Coord, worker: str, restore: bool = False) -> None:
        topology = experiment.topology
        assert topology is not None
        self.workers[worker].experiment, self.workers[worker].coord = experiment.id, coord
        self.workers[worker].idle = False
        payload, meta = b"", None
        if restore:
            unusable = experiment.unusable.get(coord, set())
            below = min((i for kind, i in unusable if kind == "checkpoint"), default=None)  # older than what failed
            folder = experiment.run.checkpoint_dir(coord)
            checkpoint = await asyncio.to_thread(newest_valid, folder, None if below is None else below - 1, raw=True)
            resumed, chosen = 0, None
            if checkpoint is not None:
                payload, meta, resumed, chosen = (
                    checkpoint.payload,
                    checkpoint.meta,
                    checkpoint.iteration,
                    ("checkpoint", checkpoint.iteration),
                )
            snapshot = await self._newest_published(experiment, coord)
            if (
                snapshot is not None and snapshot[1] > resumed and ("snapshot", snapshot[1]) not in unusable
            ):  # newer than the checkpoint
                payload, meta, resumed, chosen = (
                    snapshot[0],
                    {"from": "snapshot", "iteration": snapshot[1]},
                    snapshot[1],
                    ("snapshot", snapshot[1]),
                )
            if chosen is not None:
                experiment.restoring[coord] = chosen
            log.info(
                "cell %s of %s restarts at iteration %d from %s",
                coord,
                experiment.id,
                resumed,
                (meta or {}).get("from", "a checkpoint" if payload else "scratch"),
            )
            # The iterations it will redo are recorded again by the newcomer.
            experiment.run.keep_metrics(
                lambda r: "-".join(map(str, r["cell"])) != str(coord) or r["iteration"] < resumed
            )
            experiment.recorded = {k for k in experiment.recorded if k[0] != str(coord) or k[1] < resumed}
        rows, cols = experiment.shape_of(coord)
        message = Assign(
            experiment=experiment.id,
            worker=worker,
            config=experiment.config.model_dump(mode="json"),
            coord=tuple(coord),
            rows=rows,
            cols=cols,
            epoch=topology.epoch,
            restore_meta=meta,
        )
        await self.control.send(cell_address(worker), message, payload)

    async def _newest_published(self, experiment: Experiment, coord: Coord) -> tuple[bytes, int] | None:
        """(body, the iteration it resumes at) of the newest snapshot `coord` published, if any."""
        try:
            # Bounded: this runs under the orchestrator's lock, and a broker outage must not hold it.
            body = await asyncio.wait_for(
                newest_published(self.control.channel, experiment.id, coord, self.settings.signer), BROKER_CALL_TIMEOUT
            )
            if body is None:
                return None
            header = SnapshotHeader.model_validate(
                frame.unpack(body, max_bytes=experiment.config.distributed.max_snapshot_bytes)[0]
            )
        except (TimeoutError, PalominoError, ValueError, AMQPError, RuntimeError, ConnectionError) as error:
            log.warning("newest snapshot of %s not readable (%s): the checkpoint will do", coord, error)
            return None
        if header.experiment != experiment.id or tuple(header.cell) != tuple(coord):
            return None
        if header.epoch < experiment.history_since.get(coord, 0):
            return None  # published by the coordinate's previous occupant
        return body, header.iteration + 1

    async def _forget_published(self, experiment: Experiment, coord: Coord) -> None:
        try:
            await asyncio.wait_for(forget_published(self.control.channel, experiment.id, coord), BROKER_CALL_TIMEOUT)
        except (TimeoutError, AMQPError, RuntimeError, ConnectionError) as error:
            log.warning("last-value queue of %s not deleted: %s", coord, error)

    async def _forget_all_published(self, experiment: Experiment) -> None:
        """The experiment is over: nothing will be restored from its snapshots any more."""
        for coord in sorted(experiment.laid_out):
            await self._forget_published(experiment, coord)

    async def _check_cells(self, experiment: Experiment) -> None:
        ttl = experiment.config.distributed.heartbeat_ttl
        dead = {
            coord: w for coord, w in experiment.cells.items() if coord not in experiment.done and self._is_dead(w, ttl)
        }
        if not dead:
            return
        self.counters["failures_handled"] += len(dead)
        for coord, worker in dead.items():
            log.warning("worker %s (cell %s of %s) is dead: no heartbeat for %.0f s", worker, coord, experiment.id, ttl)
            self.workers.pop(worker, None)
        policy = experiment.config.distributed.on_failure
        spares = self._spares(ttl)
        if policy == "replace" or (policy == "auto" and len(spares) >= len(dead)):
            if len(spares) >= len(dead):
                await self._replace(experiment, dead, spares)
                return
            log.warning("not enough spares to replace %d cells: shrinking instead", len(dead))
        await self._shrink(experiment, dead)

    async def _new_epoch(self, experiment: Experiment, rows: int, cols: int) -> Topology:
        old = experiment.topology
        assert old is not None
        experiment.topology = Topology(rows, cols, old.kind, old.epoch + 1)
        experiment.laid_out.update(experiment.cells)
        experiment.record_layout()
        await self._event(experiment, "topology", experiment.summary(self.alive))
        return experiment.topology

    async def _replace(self, experiment: Experiment, dead: dict[Coord, str], spares: list[str]) -> None:
        for (coord, worker), spare in zip(dead.items(), spares):
            experiment.cells[coord] = spare
            experiment.failures.append(
                {"worker": worker, "cell": str(coord), "action": "replace", "by": spare, "at": time.time()}
            )
            log.info("cell %s of %s: %s replaces %s from its newest checkpoint", coord, experiment.id, spare, worker)
        await self._new_epoch(experiment, experiment.topology.rows, experiment.topology.cols)
        for coord in dead:
            await self._assign(experiment, coord, experiment.cells[coord], restore=True)

    def _plan_shrink(
        self, experiment: Experiment, dead: dict[Coord, str]
    ) -> tuple[dict[Coord, str], int, int, Partition | None] | str:
        """(survivors placed, rows, cols of the id space, the new partition) or why the experiment fails.

        A plain grid is laid out again as a whole; a partitioned one only in the classes that lost
        cells, each within its band of rows, so no cell ever changes class."""
        low, high = experiment.config.cell_bounds
        current = {c: w for c, w in sorted(experiment.cells.items()) if c not in dead}
        if experiment.partition is None:
            rows, cols = rectangle(min(len(current), high)) if current else (0, 0)
            if rows * cols < low:  # the rectangle, not the head count: 7 survivors lay out as 2×3
                return f"{len(current)} cells left after failures; min_cells is {low} (checkpoints kept)"
            return relayout(current, list(current.values()), rows, cols), rows, cols, None
        partition, epoch = experiment.partition, experiment.topology.epoch + 1
        grids, placed = [], {}
        for grid in partition.grids:
            mine = {c: w for c, w in current.items() if c in grid}
            if not any(c in grid for c in dead):
                grids.append(grid)
                placed.update(mine)
                continue
            if not mine:
                return f"class {grid.label}: every cell of its sub-grid was lost (checkpoints kept)"
            rows, cols = class_rectangle(len(mine), partition.per_class[0])
            local = relayout({grid.to_local(c): w for c, w in mine.items()}, list(mine.values()), rows, cols)
            resized = grid.resized(rows, cols, epoch)
            grids.append(resized)
            placed.update({resized.to_global(c): w for c, w in local.items()})
        if len(placed) < low:
            return f"{len(placed)} cells left after failures; min_cells is {low} (checkpoints kept)"
        shrunk = Partition(tuple(grids), partition.per_class)
        return placed, shrunk.rows, max(g.cols for g in grids), shrunk

    async def _shrink(self, experiment: Experiment, dead: dict[Coord, str]) -> None:
        plan = self._plan_shrink(experiment, dead)
        if isinstance(plan, str):
            await self._end(experiment, "failed", plan)
            return
        placed, rows, cols, partition = plan
        survivors = [w for c, w in sorted(experiment.cells.items()) if c not in dead]
        moved = {w for c, w in placed.items() if experiment.cells.get(c) != w}
        released = [w for w in survivors if w not in placed.values()]
        for coord, worker in dead.items():
            shape = f"{rows}x{cols}"
            if partition is not None:  # the class's new sub-grid
                grid = partition.grid_for(experiment.partition.class_of(coord))
                shape = f"class {grid.label}: {grid.rows}x{grid.cols}"
            experiment.failures.append(
                {"worker": worker, "cell": str(coord), "action": "shrink", "to": shape, "at": time.time()}
            )
        working = set(self._working_on(experiment)) - set(dead.values())
        # Cells that already finished keep their result, under their (possibly new) coordinate.
        result_of = {experiment.cells[c]: r for c, r in experiment.done.items()}
        experiment.done = {c: result_of[w] for c, w in placed.items() if w in result_of}
        for coord, result in experiment.done.items():
            result.cell = str(coord)
            await asyncio.to_thread(write_collected, experiment.run.path, result)  # kept under its new name
        # A coordinate taken by another worker starts a new history: the old one is set aside,
        # so a later restore never picks up the previous occupant's individuals.
        for coord, worker in placed.items():
            folder = experiment.run.checkpoint_dir(coord)
            if experiment.cells.get(coord) != worker:
                if folder.exists():
                    folder.rename(folder.with_name(f"{coord}.before-epoch-{experiment.topology.epoch + 1}"))
                experiment.history_since[coord] = experiment.topology.epoch + 1
                await self._forget_published(experiment, coord)
        was_at = {w: c for c, w in experiment.cells.items()}
        experiment.moved_from = {w: was_at[w] for c, w in placed.items() if w in working and was_at[w] != c}
        experiment.cells = placed
        experiment.partition = partition
        topology = await self._new_epoch(experiment, rows, cols)
        log.info(
            "experiment %s shrinks to %d×%d (epoch %d); %d moved, %d released",
            experiment.id,
            rows,
            cols,
            topology.epoch,
            len(moved),
            len(released),
        )
        for coord, worker in placed.items():
            if worker in working:  # finished cells and workers on other experiments are left alone
                self.workers[worker].coord = coord
                shape = experiment.shape_of(coord)
                resize = Resize(
                    experiment=experiment.id,
                    worker=worker,
                    coord=tuple(coord),
                    rows=shape[0],
                    cols=shape[1],
                    epoch=topology.epoch,
                )
                await self.control.send(cell_address(worker), resize)
        for worker in released:
            if worker not in working:
                continue
            self.workers[worker].free()
            await self.control.send(
                cell_address(worker),
                Resize(experiment=experiment.id, worker=worker, coord=None, rows=rows, cols=cols, epoch=topology.epoch),
            )
        await self._maybe_finish(experiment)

    async def _event(self, experiment: Experiment, kind: str, body: dict[str, Any]) -> None:
        try:
            await self.control.event(experiment.id, kind, body)
        except PalominoError as error:
            log.warning("event %s not published: %s", kind, error)

    def metrics_page(self, experiment: Experiment, since: int, limit: int) -> tuple[list[dict[str, Any]], int, int]:
        """(records since..since+limit, next, total) of metrics.jsonl, read incrementally (call it off the loop)."""
        if experiment.metrics_index is None:
            experiment.metrics_index = LineIndex(experiment.run.metrics_path)
        return experiment.metrics_index.page(since, limit)

    def get(self, experiment_id: str) -> Experiment | None:
        return self.experiments.get(experiment_id)
