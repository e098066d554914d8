"""Layouts: starting an experiment on the spare workers, assigning a cell (restored from its newest
checkpoint or snapshot), new epochs, and ending an experiment (its workers stopped and freed)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from aiormq.exceptions import AMQPError

from palomino.errors import PalominoError
from palomino.grid import Coord, Topology, rectangle
from palomino.grid.blocks import place_blocks
from palomino.runs.checkpoints import newest_valid
from palomino.services.common.states import State
from palomino.services.orchestrator.experiment import Experiment, class_layout
from palomino.services.orchestrator.records import RecordWriter
from palomino.services.orchestrator.shared import Shared
from palomino.transport.control_channel import cell_address
from palomino.transport.rabbitmq import forget_published, newest_published
from palomino.wire import frame
from palomino.wire.control_messages import Assign, Stop
from palomino.wire.snapshot import SnapshotHeader

log = logging.getLogger(__name__)
T = TypeVar("T")
BROKER_CALL_TIMEOUT = 10.0  # seconds for a broker call made under the lock
CONCURRENT = 64  # broker calls and state lookups in flight at once (a layout of thousands of cells)
# Past this many cells in one step, a line a cell goes to DEBUG and one line sums them up (408
# lines a step, three times, were seconds of the event loop at 4,096 slots).
PER_CELL_LINES = 16
SHOWN = 5  # cells a summary line names


def per_cell_level(cells: int, level: int) -> int:
    return logging.DEBUG if cells > PER_CELL_LINES else level


def checkpoints_below(experiment: Experiment, coord: Coord) -> int | None:
    """The oldest of `coord`'s checkpoints that failed to restore, if any: a restore takes an older one."""
    return min((i for kind, i in experiment.unusable.get(coord, set()) if kind == "checkpoint"), default=None)


async def bounded(calls: Iterable[Awaitable[T]], limit: int = CONCURRENT) -> list[T]:
    """Await `calls` concurrently, at most `limit` at a time; their results in order. Every call is
    awaited to its end even when one fails (the first error is raised after): a failure must not
    leave the rest half sent or never started."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    results = await asyncio.gather(*(one(call) for call in calls), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def in_blocks(topology: Topology, blocks: list[list[str]]) -> dict[Coord, str]:
    """Every cell of `topology` to a slot, each process's slots on a compact patch (grid/blocks.py)."""
    sizes, left = [], topology.size
    for block in blocks:
        if left <= 0:
            break
        sizes.append(min(len(block), left))
        left -= sizes[-1]
    patches = place_blocks(topology, sizes)
    return dict(sorted((coord, slot) for patch, block in zip(patches, blocks) for coord, slot in zip(patch, block)))


class Placement:
    def __init__(self, shared: Shared, records: RecordWriter) -> None:
        self.shared, self.records = shared, records
        # (experiment, coordinate) → (the `below` it was looked up with, the lookup) of missing cells
        self._prefetched: dict[tuple[str, Coord], tuple[int | None, asyncio.Task[tuple[Any, Any]]]] = {}

    async def end(self, experiment: Experiment, state: State, reason: str = "") -> None:
        experiment.state, experiment.reason, experiment.ended_at = state, reason, time.time()
        self.prefetch(experiment, ())  # lookups for cells it will never restore
        await asyncio.to_thread(experiment.persist)
        experiment.release_results()
        self.shared.boards.end(experiment)
        stop = Stop(experiment=experiment.id, reason=reason or state)
        working = self.shared.working_on(experiment)
        for worker in working:
            self.shared.workers[worker].free()

        async def tell(worker: str) -> None:
            try:
                await self.shared.control.send(cell_address(worker), stop)
            except PalominoError as error:  # the experiment ends all the same; that worker's later messages are refused
                log.warning("stop to %s not sent: %s", worker, error)

        await bounded(tell(worker) for worker in working)
        log.info("experiment %s %s%s", experiment.id, state, f": {reason}" if reason else "")
        await self.shared.event(experiment, "state", {"state": state, "reason": reason})
        await self.forget_all_published(experiment)

    async def try_start(self, experiment: Experiment) -> None:
        config = experiment.config
        low, high = config.cell_bounds
        blocks = self.shared.spare_blocks(config.distributed.heartbeat_ttl)
        spares = [slot for block in blocks for slot in block]
        waited = time.monotonic() - experiment.created
        rows, cols = (
            rectangle(min(len(spares), high), prefer=(config.grid.rows, config.grid.cols)) if spares else (0, 0)
        )
        enough = rows * cols >= low
        if config.partitioned:  # every worker gets a cell of some class, at least one per class
            enough = min(len(spares), high) >= max(low, len(config.data.labels or ()))
        if len(spares) < high and not (waited >= config.distributed.start_timeout and enough):
            if waited >= config.distributed.start_timeout and not enough:
                await self.end(
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
                await self.end(
                    experiment,
                    "failed",
                    f"only {len(spares)} workers after {config.distributed.start_timeout:.0f} s; "
                    f"a partitioned run needs at least one per class ({len(config.data.labels or ())})",
                )
                return
            rows, cols = experiment.partition.rows, max(g.cols for g in experiment.partition.grids)
        topology = Topology(rows, cols, config.grid.neighbourhood, epoch=0)
        if experiment.partition:
            experiment.cells = dict(zip(experiment.partition.cells(), spares))
        else:
            experiment.cells = in_blocks(topology, blocks)
        experiment.topology = topology
        experiment.laid_out.update(experiment.cells)
        experiment.state = "running"
        experiment.record_layout()
        layout = {str(c): w for c, w in experiment.cells.items()}
        if len(layout) > PER_CELL_LINES:
            log.info("experiment %s starts on %d×%d (%d workers)", experiment.id, rows, cols, len(layout))
            log.debug("experiment %s: %s", experiment.id, layout)
        else:
            log.info("experiment %s starts on %d×%d: %s", experiment.id, rows, cols, layout)
        await self.assign_all(experiment, experiment.cells)
        await self.shared.event(experiment, "topology", experiment.summary(self.shared.alive))

    async def assign(self, experiment: Experiment, coord: Coord, worker: str, restore: bool = False) -> None:
        await self.assign_all(experiment, {coord: worker}, restore)

    async def assign_all(self, experiment: Experiment, targets: dict[Coord, str], restore: bool = False) -> None:
        """Assign each coordinate to its worker, restored (`restore`) from its newest usable state:
        the states looked up and the Assigns published concurrently, the records of iterations
        the newcomers redo dropped in one rewrite of metrics.jsonl while the Assigns go out."""
        topology = experiment.topology
        assert topology is not None
        for coord, worker in targets.items():
            self.shared.workers[worker].experiment, self.shared.workers[worker].coord = experiment.id, coord
            self.shared.workers[worker].idle = False
        states: dict[Coord, tuple[bytes, dict | None]] = {}
        rewrite: asyncio.Task[None] | None = None
        if restore:
            level = per_cell_level(len(targets), logging.INFO)
            found = await bounded(self._restore_state(experiment, coord, level) for coord in targets)
            if level == logging.DEBUG:
                sources = Counter((meta or {}).get("from", "checkpoint" if payload else "scratch") for payload, meta, _ in found)  # fmt: skip
                log.info("%d cells of %s restart from %s", len(targets), experiment.id, dict(sources))
            states = {coord: (payload, meta) for coord, (payload, meta, _) in zip(targets, found)}
            rewrite = await self.records.forget(
                experiment, {str(c): resumed for c, (_, _, resumed) in zip(targets, found)}
            )
        config = experiment.config.model_dump(mode="json")

        async def send(coord: Coord, worker: str) -> None:
            payload, meta = states.get(coord, (b"", None))
            rows, cols = experiment.shape_of(coord)
            message = Assign(
                experiment=experiment.id, worker=worker, config=config, coord=tuple(coord), rows=rows, cols=cols,
                epoch=topology.epoch, restore_meta=meta,
            )  # fmt: skip
            await self.shared.control.send(cell_address(worker), message, payload)

        try:
            await bounded(send(coord, worker) for coord, worker in targets.items())
        finally:
            if rewrite is not None:  # metrics.jsonl rewritten while the Assigns went out
                await rewrite

    async def _restore_state(
        self, experiment: Experiment, coord: Coord, level: int = logging.INFO
    ) -> tuple[bytes, dict | None, int]:
        """(payload, restore_meta, the iteration it resumes at) of `coord`'s newest usable state."""
        payload, meta = b"", None
        unusable = experiment.unusable.get(coord, set())
        below = checkpoints_below(experiment, coord)
        found = self._prefetched.pop((experiment.id, coord), None)
        if found is None or found[0] != below:
            checkpoint, snapshot = await self._look_up(experiment, coord, below)
        else:
            checkpoint, snapshot = await found[1]
        resumed, chosen = 0, None
        if checkpoint is not None:
            payload, meta = checkpoint.payload, checkpoint.meta
            resumed, chosen = checkpoint.iteration, ("checkpoint", checkpoint.iteration)
        if snapshot is not None and snapshot[1] > resumed and ("snapshot", snapshot[1]) not in unusable:
            if self._recorded(experiment, coord, snapshot[1]):  # newer than the checkpoint
                payload, meta = snapshot[0], {"from": "snapshot", "iteration": snapshot[1]}
                resumed, chosen = snapshot[1], ("snapshot", snapshot[1])
            else:  # a cell records an iteration before publishing its snapshot; a record lost on the
                # way (or forgotten) would leave that iteration unrecorded for good
                log.log(level, "cell %s of %s: its newest snapshot (iteration %d) is ahead of its records; not used",
                         coord, experiment.id, snapshot[1] - 1)  # fmt: skip
        if chosen is not None:
            experiment.restoring[coord] = chosen
        source = (meta or {}).get("from", "a checkpoint" if payload else "scratch")
        log.log(level, "cell %s of %s restarts at iteration %d from %s", coord, experiment.id, resumed, source)
        return payload, meta, resumed

    async def _look_up(self, experiment: Experiment, coord: Coord, below: int | None) -> tuple[Any, Any]:
        """`coord`'s newest valid checkpoint (older than `below`, when given) and newest published
        snapshot: what a restore chooses from."""
        folder = experiment.run.checkpoint_dir(coord)
        checkpoint = await asyncio.to_thread(newest_valid, folder, None if below is None else below - 1, raw=True)
        return checkpoint, await self.newest_published(experiment, coord)

    def prefetch(self, experiment: Experiment, missing: Iterable[Coord]) -> None:
        """Start looking up the states of cells whose worker is missing (its heartbeat expired) but
        not yet dead: the 2 s that decide whether others died with it (shared.GATHER) overlap the
        lookups — at 4,096 slots, 408 cells' were 3.2 s. A killed worker publishes nothing more, so
        what is found stays the newest; lookups of cells no longer missing are dropped."""
        missing = set(missing)
        for key in [k for k in self._prefetched if k[0] == experiment.id and k[1] not in missing]:
            self._prefetched.pop(key)[1].cancel()
        for coord in missing:
            if (experiment.id, coord) not in self._prefetched:
                below = checkpoints_below(experiment, coord)
                task = asyncio.create_task(self._look_up(experiment, coord, below))
                self._prefetched[(experiment.id, coord)] = (below, task)

    @staticmethod
    def _recorded(experiment: Experiment, coord: Coord, resumes_at: int) -> bool:
        """Whether the iteration before `resumes_at` is recorded for `coord` (each iteration once: a
        later record of the dead cell is dropped, as it no longer holds the coordinate)."""
        return resumes_at == 0 or (str(coord), resumes_at - 1) in experiment.recorded

    async def newest_published(self, experiment: Experiment, coord: Coord) -> tuple[bytes, int] | None:
        """(body, the iteration it resumes at) of the newest snapshot `coord` published, if any."""
        try:
            # Bounded: this runs under the orchestrator's lock, and a broker outage must not hold it.
            body = await asyncio.wait_for(
                self._newest_published(experiment, coord),
                BROKER_CALL_TIMEOUT,
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

    async def forget_published(self, experiment: Experiment, coord: Coord) -> None:
        try:
            await asyncio.wait_for(self._forget_published(experiment, coord), BROKER_CALL_TIMEOUT)
        except (TimeoutError, AMQPError, RuntimeError, ConnectionError) as error:
            log.warning("last-value queue of %s not deleted: %s", coord, error)

    async def _newest_published(self, experiment: Experiment, coord: Coord) -> bytes | None:
        channel = await self.shared.control.side_channel()
        return await newest_published(channel, experiment.id, coord, self.shared.settings.signer)

    async def _forget_published(self, experiment: Experiment, coord: Coord) -> None:
        await forget_published(await self.shared.control.side_channel(), experiment.id, coord)

    async def forget_all_published(self, experiment: Experiment) -> None:
        """The experiment is over: nothing will be restored from its snapshots any more."""
        await bounded(self.forget_published(experiment, coord) for coord in sorted(experiment.laid_out))

    async def new_epoch(self, experiment: Experiment, rows: int, cols: int) -> Topology:
        old = experiment.topology
        assert old is not None
        experiment.topology = Topology(rows, cols, old.kind, old.epoch + 1)
        experiment.laid_out.update(experiment.cells)
        experiment.record_layout()
        await self.shared.event(experiment, "topology", experiment.summary(self.shared.alive))
        return experiment.topology
