"""A tile: the cells one process hosts on one device, iterated in lockstep.

A tile iterates its cells along the one iteration path (iteration.py) as its `Kernels`: each
cell still selects, replaces and evolves its mixture on its own, while the tile computes the
fitness, the training, the re-evaluation and the mixtures' scores of all of them at once, in
stacks (tile_fitness.py, tile_training.py). Outside, nothing changes: each cell keeps its
snapshot, checkpoint and report, so tiled and untiled processes share a grid and resume each
other's checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch
from torch import Tensor

from palomino.coevolution import iteration
from palomino.coevolution.cell import Cell
from palomino.coevolution.ensemble_search import FrechetScore
from palomino.coevolution.iteration import IterationReport, MixtureDraw, Prepared, Run, Selected, Tables
from palomino.coevolution.mixture_weights import MixtureScore
from palomino.coevolution.tile_data import TileData
from palomino.coevolution.tile_fitness import batchable, generate_each, tile_fitness
from palomino.coevolution.tile_lanes import Lane
from palomino.coevolution.tile_training import train_tile
from palomino.coevolution.training import Steps, read_means
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
    """Whether a tile trains its batches compiled (tile_compiled.py): `compile: on` or `graphs`, or
    `auto` on a GPU. On this project's 2-core CPU compiling cost more than it saved (docs/speed.md)."""
    return config.compile in ("on", "graphs") or (config.compile == "auto" and device.type == "cuda")


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
        strict, graphs = first.config.compile in ("on", "graphs"), first.config.compile == "graphs"
        self.data = [TileData(compiled, strict, graphs) for _ in range(self.workers)]  # each stack's, on the device
        self.batched = first.device.type != "cpu" if batched is None else batched
        self.exact = exact

    @property
    def iteration(self) -> int:
        """The iteration every cell is at (lockstep)."""
        return min(cell.iteration for cell in self.cells)

    def iterate(self, neighbours: Mapping[Coord, Mapping[Coord, Snapshot]]) -> list[IterationReport]:
        """One iteration of every cell (iteration.py, with this tile as its kernels);
        `neighbours[cell]` are that cell's neighbours' snapshots."""
        with ThreadPoolExecutor(self.workers) as pool:
            return iteration.iterate(self.cells, neighbours, self, pool.map if self.workers > 1 else map)

    # ---- the kernels (iteration.Kernels): the group's costly parts, stacked ----------------

    clones = False  # selection's winners themselves: the training copies them into its stacks

    def local(self, cells: Sequence[Cell]) -> Mapping[Coord, Cell]:
        """A neighbour of the same tile lends its individuals in place."""
        return {cell.coord: cell for cell in cells}

    def fitness(self, cells: Sequence[Cell], prepared: list[Prepared], run: Run) -> list[Tables]:
        """Every cell's fitness: as one stacked evaluation per stack where the networks allow
        (tile_fitness.py), else cell by cell."""

        def part_fitness(indices: list[int]) -> list[Tables]:
            jobs = [cells[i].fitness_job(prepared[i]) for i in indices]
            if self.batched and batchable(jobs):
                return [(r.fakes, r.g_table, r.d_table) for r in tile_fitness(jobs, self.exact)]
            return [cells[i].fitness(prepared[i]) for i in indices]

        return self._per_stack(cells, part_fitness, run)

    def train(self, cells: Sequence[Cell], selected: list[Selected], run: Run) -> list[Steps]:
        """Every cell's selected as lanes of the tile's stacks (tile_training.py), their mean
        losses read back at once."""
        lanes = [
            Lane(
                cell.training,
                chosen.generators,
                chosen.discriminators,
                cell.iteration,
                chosen.frozen_g,
                chosen.frozen_d,
            )
            for cell, chosen in zip(cells, selected)
        ]
        parts = _split(lanes, self.workers)
        steps = [done for part in run(train_tile, parts, self.data[: len(parts)]) for done in part]
        read_means(steps)
        return steps

    def re_evaluate(self, cells: Sequence[Cell], selected: list[Selected], run: Run) -> list[tuple[Tensor, Tensor]]:
        """Every cell's re-evaluation of its trained individuals: batched per stack where the
        networks allow (two reads a stack), else cell by cell."""

        def part_tables(indices: list[int]) -> list[tuple[Tensor, Tensor]]:
            jobs = [cells[i].re_evaluation_jobs(selected[i]) for i in indices]
            trained_g, trained_d = [g for g, _ in jobs], [d for _, d in jobs]
            if self.batched and batchable(trained_g) and batchable(trained_d):
                g_tables = [r.g_table for r in tile_fitness(trained_g, self.exact)]
                d_tables = [r.d_table for r in tile_fitness(trained_d, self.exact)]
                return list(zip(g_tables, d_tables))
            return [cells[i].re_evaluate(selected[i]) for i in indices]

        return self._per_stack(cells, part_tables, run)

    def mixtures(self, cells: Sequence[Cell], draws: list[MixtureDraw], run: Run) -> list[MixtureScore | FrechetScore]:
        """Every cell's mixture score: one batched scoring per stack where allowed (`batched`, one
        architecture of perceptrons, the same numbers of components and samples; MMD or FID), else
        cell by cell."""

        def part_scores(indices: list[int]) -> list[MixtureScore | FrechetScore]:
            chosen = [draws[i] for i in indices]
            if not (self.batched and _same_mixture(chosen)):
                return [cells[i].mixture_of(draws[i]) for i in indices]
            networks = [[g.network for g in draw.generators] for draw in chosen]
            labels = None if chosen[0].labels is None else torch.stack([d.labels for d in chosen])  # type: ignore[misc]
            fakes = generate_each(networks, torch.stack([d.z for d in chosen]), labels, self.exact)
            reals = torch.stack([d.real for d in chosen])
            if cells[0].config.training.mixture.score == "mmd":
                return MixtureScore.from_batch(fakes, reals)
            return cells[indices[0]].frechet_scores(fakes, reals, self.exact)  # fid: on Lipizzaner's CNN

        return self._per_stack(cells, part_scores, run)

    def _per_stack(self, cells: Sequence[Cell], work: Callable[[list[int]], list[T]], run: Run) -> list[T]:
        """`work` on each stack's cells (their indices, in contiguous runs), results in cell order."""
        parts = _split(list(range(len(cells))), self.workers)
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
