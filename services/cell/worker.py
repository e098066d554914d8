"""`palomino cell`: a worker that registers, heartbeats, takes an assignment and trains its cell
(services/cell/assignment.py), one assignment at a time, until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from contextlib import AsyncExitStack
from typing import Any

from palomino.errors import PalominoError
from palomino.runs.loop import unless_set  # loads the engine (torch) now, not while heartbeating
from palomino.services.cell.assignment import Assignment, Links, RestoreError
from palomino.services.common.service_settings import ServiceSettings
from palomino.transport.control_channel import ControlChannel, cell_address, orchestrator_address
from palomino.transport.redis_liveness import RedisLiveness, liveness_prefix
from palomino.wire.control_messages import Assign, Failed, Register, Resize, Stop

log = logging.getLogger(__name__)

IDLE_TTL = 5.0  # seconds a heartbeat lasts between assignments (an assignment sets its experiment's)
HEARTBEAT_PERIOD = 1.0
REGISTER_PERIOD = 2.0


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
        self.control: ControlChannel | None = None  # connected by run()
        self.liveness: RedisLiveness | None = None

    def request_shutdown(self) -> None:
        """SIGTERM / Ctrl-C: finish the iteration, checkpoint, leave."""
        self._stop.set()
        self.shutdown.set()

    async def run(self) -> None:
        settings = self.settings
        async with AsyncExitStack() as stack:  # closed in reverse whatever happens, connecting included
            channel = ControlChannel(settings.broker_url, cell_address(self.worker), key=settings.signer)
            self.control = await channel.connect()
            stack.push_async_callback(channel.close)
            self.liveness = RedisLiveness(settings.redis_url, liveness_prefix(settings.namespace))
            stack.push_async_callback(self.liveness.close)
            await self.control.listen(self._on_control)
            for loop in (self._heartbeats(), self._registrations()):
                stack.callback(asyncio.create_task(loop).cancel)
            self.ready = True
            log.info("cell worker %s ready (broker %s)", self.worker, settings.broker_url.split("@")[-1])
            while not self.shutdown.is_set():
                self._wake.clear()
                if self._assignment is not None:
                    assign, payload = self._assignment
                    self._assignment = None
                    await self._train(assign, payload)
                    continue
                await unless_set(self._wake.wait(), self.shutdown)

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
        def take_resize() -> Resize | None:
            resize, self._pending = self._pending, None
            return resize

        def set_ttl(ttl: float) -> None:
            self._ttl = ttl

        links = Links(
            self.settings, self.worker, self.device, self.control, self.orchestrator, self.liveness, self._stop,
            take_resize, set_ttl,
        )  # fmt: skip
        await Assignment(links, assign, payload).run()
