"""Failures: a dead worker's cells are replaced by spares (restored from their newest state) or the
grid shrinks around them — a partitioned grid only in the classes that lost cells."""

from __future__ import annotations

import asyncio
import logging
import time

from palomino.grid import Coord, Topology, rectangle, relayout
from palomino.grid.partition import Partition, class_rectangle
from palomino.services.orchestrator.experiment import Experiment
from palomino.services.orchestrator.experiment_store import write_collected
from palomino.services.orchestrator.placement import SHOWN, Placement, bounded, per_cell_level
from palomino.services.orchestrator.results import Results
from palomino.services.orchestrator.shared import Shared
from palomino.transport.control_channel import cell_address
from palomino.wire.control_messages import Resize

log = logging.getLogger(__name__)


class Recovery:
    def __init__(self, shared: Shared, placement: Placement, results: Results) -> None:
        self.shared, self.placement, self.results = shared, placement, results
        self._missing: dict[str, set[str]] = {}  # experiment → the workers it was last told are missing

    async def check_cells(self, experiment: Experiment) -> None:
        ttl = experiment.config.distributed.heartbeat_ttl
        missing = {
            coord: w
            for coord, w in experiment.cells.items()
            if coord not in experiment.done and self.shared.is_missing(w, ttl)
        }
        if set(missing.values()) != self._missing.get(experiment.id, set()):
            # Dashboards learn of the lost heartbeats now (their tiles turn dead), not only from the
            # new layout that follows GATHER seconds later.
            self._missing[experiment.id] = set(missing.values())
            if missing:
                await self.shared.event(experiment, "topology", experiment.summary(self.shared.alive))
        self.placement.prefetch(experiment, missing)  # their states, while GATHER decides
        if not any(self.shared.is_dead(w, ttl) for w in missing.values()):
            return
        # With those that died with it (shared.GATHER): one epoch for them all.
        await self.handle_dead(experiment, missing, f"no heartbeat for {ttl:.0f} s")

    async def handle_dead(self, experiment: Experiment, dead: dict[Coord, str], why: str) -> None:
        """Replace `dead` cells from spares or shrink the grid (distributed.on_failure): for lost
        heartbeats, and for a worker that could not reach the broker (its Failed says transient)."""
        ttl = experiment.config.distributed.heartbeat_ttl
        self.shared.counters["failures_handled"] += len(dead)
        level = per_cell_level(len(dead), logging.WARNING)
        for coord, worker in dead.items():
            log.log(level, "worker %s (cell %s of %s) is dead: %s", worker, coord, experiment.id, why)
            self.shared.workers.pop(worker, None)
        if level == logging.DEBUG:
            log.warning("%d workers of %s are dead (%s): %s …", len(dead), experiment.id, why,
                        ", ".join(f"{w} ({c})" for c, w in list(dead.items())[:SHOWN]))  # fmt: skip
        policy = experiment.config.distributed.on_failure
        spares = self.shared.spares(ttl)
        if policy == "replace" or (policy == "auto" and len(spares) >= len(dead)):
            if len(spares) >= len(dead):
                await self._replace(experiment, dead, spares)
                return
            log.warning("not enough spares to replace %d cells: shrinking instead", len(dead))
        await self.shrink(experiment, dead)

    async def _replace(self, experiment: Experiment, dead: dict[Coord, str], spares: list[str]) -> None:
        level = per_cell_level(len(dead), logging.INFO)
        for (coord, worker), spare in zip(dead.items(), spares):
            experiment.cells[coord] = spare
            experiment.failures.append(
                {"worker": worker, "cell": str(coord), "action": "replace", "by": spare, "at": time.time()}
            )
            log.log(
                level, "cell %s of %s: %s replaces %s from its newest checkpoint", coord, experiment.id, spare, worker
            )
        if level == logging.DEBUG:
            log.info("%d cells of %s replaced by spares", len(dead), experiment.id)
        await self.placement.new_epoch(experiment, experiment.topology.rows, experiment.topology.cols)
        await self.placement.assign_all(experiment, {coord: experiment.cells[coord] for coord in dead}, restore=True)

    def plan_shrink(
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

    async def shrink(self, experiment: Experiment, dead: dict[Coord, str]) -> None:
        plan = self.plan_shrink(experiment, dead)
        if isinstance(plan, str):
            await self.placement.end(experiment, "failed", plan)
            return
        placed, rows, cols, partition = plan
        survivors = [w for c, w in sorted(experiment.cells.items()) if c not in dead]
        moved = {w for c, w in placed.items() if experiment.cells.get(c) != w}
        released = [w for w in survivors if w not in placed.values()]
        self._record_shrink(experiment, dead, f"{rows}x{cols}", partition)
        working = set(self.shared.working_on(experiment)) - set(dead.values())
        await self._rename_results(experiment, placed)
        await self._new_histories(experiment, placed)
        was_at = {w: c for c, w in experiment.cells.items()}
        experiment.moved_from = {w: was_at[w] for c, w in placed.items() if w in working and was_at[w] != c}
        experiment.cells = placed
        experiment.partition = partition
        topology = await self.placement.new_epoch(experiment, rows, cols)
        log.info(
            "experiment %s shrinks to %d×%d (epoch %d); %d moved, %d released",
            *(experiment.id, rows, cols, topology.epoch, len(moved), len(released)),
        )
        await self._send_resizes(experiment, placed, [w for w in released if w in working], working, topology)
        await self.results.maybe_finish(experiment)

    @staticmethod
    def _record_shrink(experiment: Experiment, dead: dict[Coord, str], shape: str, partition: Partition | None) -> None:
        for coord, worker in dead.items():
            to = shape
            if partition is not None:  # the class's new sub-grid
                grid = partition.grid_for(experiment.partition.class_of(coord))
                to = f"class {grid.label}: {grid.rows}x{grid.cols}"
            experiment.failures.append(
                {"worker": worker, "cell": str(coord), "action": "shrink", "to": to, "at": time.time()}
            )

    @staticmethod
    async def _rename_results(experiment: Experiment, placed: dict[Coord, str]) -> None:
        """Cells that already finished keep their result, under their (possibly new) coordinate."""
        result_of = {experiment.cells[c]: r for c, r in experiment.done.items()}
        experiment.done = {c: result_of[w] for c, w in placed.items() if w in result_of}
        for coord, result in experiment.done.items():
            result.cell = str(coord)
            await asyncio.to_thread(write_collected, experiment.run.path, result)  # kept under its new name

    async def _new_histories(self, experiment: Experiment, placed: dict[Coord, str]) -> None:
        """A coordinate taken by another worker starts a new history: the old one is set aside,
        so a later restore never picks up the previous occupant's individuals."""
        for coord, worker in placed.items():
            folder = experiment.run.checkpoint_dir(coord)
            if experiment.cells.get(coord) != worker:
                if folder.exists():
                    folder.rename(folder.with_name(f"{coord}.before-epoch-{experiment.topology.epoch + 1}"))
                experiment.history_since[coord] = experiment.topology.epoch + 1
                await self.placement.forget_published(experiment, coord)

    async def _send_resizes(
        self, experiment: Experiment, placed: dict[Coord, str], released: list[str], working: set[str], grid: Topology
    ) -> None:
        """Each working cell's new coordinate and grid; released workers go free. Published concurrently."""
        messages = []
        for coord, worker in placed.items():
            if worker in working:  # finished cells and workers on other experiments are left alone
                self.shared.workers[worker].coord = coord
                rows, cols = experiment.shape_of(coord)
                messages.append(Resize(experiment=experiment.id, worker=worker, coord=tuple(coord), rows=rows, cols=cols, epoch=grid.epoch))  # fmt: skip
        for worker in released:
            self.shared.workers[worker].free()
            messages.append(Resize(experiment=experiment.id, worker=worker, coord=None, rows=grid.rows, cols=grid.cols, epoch=grid.epoch))  # fmt: skip
        await bounded(self.shared.control.send(cell_address(m.worker), m) for m in messages)
