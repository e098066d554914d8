"""A tile: the cells one process hosts on one device, iterated in lockstep.

Each cell still selects, re-evaluates, replaces and evolves its mixture on its own (its
`select` and `complete`); the tile trains all of them between those two halves as one stack
(tile_training.py). Outside, nothing changes: each cell keeps its snapshot, checkpoint and
report, so tiled and untiled processes share a grid and resume each other's checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch
from torch import Tensor

from palomino.coevolution.cell import Cell, IterationReport, MixtureDraw, Prepared, Selected
from palomino.coevolution.ensemble_search import FrechetScore
from palomino.coevolution.mixture_weights import MixtureScore
from palomino.coevolution.tile_fitness import batchable, generate_each, tile_fitness
from palomino.coevolution.tile_training import Lane, TileData, train_tile
from palomino.coevolution.training import read_means
from palomino.config import ExperimentConfig
from palomino.grid import Coord
from palomino.nn.stack_layout import tileable
from palomino.nn.stacked import same_architecture, stackable
from palomino.wire import Snapshot

T = TypeVar("T")

# On a CPU a stack pays while a layer's kernel is short next to its dispatch (the 2-D toys'
# perceptrons, ~40,000 parameters a cell: 2× per thread); MNIST's (~550,000) are compute-bound
# there and ran at 0.9× stacked (benchmarks/tiles.py), so `auto` leaves them one by one.
CPU_TILE_PARAMETERS = 100_000


def use_tile(config: ExperimentConfig, cells: Sequence[Cell]) -> bool:
    """Whether a process trains these cells as one tile: `tiles: on`, or `auto` where it pays —
    every network on a GPU, small perceptrons on a CPU (convolutions are compute-bound there)."""
    if config.tiles == "off" or not cells:
        return False
    if config.tiles == "on":
        return True
    networks = [cells[0].generators.best.network, cells[0].discriminators.best.network]
    if cells[0].device.type != "cpu":
        return all(tileable(network) for network in networks)
    size = sum(p.numel() for network in networks for p in network.parameters())
    return all(stackable(network) for network in networks) and size <= CPU_TILE_PARAMETERS


def use_compile(config: ExperimentConfig, device: torch.device) -> bool:
    """Whether a tile trains its batches compiled (tile_compiled.py): `compile: on`, or `auto` on a
    GPU. On this project's 2-core CPU compiling cost more than it saved (docs/speed.md)."""
    return config.compile == "on" or (config.compile == "auto" and device.type == "cuda")


class Tile:
    """`workers` > 1 (a CPU's cores): the cells' own halves run side by side in threads and the
    training in as many stacks, each on one torch thread — a lane depends on no other lane,
    so the result does not depend on `workers`. On a GPU, one stack (workers = 1)."""

    def __init__(
        self, cells: Sequence[Cell], workers: int = 1, batched: bool | None = None, exact: bool = True
    ) -> None:
        """`batched`: evaluate all cells' fitness and re-evaluation as one stack (tile_fitness.py).
        By default on a GPU, where a tile's calls cost what they dispatch; on a CPU the arithmetic
        is the cost, and one stack of every cell's activations missed the caches (the ring 3×3's
        selection took 10–15 % longer batched, benchmarks/tiles.py --grid 3). `exact=False`: a
        batched CPU tile makes the calls a GPU makes, to float rounding of each cell's own
        (benchmarks/tiles.py counts them so); by default it gives each cell its own numbers."""
        if not cells:
            raise ValueError("a tile needs at least one cell")
        first = cells[0]
        for cell in cells:
            if cell.device != first.device or cell.config is not first.config:
                raise ValueError(f"cell {cell.coord}: a tile's cells share one device and one experiment")
            if not all(tileable(ind.network) for ind in [*cell.generators, *cell.discriminators]):
                raise ValueError(f"cell {cell.coord}: its networks have no stacked form; train it with tiles: off")
        self.cells = list(cells)
        self.workers = max(1, min(workers, len(self.cells)))
        compiled = use_compile(first.config, first.device)
        strict = first.config.compile == "on"
        self.data = [TileData(compiled, strict) for _ in range(self.workers)]  # each stack's data, kept on the device
        self.batched = first.device.type != "cpu" if batched is None else batched
        self.exact = exact

    @property
    def iteration(self) -> int:
        """The iteration every cell is at (lockstep)."""
        return min(cell.iteration for cell in self.cells)

    def iterate(self, neighbours: Mapping[Coord, Mapping[Coord, Snapshot]]) -> list[IterationReport]:
        """One iteration of every cell; `neighbours[cell]` are that cell's neighbours' snapshots."""
        with ThreadPoolExecutor(self.workers) as pool:
            run = pool.map if self.workers > 1 else map
            local = {cell.coord: cell for cell in self.cells}
            prepared = list(run(lambda cell: cell.prepare(neighbours[cell.coord], local), self.cells))
            selected = list(
                run(
                    lambda args: args[0].choose(args[1], *args[2], clone=False),
                    zip(self.cells, prepared, self._fitness(prepared, run)),
                )
            )
            lanes = [
                Lane(
                    cell.training,
                    chosen.generators,
                    chosen.discriminators,
                    cell.iteration,
                    chosen.frozen_g,
                    chosen.frozen_d,
                )
                for cell, chosen in zip(self.cells, selected)
            ]
            parts = _split(lanes, self.workers)
            steps = [done for part in run(train_tile, parts, self.data[: len(parts)]) for done in part]
            read_means(steps)
            tables = self._re_evaluate(selected, run)
            list(run(lambda a: a[0].replace(a[1], *a[2]), zip(self.cells, selected, tables)))
            draws = list(run(lambda a: a[0].mixture_draw(a[1]), zip(self.cells, selected)))
            scores = self._mixtures(draws, run)
            list(run(lambda a: a[0].apply_mixture(*a[1:]), zip(self.cells, draws, scores)))
            return list(run(lambda a: a[0].conclude(*a[1:]), zip(self.cells, selected, steps)))

    def _fitness(self, prepared: list[Prepared], run: Callable) -> list[tuple[list[Tensor], Tensor, Tensor]]:
        """Every cell's fitness: as one stacked evaluation per stack where the networks allow
        (tile_fitness.py), else cell by cell."""

        def part_fitness(indices: list[int]) -> list[tuple[list[Tensor], Tensor, Tensor]]:
            jobs = [self.cells[i].fitness_job(prepared[i]) for i in indices]
            if self.batched and batchable(jobs):
                return [(r.fakes, r.g_table, r.d_table) for r in tile_fitness(jobs, self.exact)]
            return [self.cells[i].fitness(prepared[i]) for i in indices]

        return self._per_stack(part_fitness, run)

    def _re_evaluate(self, selected: list[Selected], run: Callable) -> list[tuple[Tensor, Tensor]]:
        """Every cell's re-evaluation of its trained individuals: batched per stack where the
        networks allow (two reads a stack), else cell by cell."""

        def part_tables(indices: list[int]) -> list[tuple[Tensor, Tensor]]:
            jobs = [self.cells[i].re_evaluation_jobs(selected[i]) for i in indices]
            trained_g, trained_d = [g for g, _ in jobs], [d for _, d in jobs]
            if self.batched and batchable(trained_g) and batchable(trained_d):
                g_tables = [r.g_table for r in tile_fitness(trained_g, self.exact)]
                d_tables = [r.d_table for r in tile_fitness(trained_d, self.exact)]
                return list(zip(g_tables, d_tables))
            return [self.cells[i].re_evaluate(selected[i]) for i in indices]

        return self._per_stack(part_tables, run)

    def _mixtures(self, draws: list[MixtureDraw], run: Callable) -> list[MixtureScore | FrechetScore]:
        """Every cell's mixture score: one batched scoring per stack where allowed (`batched`, one
        architecture of perceptrons, the same numbers of components and samples; MMD or FID), else
        cell by cell."""

        def part_scores(indices: list[int]) -> list[MixtureScore | FrechetScore]:
            chosen = [draws[i] for i in indices]
            if not (self.batched and _same_mixture(chosen)):
                return [self.cells[i].mixture_of(draws[i]) for i in indices]
            networks = [[g.network for g in draw.generators] for draw in chosen]
            labels = None if chosen[0].labels is None else torch.stack([d.labels for d in chosen])  # type: ignore[misc]
            fakes = generate_each(networks, torch.stack([d.z for d in chosen]), labels, self.exact)
            reals = torch.stack([d.real for d in chosen])
            if self.cells[0].config.training.mixture.score == "mmd":
                return MixtureScore.from_batch(fakes, reals)
            return self.cells[indices[0]].frechet_scores(fakes, reals, self.exact)  # fid: on Lipizzaner's CNN

        return self._per_stack(part_scores, run)

    def _per_stack(self, work: Callable[[list[int]], list[T]], run: Callable) -> list[T]:
        """`work` on each stack's cells (their indices, in contiguous runs), results in cell order."""
        parts = _split(list(range(len(self.cells))), self.workers)
        return [done for part in run(work, parts) for done in part]


def _same_mixture(draws: list[MixtureDraw]) -> bool:
    first = draws[0]
    if any(
        len(d.generators) != len(first.generators)
        or d.z.shape != first.z.shape
        or d.real.shape != first.real.shape
        or (d.labels is None) != (first.labels is None)
        for d in draws
    ):
        return False
    return same_architecture([g.network for d in draws for g in d.generators])


def _split(items: list[T], parts: int) -> list[list[T]]:
    """`items` in `parts` contiguous runs of (nearly) equal length, in order."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for part in range(parts):
        end = start + size + (part < extra)
        out.append(items[start:end])
        start = end
    return out
