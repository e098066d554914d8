"""`palomino cell`: a worker that registers, heartbeats, takes assignments and trains them
(services/cell/block.py) until SIGTERM.

A worker hosts `cells` slots (`palomino cell --cells K`; one by default). To the orchestrator
each slot is a worker of its own — it registers, heartbeats and is assigned one cell — and the
slots of one process say so (`Register.block`), so the orchestrator gives them a compact patch
of the grid. The Assigns that reach idle slots together, for one experiment, train as one block.
The process dies whole, so all its slots' heartbeats stop together and its block is replaced or
shrunk as a whole.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from contextlib import AsyncExitStack, suppress
from typing import Any

from palomino.engine.loop import unless_set  # loads the engine (torch) now, not while heartbeating
from palomino.errors import PalominoError, TransportError
from palomino.services.cell.block import Block, Links
from palomino.services.cell.outbox import Outbox
from palomino.services.common.service_settings import ServiceSettings
from palomino.transport.control_channel import ControlChannel, cell_address, orchestrator_address
from palomino.transport.redis_liveness import RedisLiveness, liveness_key
from palomino.wire.control_messages import MAX_CELLS_PER_WORKER, Assign, DoneAck, Hello, Register, Resize, Stop

log = logging.getLogger(__name__)

IDLE_TTL = 5.0  # seconds a heartbeat lasts between assignments (an assignment sets its experiment's)
HEARTBEAT_PERIOD = 1.0
# Idle slots announce themselves again after 2 s, then 4, 8, … up to 30 s while nothing changes
# (1,024 workers every 2 s were 512 messages a second); an orchestrator missing one asks (Hello).
REGISTER_PERIOD = 2.0
REGISTER_PERIOD_MAX = 30.0
HELLO_GAP = 0.5  # seconds at least between two Registers
SETTLE = 0.3  # seconds without a new Assign before the ones that came start as one block
SETTLE_MAX = 3.0
DONE_SETTLE = 10.0  # seconds a leaving worker waits for its Dones' acknowledgements


def slot_names(worker: str, cells: int) -> list[str]:
    """The names a worker's slots go by: the worker's own for one cell, `worker/i` for several."""
    return [worker] if cells == 1 else [f"{worker}/{i}" for i in range(cells)]


class CellWorker:
    def __init__(
        self, settings: ServiceSettings, worker: str | None = None, device: str = "cpu", cells: int = 1
    ) -> None:
        if not 1 <= cells <= MAX_CELLS_PER_WORKER:
            raise PalominoError(f"--cells {cells}: a worker hosts 1 to {MAX_CELLS_PER_WORKER} cells")
        self.settings, self.device = settings, device
        self.orchestrator = orchestrator_address(settings.namespace)
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.slots = slot_names(self.worker, cells)
        self.shutdown = asyncio.Event()
        self.ready = False  # connected and listening: a signal now means "finish the iteration, checkpoint, leave"
        self._assigned: dict[str, tuple[Assign, bytes]] = {}  # slot → its newest Assign not yet started
        self._resizes: dict[str, Resize] = {}
        self._blocks: dict[asyncio.Task, Block] = {}
        self._ttl = dict.fromkeys(self.slots, IDLE_TTL)
        self._arrived = asyncio.Event()
        self._wake = asyncio.Event()
        self._hello = asyncio.Event()  # the orchestrator asked for a Register
        self.outbox: Outbox | None = None  # every message to the orchestrator; made by run() once connected
        self.liveness: RedisLiveness | None = None

    def request_shutdown(self) -> None:
        """SIGTERM / Ctrl-C: finish the iteration, checkpoint, leave."""
        for block in self._blocks.values():
            block.stop.set()
        self.shutdown.set()

    def busy(self, slot: str) -> Block | None:
        return next((block for block in self._blocks.values() if slot in block.holds), None)

    async def run(self) -> None:
        settings = self.settings
        async with AsyncExitStack() as stack:  # closed in reverse whatever happens, connecting included
            others = [cell_address(slot) for slot in self.slots if slot != self.worker]
            channel = ControlChannel(
                settings.broker_url,
                cell_address(self.worker),
                key=settings.signer,
                also=others,
                connect_deadline=settings.connect_deadline,
            )
            self.outbox = outbox = Outbox(await channel.connect(), self.orchestrator)
            stack.push_async_callback(channel.close)
            self.liveness = RedisLiveness(settings.redis_url, liveness_key(settings.namespace))
            stack.push_async_callback(self.liveness.close)
            await channel.listen(self._on_control)
            for loop in (self._heartbeats(), self._registrations(), outbox.dones.run()):
                stack.callback(asyncio.create_task(loop).cancel)
            self.ready = True
            log.info("cell worker %s ready, %d cell(s) (broker %s)", self.worker, len(self.slots), settings.broker_url.split("@")[-1])  # fmt: skip
            while not self.shutdown.is_set():
                self._wake.clear()
                if any(self.busy(slot) is None for slot in self._assigned):
                    await self._settle()
                    self._start_blocks()
                    continue
                await unless_set(self._wake.wait(), self.shutdown)
            if self._blocks:  # each finishes its iteration and checkpoints
                await asyncio.gather(*self._blocks, return_exceptions=True)
            if not await outbox.dones.settle(DONE_SETTLE):
                log.warning("leaving with %d done(s) not acknowledged: the orchestrator replaces those cells",
                            len(outbox.dones.pending))  # fmt: skip

    async def _settle(self) -> None:
        """Let the rest of a layout's Assigns arrive, so that they train as one block."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_MAX
        while loop.time() < deadline and not self.shutdown.is_set():
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), SETTLE)
            except TimeoutError:
                return

    def _start_blocks(self) -> None:
        ready = {slot: self._assigned.pop(slot) for slot in list(self._assigned) if self.busy(slot) is None}
        by_experiment: dict[str, dict[str, tuple[Assign, bytes]]] = {}
        for slot, assigned in ready.items():
            by_experiment.setdefault(assigned[0].experiment, {})[slot] = assigned
        for experiment, assigns in by_experiment.items():
            for slot in assigns:
                self._resizes.pop(slot, None)  # meant for what the slot trained before
            block = self.make_block(self._links(), experiment, assigns)
            task = asyncio.create_task(self._train(block))
            self._blocks[task] = block
            task.add_done_callback(self._finished)

    def make_block(self, links: Links, experiment: str, assigns: dict[str, tuple[Assign, bytes]]) -> Block:
        """What trains these Assigns (benchmarks/control_plane.py's simulated workers train nothing)."""
        return Block(links, experiment, assigns)

    def _finished(self, task: asyncio.Task) -> None:
        block = self._blocks.pop(task)
        for slot in block.slots:  # the experiment's settings end with it: idle slots heartbeat with their own TTL
            if self.busy(slot) is None and slot not in self._assigned:
                self._ttl[slot] = IDLE_TTL
        self._wake.set()
        self._hello.set()  # spares again: say so now

    def _links(self) -> Links:
        def take_resize(slot: str) -> Resize | None:
            return self._resizes.pop(slot, None)

        def set_ttl(slot: str, ttl: float) -> None:
            self._ttl[slot] = ttl

        return Links(
            self.settings, self.device, self.outbox, self.liveness, take_resize, set_ttl,
        )  # fmt: skip

    async def _heartbeats(self) -> None:
        while True:
            try:
                for ttl in set(self._ttl.values()):
                    await self.liveness.heartbeat_many([s for s, t in self._ttl.items() if t == ttl], ttl)
            except PalominoError as error:
                log.warning("heartbeat failed: %s", error)
            await asyncio.sleep(HEARTBEAT_PERIOD)

    async def _registrations(self) -> None:
        # Idle slots keep announcing themselves: the orchestrator counts a slot as a spare only
        # once it has said so. At a falling rate while nothing changes; at once when asked (Hello).
        host, pid = socket.gethostname(), os.getpid()
        period, announced = REGISTER_PERIOD, None
        while True:
            idle = [slot for slot in self.slots if self.busy(slot) is None and slot not in self._assigned]
            if idle != announced:  # slots came free (or were taken): soon again
                period, announced = REGISTER_PERIOD, idle
            if idle:  # one message for all of them
                register = Register(
                    worker=idle[0], slots=idle[1:], host=host, pid=pid, device=self.device, block=self.worker
                )
                try:
                    await self.outbox.send(register)
                except PalominoError as error:
                    log.warning("registration failed: %s", error)
            await asyncio.sleep(HELLO_GAP)  # a process's slots asked together: one answer
            self._hello.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._hello.wait(), period - HELLO_GAP)
            period = min(period * 2, REGISTER_PERIOD_MAX)

    async def _on_control(self, message: Any, payload: bytes) -> None:
        if isinstance(message, Assign) and message.worker in self._ttl:
            # Kept, newest first, until the slot's current training ends: never dropped.
            self._assigned[message.worker] = (message, payload)
            self._arrived.set()
            self._wake.set()
        elif isinstance(message, Resize) and message.worker in self._ttl:
            block = self.busy(message.worker)
            if block is not None and block.experiment == message.experiment:
                self._resizes[message.worker] = message
        elif isinstance(message, DoneAck):
            self.outbox.acknowledged(message)
        elif isinstance(message, Hello) and message.worker in self._ttl:
            self._hello.set()
        elif isinstance(message, Stop):
            for block in self._blocks.values():
                if block.experiment == message.experiment:
                    log.info("stop: %s", message.reason or "requested")
                    block.stop.set()

    async def _train(self, block: Block) -> None:
        try:
            await block.run()
        except TransportError as error:  # the broker out of reach: this worker's failure, not the run's
            log.error("training %s stopped: %s", block.experiment, error)
            await self._report_failure(block, str(error), transient=True)
        except PalominoError as error:
            log.error("training %s failed: %s", block.experiment, error)
            await self._report_failure(block, str(error))
        except Exception as error:  # a bug must not take the worker down silently: report it
            log.exception("training %s crashed", block.experiment)
            await self._report_failure(block, f"{type(error).__name__}: {error}")

    async def _report_failure(self, block: Block, reason: str, transient: bool = False) -> None:
        for slot in block.cells or block.slots:
            await block.report_failure(slot, reason, transient=transient)
