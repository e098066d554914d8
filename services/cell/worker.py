"""`palomino cell`: a worker that registers, heartbeats, takes an assignment and trains its cell.

It runs the same engine and loop as `palomino train`, with the RabbitMQ SnapshotBus, Redis
Liveness and a Recorder that sends everything to the orchestrator (no shared filesystem).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import uuid
from typing import Any

from palomino.services.common.settings import ServiceSettings

from palomino.config import parse_config
from palomino.config.data_roots import check_data_dir, data_roots
from palomino.errors import PalominoError
from palomino.grid import Coord, Topology
from palomino.grid.partition import ClassGrid, class_grid_at
from palomino.runs.loop import unless_set  # loads the engine (torch) now, not while heartbeating
from palomino.transport.control import ControlChannel, cell_address, orchestrator_address
from palomino.transport.rabbitmq import RabbitSnapshotBus
from palomino.transport.redis_liveness import RedisLiveness, liveness_prefix
from palomino.transport.score_queue import ScoreQueue
from palomino.wire import Snapshot
from palomino.wire.control import Assign, Checkpoint, Done, Failed, Metrics, Register, Resize, Samples, Stop
from palomino.wire.score import ScoreJob

log = logging.getLogger(__name__)


class RestoreError(PalominoError):
    """The checkpoint or snapshot an Assign carried does not load into this cell."""


IDLE_TTL = 5.0  # seconds a heartbeat lasts between assignments (an assignment sets its experiment's)
HEARTBEAT_PERIOD = 1.0
REGISTER_PERIOD = 2.0


class ControlRecorder:
    """Recorder port → control messages to the orchestrator."""

    def __init__(
        self, control: ControlChannel, orchestrator: str, experiment: str, worker: str, kind: str, modes: Any
    ) -> None:
        self.control, self.orchestrator, self.experiment, self.worker = control, orchestrator, experiment, worker
        self.kind, self.modes = kind, modes

    async def metrics(self, record: dict[str, Any]) -> None:
        await self.control.send(
            self.orchestrator, Metrics(experiment=self.experiment, worker=self.worker, record=record)
        )

    async def samples(self, coord: Coord, iteration: int, samples: Any) -> None:
        from palomino.runs.images import progress_png

        png = progress_png(samples, self.kind, self.modes)
        await self.control.send(
            self.orchestrator,
            Samples(experiment=self.experiment, worker=self.worker, coord=tuple(coord), iteration=iteration),
            png,
        )

    async def real_samples(self, coord: Coord, dataset: Any, seed: int) -> None:
        from palomino.runs.images import real_png

        png = await asyncio.to_thread(real_png, dataset, 64, seed)
        await self.control.send(
            self.orchestrator,
            Samples(experiment=self.experiment, worker=self.worker, coord=tuple(coord), iteration=0, real=True),
            png,
        )

    async def checkpoint(self, coord: Coord, iteration: int, tensors: dict, meta: dict[str, Any]) -> None:
        from palomino.runs.checkpoints import encode_tensors

        payload = await asyncio.to_thread(encode_tensors, tensors)
        message = Checkpoint(
            experiment=self.experiment, worker=self.worker, coord=tuple(coord), iteration=iteration, meta=meta
        )
        await self.control.send(self.orchestrator, message, payload)


def fits(cell: Any):
    """A validator for the SnapshotBus: a neighbour's tensors must match this cell's networks."""
    expected = {role: getattr(cell, role + "s").best.network.state_dict() for role in ("generator", "discriminator")}

    def check(snapshot: Snapshot) -> None:
        for role, state in expected.items():
            for name, tensor in state.items():
                got = snapshot.tensors.get(f"{role}.net.{name}")
                if got is None or got.shape != tensor.shape:
                    raise ValueError(
                        f"{role}.net.{name}: {None if got is None else tuple(got.shape)}, expected {tuple(tensor.shape)}"
                    )

    return check


def layout_of(config: Any, coord: Coord, rows: int, cols: int, epoch: int) -> Topology | ClassGrid:
    """The grid an assignment puts a cell on: the rows×cols torus, or (partitioned runs) its class's
    rows×cols sub-grid, found from the cell id's band of rows."""
    kind = config.grid.neighbourhood
    if config.partitioned:
        return class_grid_at(coord, config.data.labels, config.grid.per_class_shape, (rows, cols), kind, epoch)
    return Topology(rows, cols, kind, epoch)


class CellWorker:
    def __init__(self, settings: ServiceSettings, worker: str | None = None, device: str = "cpu") -> None:
        self.settings, self.device = settings, device
        self.orchestrator = orchestrator_address(settings.namespace)
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.shutdown = asyncio.Event()
        self.ready = False  # connected and listening: a signal now means "finish the iteration, checkpoint, leave"
        self._assignment: tuple[Assign, bytes] | None = None
        self._pending: Resize | None = None
        self._stop = asyncio.Event()
        self._busy = False
        self._current: str | None = None  # the experiment being trained
        self._ttl = IDLE_TTL
        self._wake = asyncio.Event()

    def request_shutdown(self) -> None:
        """SIGTERM / Ctrl-C: finish the iteration, checkpoint, leave."""
        self._stop.set()
        self.shutdown.set()

    async def run(self) -> None:
        self.control = await ControlChannel(
            self.settings.broker_url, cell_address(self.worker), key=self.settings.signer
        ).connect()
        self.liveness = RedisLiveness(self.settings.redis_url, liveness_prefix(self.settings.namespace))
        await self.control.listen(self._on_control)
        background = [asyncio.create_task(self._heartbeats()), asyncio.create_task(self._registrations())]
        self.ready = True
        log.info("cell worker %s ready (broker %s)", self.worker, self.settings.broker_url.split("@")[-1])
        try:
            while not self.shutdown.is_set():
                self._wake.clear()
                if self._assignment is not None:
                    assign, payload = self._assignment
                    self._assignment = None
                    await self._train(assign, payload)
                    if self.shutdown.is_set():
                        break
                    continue
                await unless_set(self._wake.wait(), self.shutdown)
        finally:
            for task in background:
                task.cancel()
            await self.control.close()
            await self.liveness.close()

    async def _heartbeats(self) -> None:
        while True:
            try:
                await self.liveness.heartbeat(self.worker, self._ttl)
            except PalominoError as error:
                log.warning("heartbeat failed: %s", error)
            await asyncio.sleep(HEARTBEAT_PERIOD)

    async def _registrations(self) -> None:
        # Idle workers keep announcing themselves: the orchestrator counts a worker as a spare
        # only once it has said so, and a restarted orchestrator finds its spares again.
        while True:
            if not self._busy and self._assignment is None:
                try:
                    await self.control.send(
                        self.orchestrator,
                        Register(worker=self.worker, host=socket.gethostname(), pid=os.getpid(), device=self.device),
                    )
                except PalominoError as error:
                    log.warning("registration failed: %s", error)
            await asyncio.sleep(REGISTER_PERIOD)

    async def _on_control(self, message: Any, payload: bytes) -> None:
        if isinstance(message, Assign) and message.worker == self.worker:
            # Kept, newest first, until the current training ends: never dropped.
            self._assignment = (message, payload)
            self._wake.set()
        elif isinstance(message, Resize) and message.experiment == self._current:
            self._pending = message
        elif isinstance(message, Stop) and message.experiment == self._current:
            log.info("stop: %s", message.reason or "requested")
            self._stop.set()

    async def _train(self, assign: Assign, payload: bytes) -> None:
        self._busy, self._current = True, assign.experiment
        self._stop.clear()
        self._pending = None
        experiment = assign.experiment
        try:
            await self._run_assignment(assign, payload)
        except RestoreError as error:  # the orchestrator falls back to an older checkpoint or snapshot
            log.error("training %s: %s", experiment, error)
            await self._report_failure(experiment, str(error), restore_failed=True)
        except PalominoError as error:
            log.error("training %s failed: %s", experiment, error)
            await self._report_failure(experiment, str(error))
        except Exception as error:  # a bug must not take the worker down silently: report it
            log.exception("training %s crashed", experiment)
            await self._report_failure(experiment, f"{type(error).__name__}: {error}")
        finally:
            # The experiment's settings end with it: an idle worker heartbeats with its own TTL.
            self._busy, self._current, self._ttl = False, None, IDLE_TTL

    async def _report_failure(self, experiment: str, reason: str, restore_failed: bool = False) -> None:
        try:
            failed = Failed(
                experiment=experiment,
                worker=self.worker,
                reason=f"{self.worker}: {reason}",
                restore_failed=restore_failed,
            )
            await self.control.send(self.orchestrator, failed)
        except PalominoError as error:
            log.warning("could not report the failure: %s", error)

    async def _run_assignment(self, assign: Assign, payload: bytes) -> None:
        from palomino.coevolution import Cell
        from palomino.data import load_dataset
        from palomino.runs.checkpoints import decode_tensors
        from palomino.runs.loop import LoopSettings, run_cell
        from palomino.runs.result import cell_result, neighbourhood_mixture
        from palomino.wire import decode_snapshot

        experiment = assign.experiment

        def build() -> tuple[Any, Any, Any]:
            # In a thread: building networks and reading data must not starve the heartbeats.
            config = parse_config(assign.config)
            check_data_dir(config.data.dir, data_roots(self.settings.data_roots))  # this worker's own roots too
            dataset = load_dataset(config.data, config.seed)
            topology = layout_of(config, Coord(*assign.coord), assign.rows, assign.cols, assign.epoch)
            cell = Cell(Coord(*assign.coord), topology, config, dataset, experiment=experiment, device=self.device)
            try:
                if payload and (assign.restore_meta or {}).get("from") == "snapshot":
                    # Newer than any checkpoint: the individuals as the dead cell last published them.
                    cell.adopt(decode_snapshot(payload, max_bytes=config.distributed.max_snapshot_bytes))
                elif payload:
                    cell.restore(decode_tensors(payload, "assigned checkpoint"), assign.restore_meta or {})
            except (ValueError, KeyError, RuntimeError, PalominoError) as error:  # does not load, or does not fit
                raise RestoreError(
                    f"cell {tuple(assign.coord)}: the assigned {(assign.restore_meta or {}).get('from', 'checkpoint')} does not load: {error}"
                ) from None
            return config, dataset, cell

        try:
            config, dataset, cell = await asyncio.to_thread(build)
        except (ValueError, KeyError) as error:  # a config or dataset that does not fit
            raise PalominoError(f"cannot set up cell {tuple(assign.coord)}: {error}") from None
        self._ttl = config.distributed.heartbeat_ttl
        log.info(
            "training cell %s of %s (%d×%d, epoch %d) from iteration %d",
            cell.coord,
            experiment,
            assign.rows,
            assign.cols,
            assign.epoch,
            cell.iteration,
        )
        bus = RabbitSnapshotBus(
            self.settings.broker_url,
            experiment,
            max_bytes=config.distributed.max_snapshot_bytes,
            validator=fits(cell),
            key=self.settings.signer,
        )
        await bus.connect()
        recorder = ControlRecorder(
            self.control, self.orchestrator, experiment, self.worker, dataset.kind, dataset.modes
        )
        every, scored, scoring = config.scoring.every, {cell.iteration}, None
        try:  # until the training's own try/finally below: nothing may leave the bus open
            if cell.coord == Coord(0, 0) and cell.iteration == 0:  # one picture of the real data per run
                await recorder.real_samples(cell.coord, dataset, config.seed)
            if every:
                try:
                    scoring = await ScoreQueue(
                        self.settings.broker_url, self.settings.namespace, key=self.settings.signer
                    ).connect()
                except PalominoError as error:
                    log.warning("periodic scoring is off for this cell: %s", error)
        except BaseException:
            await bus.close()
            raise

        async def apply_layout() -> None:
            resize, self._pending = self._pending, None
            if resize is None or resize.experiment != experiment:
                return
            if resize.coord is None:
                log.info("released to the spares by epoch %d", resize.epoch)
                self._stop.set()
                return
            coord = Coord(*resize.coord)
            cell.relocate(coord, layout_of(config, coord, resize.rows, resize.cols, resize.epoch))
            await bus.bind(cell.topology.neighbours(cell.coord), resize.epoch)
            log.info("moved to %s of %d×%d (epoch %d)", cell.coord, resize.rows, resize.cols, resize.epoch)

        async def between_iterations() -> None:
            await apply_layout()
            if (
                scoring is None
                or cell.iteration % every
                or cell.iteration in scored
                or cell.iteration >= config.training.iterations
            ):
                return  # the final mixtures are the orchestrator's to queue
            scored.add(cell.iteration)
            snapshots = {c: s for c in cell.topology.neighbours(cell.coord) if (s := await bus.newest(c))}
            mixture = await asyncio.to_thread(neighbourhood_mixture, cell, snapshots, dataset, experiment, False)
            payload, description = await asyncio.to_thread(mixture.encode)
            job = ScoreJob(
                job=f"{experiment}:{cell.coord}@{cell.iteration}",
                experiment=experiment,
                target=str(cell.coord),
                iteration=cell.iteration,
                mixture=description,
                data=config.data.model_dump(mode="json"),
                data_seed=config.seed,
                options=config.scoring.job_options(),
            )
            try:
                await scoring.enqueue(job, payload)
            except PalominoError as error:
                log.warning("periodic score job %s not queued: %s", job.job, error)

        training = config.training
        settings = LoopSettings(
            iterations=training.iterations,
            synchronous=training.synchronous,
            worker=self.worker,
            sample_every=training.sample_every,
            checkpoint_every=training.checkpoint_every,
            heartbeat_ttl=config.distributed.heartbeat_ttl,
            neighbour_timeout=config.distributed.neighbour_timeout,
        )
        try:
            await run_cell(
                cell, bus, self.liveness, recorder, settings, self._stop, before_iteration=between_iterations
            )
            if cell.iteration >= training.iterations:
                snapshots = {c: s for c in cell.topology.neighbours(cell.coord) if (s := await bus.newest(c))}
                result = await asyncio.to_thread(cell_result, cell, snapshots, dataset, experiment)
                done = Done(
                    experiment=experiment,
                    worker=self.worker,
                    coord=tuple(cell.coord),
                    iteration=cell.iteration,
                    score=result.score,
                    components=result.components,
                    weights=result.weights,
                    mixture=result.description,
                    samples_png=base64.b64encode(result.samples_png).decode(),
                )
                await self.control.send(self.orchestrator, done, result.payload)
                log.info("cell %s of %s done (score %.4g)", cell.coord, experiment, result.score)
        finally:
            await bus.close()
            if scoring is not None:
                await scoring.close()
