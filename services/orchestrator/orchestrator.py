"""`palomino orchestrator`: experiments, worker registry, liveness, layout, failures, results.

It owns the run directories (same layout as `palomino train`), imports no torch, and talks
to cells only through the control plane; liveness comes from Redis heartbeats. Its parts, each
its own module: placement (layouts, assignments, ending), recovery (dead workers), results
(collection and scoring), supervision (liveness), trust (what a message must fit); they share
one `Shared` (the experiments, workers, connections and the lock).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from palomino.config import ExperimentConfig
from palomino.errors import PalominoError
from palomino.grid import Coord, cell_name
from palomino.runs.checkpoints import write_checkpoint_bytes
from palomino.runs.directory import RunDirectory
from palomino.services.common.service_settings import ServiceSettings
from palomino.services.orchestrator.experiment import Experiment, TooBusy, Worker
from palomino.services.orchestrator.experiment_store import read_states
from palomino.services.orchestrator.fencing import Fencing
from palomino.services.orchestrator.placement import Placement
from palomino.services.orchestrator.records import RecordWriter
from palomino.services.orchestrator.recovery import Recovery
from palomino.services.orchestrator.results import Results
from palomino.services.orchestrator.shared import Shared
from palomino.services.orchestrator.supervision import Supervisor
from palomino.services.orchestrator.trust import untrusted
from palomino.transport.control_channel import ControlChannel, cell_address, orchestrator_address
from palomino.transport.redis_liveness import RedisLiveness, liveness_key
from palomino.transport.score_queue import RESULTS_QUEUE, ScoreQueue, score_queue_name
from palomino.wire.control_messages import Checkpoint, Done, DoneAck, Failed, Metrics, Register, Samples

log = logging.getLogger(__name__)


async def preflight(settings: ServiceSettings) -> None:
    """Fail fast, with the URL named, when the broker or Redis cannot be reached."""
    from palomino.transport.broker import connect

    connection = await connect(settings.broker_url, deadline=settings.connect_deadline)
    await connection.close()
    liveness = RedisLiveness(settings.redis_url, liveness_key(settings.namespace))
    try:
        await liveness.alive()
    finally:
        await liveness.close()


class Orchestrator:
    def __init__(self, settings: ServiceSettings, runs: Path) -> None:
        self.shared = Shared(settings, Path(runs))
        self.records = RecordWriter(self.shared)
        self.placement = Placement(self.shared, self.records)
        self.results = Results(self.shared, self.placement)
        self.recovery = Recovery(self.shared, self.placement, self.results)
        self.fencing = Fencing(self.shared)
        self.supervisor = Supervisor(self.shared, self.placement, self.recovery, self.results.owed)
        self._stack = AsyncExitStack()  # what start() opened, closed in reverse by close()

    # The shared state, by the names the API and tests use.
    @property
    def settings(self) -> ServiceSettings:
        return self.shared.settings

    @property
    def runs(self) -> Path:
        return self.shared.runs

    @property
    def experiments(self) -> dict[str, Experiment]:
        return self.shared.experiments

    @property
    def workers(self) -> dict[str, Worker]:
        return self.shared.workers

    @property
    def counters(self) -> dict[str, int]:
        return self.shared.counters

    @property
    def alive(self) -> set[str]:
        return self.shared.alive

    @property
    def scoring(self) -> Any:
        return self.shared.scoring

    @property
    def control(self) -> Any:
        return self.shared.control

    @control.setter
    def control(self, channel: Any) -> None:
        self.shared.control = channel

    @property
    def liveness(self) -> Any:
        return self.shared.liveness

    @liveness.setter
    def liveness(self, liveness: Any) -> None:
        self.shared.liveness = liveness

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        shared, settings = self.shared, self.shared.settings
        shared.runs.mkdir(parents=True, exist_ok=True)
        key, namespace = settings.signer, settings.namespace
        channel = ControlChannel(
            settings.broker_url, orchestrator_address(namespace), key=key, connect_deadline=settings.connect_deadline
        )
        shared.control = await channel.connect()
        self._stack.push_async_callback(channel.close)
        shared.liveness = RedisLiveness(settings.redis_url, liveness_key(namespace))
        self._stack.push_async_callback(shared.liveness.close)
        self._reload_experiments()  # before the first message: Done and Metrics waiting in the queue must find their experiment
        await shared.control.listen(self.on_control)
        scoring = ScoreQueue(settings.broker_url, namespace, key=key, connect_deadline=settings.connect_deadline)
        shared.scoring = await scoring.connect()
        self._stack.push_async_callback(scoring.close)
        await scoring.follow_results(score_queue_name(namespace, RESULTS_QUEUE), self.results.on_score)
        task = asyncio.create_task(self.supervisor.run())
        self._stack.callback(task.cancel)
        await self.resume()

    async def resume(self) -> None:
        """What a killed orchestrator left half done: experiments every cell of which had reported,
        and the score jobs finished ones still owe."""
        async with self.shared.lock:
            for experiment in list(self.shared.experiments.values()):
                await self.results.maybe_finish(experiment)
            await self.results.owed.pay_due()

    async def close(self) -> None:
        try:
            await self._stack.aclose()
        finally:
            self.shared.boards.close()

    async def __aenter__(self) -> Orchestrator:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _reload_experiments(self) -> None:
        """Experiments a previous orchestrator kept under `runs`, with the workers of the running ones
        (still training: their heartbeats decide, as before the restart)."""
        for run_dir, saved in read_states(self.shared.runs):
            try:
                experiment = Experiment.from_saved(run_dir, saved)
            except (OSError, ValueError, KeyError, TypeError, PalominoError) as error:
                log.warning("%s: not reloaded (%s)", run_dir, error)
                continue
            self.shared.experiments[experiment.id] = experiment
            if experiment.state != "running":
                continue
            for coord, worker in experiment.cells.items():
                if coord not in experiment.done:
                    self.shared.workers[worker] = Worker(worker, experiment=experiment.id, coord=coord, idle=False)
            log.info("experiment %s reloaded: running on %d×%d (epoch %d), %d of %d cells done", experiment.id,
                     experiment.topology.rows, experiment.topology.cols, experiment.topology.epoch, len(experiment.done), len(experiment.cells))  # fmt: skip

    # ---- experiments ----------------------------------------------------------------------

    async def submit(self, config: ExperimentConfig, client: str = "") -> Experiment:
        """A new experiment, unless `client` already has max_active_per_client waiting or running (TooBusy)."""
        active = sum(1 for e in self.shared.experiments.values() if e.client == client and not e.finished)
        if active >= self.shared.settings.max_active_per_client:
            raise TooBusy(
                f"{active} experiments of yours are waiting or running (PALOMINO_MAX_ACTIVE_PER_CLIENT is {self.shared.settings.max_active_per_client}); wait for one or delete it"
            )
        run = RunDirectory.create(self.shared.runs, config)
        experiment = Experiment(run.experiment, config, run, client=client)
        self.shared.experiments[experiment.id] = experiment
        await asyncio.to_thread(experiment.persist)
        log.info("experiment %s submitted: waiting for %d–%d workers", experiment.id, *config.cell_bounds)
        await self.shared.event(experiment, "state", {"state": "waiting"})
        return experiment

    async def cancel(self, experiment: Experiment, reason: str = "deleted") -> None:
        async with self.shared.lock:
            if not experiment.finished:
                await self.placement.end(experiment, "stopped", reason)

    def get(self, experiment_id: str) -> Experiment | None:
        return self.shared.experiments.get(experiment_id)

    # ---- control messages -----------------------------------------------------------------

    async def on_control(self, message: Any, payload: bytes) -> None:
        self.shared.counters["control_messages"] += 1
        if isinstance(message, Register):
            for slot in dict.fromkeys([message.worker, *message.slots]):  # a process's idle slots, each once
                self._register(slot, message)
            return
        if isinstance(message, Done):
            await self._on_done(message, payload)
            return
        experiment = self.shared.experiments.get(getattr(message, "experiment", ""))
        if experiment is None:
            return
        why = untrusted(experiment, message)
        if why:
            self.shared.counters["untrusted_messages"] += 1
            log.debug("experiment %s: dropped %s", experiment.id, why)
            await self.fencing.refused(experiment, message)
            return
        if isinstance(message, Checkpoint):  # kept even after a stop or failure: that is when they matter
            keep = experiment.config.training.checkpoint_keep
            folder = experiment.run.checkpoint_dir(Coord(*message.coord))
            await asyncio.to_thread(write_checkpoint_bytes, folder, message.iteration, payload, message.meta, keep)
            return
        if experiment.finished:
            return  # late messages of an ended experiment
        if isinstance(message, Metrics):
            await self.records.take(experiment, message.record)  # acknowledged once on disk
        elif isinstance(message, Samples):  # files written off the event loop (each is fsynced)
            if message.real:
                if not experiment.run.real_samples_path.exists():
                    await asyncio.to_thread(experiment.run.write_real_samples, payload)
            else:
                await asyncio.to_thread(experiment.run.write_samples, Coord(*message.coord), message.iteration, payload)
                cell = cell_name(message.coord)
                await asyncio.to_thread(self.shared.boards.samples, experiment, cell, message.iteration, payload)
        elif isinstance(message, Failed) and message.worker in experiment.cells.values():
            async with self.shared.lock:
                if experiment.finished:
                    return
                coord = next(c for c, w in experiment.cells.items() if w == message.worker)
                if message.restore_failed and coord in experiment.restoring:
                    # Fall back: the previous checkpoint, the last snapshot, then scratch.
                    experiment.unusable.setdefault(coord, set()).add(experiment.restoring.pop(coord))
                    log.warning("cell %s of %s: %s; trying an older state", coord, experiment.id, message.reason)
                    await self.placement.assign(experiment, coord, message.worker, restore=True)
                    return
                if message.transient and coord not in experiment.done:  # the worker's failure, not the run's
                    await self.recovery.handle_dead(experiment, {coord: message.worker}, message.reason)
                    return
                await self.placement.end(experiment, "failed", message.reason)

    def _register(self, slot: str, message: Register) -> None:
        worker = self.shared.workers.setdefault(slot, Worker(slot))
        worker.host, worker.device, worker.idle, worker.block = message.host, message.device, True, message.block
        if (
            worker.experiment
            and (exp := self.shared.experiments.get(worker.experiment))
            and exp.cells.get(worker.coord) != worker.id
        ):
            worker.free()  # it was replaced while away

    async def _on_done(self, message: Done, payload: bytes) -> None:
        """Take a cell's result, then acknowledge it, taken or not: the cell re-sends it until then
        (a Done of an ended or unknown experiment, or of a replaced worker, never will be taken)."""
        experiment = self.shared.experiments.get(message.experiment)
        if experiment is not None and not experiment.finished:
            async with self.shared.lock:
                if not experiment.finished:
                    await self.results.on_done(experiment, message, payload)
        ack = DoneAck(experiment=message.experiment, worker=message.worker, coord=message.coord, iteration=message.iteration)  # fmt: skip
        try:
            await self.shared.control.send(cell_address(message.worker), ack)
        except PalominoError as error:  # the cell sends it again; taking it again changes nothing
            log.warning("done of %s not acknowledged: %s", message.worker, error)
