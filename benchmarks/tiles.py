"""Tiles: members × batches per second, a tile's stacked training against its cells one by one.

Two measurements, in one process, on one device:

  steps   For K cells of an MNIST perceptron grid (Lipizzaner's: latent 64, hidden 256,
          batch 100, population 1), one iteration's training phase of `--batches` batches:
          `train_tile` on all K lanes at once against `Training.run` cell after cell, on the
          same selected individuals. members × batches/s = K × batches / seconds; the ratio is
          tiled / one by one. One by one is timed on min(K, --alone) cells and scaled to K
          (its cost is linear in K: nothing is shared between cells).
  grid    `--grid R`: a whole R×R grid's iterations as `palomino train` runs them (Tile.iterate:
          each cell's fitness and selection, the stacked training, re-evaluation, replacement
          and mixture; plus the snapshots the cells exchange), seconds per iteration split by
          phase, projected to `--project` batches per cell (120,000: 200 epochs of 60,000 images).
  count   `--count-ops`: for each K of `--cells`, one whole iteration of a K-cell tile as a GPU runs
          it (its cells' halves batched, no call made a cell for a CPU's exactness; after a
          warm-up one), counted instead of timed: aten ops dispatched by phase (a TorchDispatchMode in
          the thread that runs the tile) and host syncs: reads back to the host, counted by
          palomino.nn.host, which every transfer goes through (on a GPU each waits for the queue;
          tests/test_host_transfers.py keeps other transfers out of the code). A launch-bound GPU costs about what an iteration
          dispatches and waits for; this is how that is measured on a machine without one.
  parallel  `--parallel`: what a second core gives a tile on a CPU, wall clock: each K of
          `--cells` trained as one stack in one thread, then as two stacks of half the lanes each
          (what `palomino train` does on two cores) in two threads of one process, then in two
          processes at once. Threads share one interpreter: each torch call from Python takes
          its lock back, so two stacks' threads may wait for each other between kernels;
          processes cannot. The two ratios side by side say what that lock costs.
  baselines  `--baselines N …`: the referee's N independent plain GANs (palomino.baselines),
          `--batches` generator and discriminator steps each, trained as one stack against one
          after another (what benchmarks/quality.py did before); GANs × steps per second, ratio.

Networks (`--model`): Lipizzaner's MNIST perceptron, the toys' (examples/ring-3x3.yaml:
Tanh, hidden 128, on 2-D points), or Palomino's 28×28 DCGAN / SNGAN on MNIST (`--width`,
default 64: examples/fashion-mnist-dcgan-2x2.yaml's; a stack of them is grouped convolutions).
`--model lipizzaner`: the same perceptron in Lipizzaner's faithful mode (examples/lipizzaner-mnist-3x3.yaml's
settings: one opponent a batch, neighbours' frozen copies stacked, the mixture's FID on its CNN).
Data: the MNIST test split from `--data-dir` (default: palomino.data.data_dir("mnist"):
$PALOMINO_DATA_DIR/mnist, else the user cache's), else random images
of the same shape (said on the `data:` line). Seconds are this process's CPU time on the CPU
(one torch thread: other jobs' load does not inflate it; `--clock wall` to use wall time) and
wall time with a synchronize on CUDA.

    python benchmarks/tiles.py                                # K = 1, 9, 36 on the CPU
    python benchmarks/tiles.py --model ring --cells 1 9 36 144 --grid 3
    python benchmarks/tiles.py --cells 1 9 36 144 576 --device cuda
    python benchmarks/tiles.py --cells --grid 12 --device cuda --iterations 3
    python benchmarks/tiles.py --count-ops --cells 1 9 36 144 --batches 50
    python benchmarks/tiles.py --model ring --cells --baselines 1 9 16 --batches 200
    python benchmarks/tiles.py --model ring --cells 9 16 --batches 50 --parallel
    python benchmarks/tiles.py --model dcgan --cells 1 9 36 --device cuda
    python benchmarks/tiles.py --model dcgan --width 16 --cells 1 4 --batches 4   # a CPU look
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from palomino.baselines import Budget, train_independent
from palomino.coevolution import Cell
from palomino.coevolution.tile import Tile, _split
from palomino.coevolution.tile_data import TileData
from palomino.coevolution.tile_lanes import Lane
from palomino.coevolution.tile_training import train_tile
from palomino.config import DataConfig, ExperimentConfig
from palomino.config.loading import load_config
from palomino.data import Dataset, data_dir, load_dataset
from palomino.grid import Coord, Topology

try:  # the revisions before issue 34 had no transfer helper: their syncs are not counted
    from palomino.nn import host
except ImportError:
    host = None  # type: ignore[assignment]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SHAPES = {1: (1, 1), 9: (3, 3), 36: (6, 6), 144: (12, 12), 576: (24, 24)}


def load_data(where: Path) -> tuple[Dataset, str]:
    """The MNIST test split if it is there, otherwise random images of the same shape."""
    try:
        dataset = load_dataset(DataConfig(name="mnist", dir=where, split="test", download=False), 0)
        return dataset, f"MNIST test split ({len(dataset)} images)"
    except Exception as e:  # noqa: BLE001 - any failure means: use the fallback, and say so
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    samples = torch.rand((10_000, 1, 28, 28), generator=torch.Generator().manual_seed(0)) * 2 - 1
    return Dataset("random", samples, None, "image"), f"RANDOM images (10000, 1, 28, 28) - no MNIST: {reason}"


def network_of(model: str, width: int) -> dict:
    """Lipizzaner's MNIST perceptron; the toys' (examples/ring-3x3.yaml): Tanh, hidden 128; a DCGAN/SNGAN."""
    if model in ("dcgan", "sngan"):
        return {"name": model, "latent_dim": 64, "width": width}
    return {"name": "mlp", "latent_dim": 64, "hidden": 128 if model == "ring" else 256}


def make_config(
    rows: int, cols: int, batches: int, device: str, model: str = "mnist", width: int = 64
) -> ExperimentConfig:
    if model == "lipizzaner":  # the faithful example at this size (the cells get the data they are given)
        sizes = [f"grid.rows={rows}", f"grid.cols={cols}", f"training.batches_per_iteration={batches}"]
        return load_config(EXAMPLES / "lipizzaner-mnist-3x3.yaml", [*sizes, f"device={device}", "data.split=test"])
    ring = model == "ring"
    return ExperimentConfig.model_validate(
        {
            "name": "tiles",
            "device": device,
            "grid": {"rows": rows, "cols": cols, "neighbourhood": "von_neumann"},
            "training": {
                "batch_size": 100,
                "batches_per_iteration": batches,
                "population_size": 1,
                "learning_rate": 0.0002,
                "losses": ["nonsaturating"],
                "fitness": {"sample_size": 1000},
                "mixture": {"score_samples": 1000},
            },
            "data": {"name": "gaussian_ring"} if ring else {"name": "mnist", "split": "test"},
            "network": network_of(model, width),
        }
    )


def make_cells(config: ExperimentConfig, dataset: Dataset) -> list[Cell]:
    topology = Topology(config.grid.rows, config.grid.cols, config.grid.neighbourhood)
    return [
        Cell(Coord(*c), topology, config, dataset, experiment="tiles", device=config.device) for c in topology.cells()
    ]


def neighbourhoods(cells: list[Cell]) -> dict[Coord, dict]:
    snapshots = {cell.coord: cell.snapshot() for cell in cells}
    return {cell.coord: {n: snapshots[n] for n in cell.topology.neighbours(cell.coord)} for cell in cells}


class Clock:
    def __init__(self, device: str, kind: str) -> None:
        self.cuda = device.startswith("cuda")
        self.read = time.perf_counter if self.cuda or kind == "wall" else time.process_time

    def time(self, work: Callable[[], object]) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        start = self.read()
        work()
        if self.cuda:
            torch.cuda.synchronize()
        return self.read() - start


def lanes_of(cells: list[Cell]) -> list[Lane]:
    """Each cell's lane after one real selection (its clones, ready to train)."""
    seen = neighbourhoods(cells)
    lanes = []
    for cell in cells:
        chosen = cell.select(seen[cell.coord])
        lanes.append(Lane(cell.training, chosen.generators, chosen.discriminators, cell.iteration))
    return lanes


def steps(args: argparse.Namespace, dataset: Dataset, clock: Clock) -> None:
    what = {
        "ring": "the ring's perceptrons (hidden 128, Tanh)",
        "mnist": "MNIST perceptrons (hidden 256)",
        "lipizzaner": "MNIST perceptrons (hidden 256) in Lipizzaner's faithful mode",
    }.get(args.model, f"MNIST {args.model.upper()}s (28×28, width {args.width})")
    print(f"\nsteps: {args.batches} batches of 100 per cell, {what}, {args.rounds} rounds (median)")
    compiled_head = f" {'compiled ms/batch':>18} {'× eager':>8} {'compiling s':>12}" if args.compile else ""
    print(f"{'K':>5} {'tiled m·b/s':>12} {'alone m·b/s':>12} {'ratio':>7} {'tiled ms/batch':>15}{compiled_head}")
    for k in args.cells:
        rows, cols = SHAPES.get(k, (1, k))
        cells = make_cells(make_config(rows, cols, args.batches, args.device, args.model, args.width), dataset)
        lanes = lanes_of(cells)
        alone = lanes[: min(k, args.alone)]
        train_tile(lanes)  # warm-up: allocations, kernels
        for lane in alone[:1]:
            lane.training.run(lane.generators, lane.discriminators, 0)
        tiled_s, alone_s = [], []
        for _ in range(args.rounds):
            tiled_s.append(clock.time(lambda lanes=lanes: train_tile(lanes)))
            one = clock.time(
                lambda alone=alone: [lane.training.run(lane.generators, lane.discriminators, 0) for lane in alone]
            )
            alone_s.append(one * k / len(alone))
        tiled, by_one = statistics.median(tiled_s), statistics.median(alone_s)
        rate = k * args.batches
        compiled = ""
        if args.compile:  # the same lanes through the compiled steps (tile_compiled.py), compiled first
            data = TileData(compiled=True, graphs=args.graphs)
            first = clock.time(lambda lanes=lanes, data=data: train_tile(lanes, data))
            times = [clock.time(lambda lanes=lanes, data=data: train_tile(lanes, data)) for _ in range(args.rounds)]
            fast = statistics.median(times)
            compiled = f" {1000 * fast / args.batches:>18.2f} {tiled / fast:>7.2f}× {first - fast:>12.1f}"
        print(
            f"{k:>5} {rate / tiled:>12,.0f} {rate / by_one:>12,.0f} {by_one / tiled:>6.1f}× "
            f"{1000 * tiled / args.batches:>15.2f}{compiled}"
            + ("" if len(alone) == k else f"   (one by one: {len(alone)} cells, scaled)")
        )


def grid(args: argparse.Namespace, dataset: Dataset, clock: Clock) -> None:
    side = args.grid
    config = make_config(side, side, args.batches, args.device, args.model, args.width)
    compiled = ("graphs" if args.graphs else "on") if args.compile else "off"
    config = config.model_copy(update={"compile": compiled})  # not auto: say which (model_copy checks nothing)
    cells = make_cells(config, dataset)
    tile = Tile(cells)
    phases = {"select": 0.0, "train": 0.0, "complete": 0.0, "exchange": 0.0}
    inside = [False]  # a phase inside another (a cell's fallback in the tile's batched call) is the outer's

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*a, **kw):
            if inside[0]:
                return fn(*a, **kw)
            inside[0] = True
            start = clock.read()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] += clock.read() - start
                inside[0] = False

        return wrapper

    seen = neighbourhoods(cells)
    tile.iterate(seen)  # warm-up iteration
    with phases_wrapped(timed):
        total = 0.0
        for _ in range(args.iterations):
            start = clock.read()
            seen = timed("exchange", neighbourhoods)(cells)
            tile.iterate(seen)
            if clock.cuda:
                torch.cuda.synchronize()
            total += clock.read() - start
    per = total / args.iterations
    iterations = math.ceil(args.project / args.batches)
    print(
        f"\ngrid {side}×{side} ({len(cells)} cells), {args.batches} batches per iteration, {args.iterations} iterations"
        f"{', compiled' if args.compile else ''}{' with CUDA graphs' if args.compile and args.graphs else ''}:"
    )
    for name, seconds in phases.items():
        print(f"  {name:<9} {seconds / args.iterations:8.3f} s/iteration  ({seconds / total:5.1%})")
    print(f"  {'total':<9} {per:8.3f} s/iteration")
    print(
        f"  projected to {args.project:,} batches per cell ({iterations:,} iterations): "
        f"{per * iterations / 60:,.1f} min; training steps alone {phases['train'] / args.iterations * iterations / 60:,.1f} min"
    )


class OpCounter(TorchDispatchMode):
    """aten ops dispatched in this thread, by the phase set in `phase`. (Syncs are not read off
    the ops: on a CPU every tensor is on the host, so `float(t)` of a table already read back and
    of a device tensor look alike. They are the reads palomino.nn.host counts.)"""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "other"
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[self.phase] += 1
        return func(*args, **(kwargs or {}))


PHASES = ("exchange", "select", "train", "complete", "other")
# The cell's methods a tile calls, by phase (select was one method before the tile batched fitness).
PHASE_OF = {
    "select": "select",
    "prepare": "select",
    "choose": "select",
    "complete": "complete",
    "re_evaluate": "complete",
    "finish": "complete",
    "replace": "complete",
    "mixture_draw": "complete",
    "apply_mixture": "complete",
    "conclude": "complete",
}
# What a tile batches across its cells.
TILE_PHASES = {"_fitness": "select", "_re_evaluate": "complete", "_mixtures": "complete"}


def _phases_of_cell() -> dict[str, Callable]:
    return {name: getattr(Cell, name) for name in PHASE_OF if hasattr(Cell, name)}


def _phases_of_tile() -> dict[str, Callable]:
    return {name: getattr(Tile, name) for name in TILE_PHASES if hasattr(Tile, name)}


@contextlib.contextmanager
def phases_wrapped(wrap: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """The cell's and the tile's phase methods and train_tile replaced by `wrap(phase, fn)` while
    the block runs (whichever of them this revision has), and put back after."""
    import palomino.coevolution.tile as tile_module

    cell_originals, tile_originals, train_original = _phases_of_cell(), _phases_of_tile(), tile_module.train_tile
    for name, fn in cell_originals.items():
        setattr(Cell, name, wrap(PHASE_OF[name], fn))
    for name, fn in tile_originals.items():
        setattr(Tile, name, wrap(TILE_PHASES[name], fn))
    tile_module.train_tile = wrap("train", train_original)
    try:
        yield
    finally:
        for name, fn in cell_originals.items():
            setattr(Cell, name, fn)
        for name, fn in tile_originals.items():
            setattr(Tile, name, fn)
        tile_module.train_tile = train_original


def count_iteration(cells: list[Cell]) -> dict:
    """One whole iteration of `cells` as one tile (after a warm-up one), counted by phase."""
    # What a GPU runs (a CPU evaluates fitness cell by cell, and where a cell has one member, makes
    # its call alone for exactness); revisions before those choices run as they did.
    parameters = inspect.signature(Tile).parameters
    gpu_form = {name: value for name, value in (("batched", True), ("exact", False)) if name in parameters}
    tile = Tile(cells, **gpu_form)
    tile.iterate(neighbourhoods(cells))  # warm-up: slots built, first reshuffles
    counter = OpCounter()
    traffic = None  # the open tally, once counting starts
    reads: Counter[str] = Counter()
    uploads: Counter[str] = Counter()

    def phased(name: str, fn: Callable) -> Callable:
        """A phase inside another (a cell's fallback inside the tile's batched call) counts as the
        outer one; what no phase counts is `other` (the tile's own work)."""

        def wrapper(*a, **kw):
            if counter.phase != "other":
                return fn(*a, **kw)
            before = (traffic.reads, traffic.uploads) if traffic is not None else (0, 0)
            counter.phase = name
            try:
                return fn(*a, **kw)
            finally:
                counter.phase = "other"
                if traffic is not None:
                    reads[name] += traffic.reads - before[0]
                    uploads[name] += traffic.uploads - before[1]

        return wrapper

    with phases_wrapped(phased), counter:
        if host is not None:
            with host.counting() as traffic:
                tile.iterate(phased("exchange", neighbourhoods)(cells))
            reads["other"] = traffic.reads - sum(reads.values())
            uploads["other"] = traffic.uploads - sum(uploads.values())
        else:
            tile.iterate(phased("exchange", neighbourhoods)(cells))
    syncs = {p: reads[p] for p in PHASES} if host is not None else None
    return {"ops": {p: counter.ops[p] for p in PHASES}, "syncs": syncs, "uploads": dict(uploads)}


def count_ops(args: argparse.Namespace, dataset: Dataset) -> None:
    print(
        f"\ncount: one whole iteration of a K-cell tile, {args.batches} batches per cell, {args.model} networks: "
        "ops dispatched (per cell where a phase is per cell) and host syncs"
    )
    print(
        f"{'K':>5} {'ops/iter':>10} {'per cell':>9} {'exchange/c':>11} {'select/c':>9} {'train/batch':>12} "
        f"{'complete/c':>11} {'other':>7} {'syncs/iter':>11} {'per cell':>9} {'uploads':>8}"
    )
    rows = []
    for k in args.cells:
        r, c = SHAPES.get(k, (1, k))
        cells = make_cells(make_config(r, c, args.batches, args.device, args.model, args.width), dataset)
        counted = count_iteration(cells)
        ops, syncs = counted["ops"], counted["syncs"]
        total = sum(ops.values())
        sync_total = sum(syncs.values()) if syncs is not None else None
        rows.append({"cells": k, "batches": args.batches, **counted, "ops_total": total, "syncs_total": sync_total})
        shown = "n/a" if sync_total is None else f"{sync_total:,}"
        per = "" if sync_total is None else f"{sync_total / k:.1f}"
        print(
            f"{k:>5} {total:>10,} {total / k:>9,.0f} {ops['exchange'] / k:>11,.0f} {ops['select'] / k:>9,.0f} "
            f"{ops['train'] / args.batches:>12,.0f} {ops['complete'] / k:>11,.0f} {ops['other']:>7,} "
            f"{shown:>11} {per:>9} {sum(counted['uploads'].values()):>8,}"
        )
        if syncs is not None:
            print("      syncs by phase: " + ", ".join(f"{p} {syncs[p]}" for p in PHASES if syncs[p]))
        del cells
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "device": args.device, "rows": rows}, indent=1) + "\n")
        print(f"written: {args.json}")


# What the profiler records that launches no kernel on a device: views, allocations, metadata, and
# torch.compile's own bookkeeping around a compiled region.
NOT_LAUNCHES = {
    "aten::as_strided", "aten::resolve_conj", "detach", "aten::detach", "aten::view", "aten::_unsafe_view",
    "aten::reshape", "aten::_reshape_alias", "aten::alias", "aten::empty", "aten::empty_strided", "aten::flatten",
    "aten::result_type", "aten::_has_compatible_shallow_copy_type", "aten::to", "aten::t", "aten::transpose",
    "aten::unsqueeze", "aten::expand", "aten::squeeze", "aten::select", "aten::slice", "aten::unbind",
    "aten::split", "aten::lift_fresh", "TorchDynamo Cache Lookup", "Pregraph bytecode",
    "AOTDispatcher Runtime Wrapper Prologue",
}  # fmt: skip


def count_launches(args: argparse.Namespace, dataset: Dataset) -> None:
    """A tile's training batch, eager against compiled: the profiler's leaf events that compute (an
    aten op, an inductor kernel, an extern matmul), what a GPU would launch — a projection, counted
    on any device; and the host syncs (`aten::item`, `_local_scalar_dense`) among them."""
    torch._inductor.config.cpp.enable_kernel_profile = True  # CPU kernels show in the profile by name
    print(f"\nlaunches: one training call of a K-cell tile ({args.batches} batches), per batch, {args.model} networks")
    print(f"{'K':>5} {'eager':>8} {'compiled':>9} {'ratio':>6} {'syncs eager/compiled':>21}")
    for k in args.cells:
        r, c = SHAPES.get(k, (1, k))
        lanes = lanes_of(make_cells(make_config(r, c, args.batches, args.device, args.model, args.width), dataset))
        counts = []
        for compiled in (False, True):
            data = TileData(compiled=compiled)
            train_tile(lanes, data)  # compiles; allocations
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
                train_tile(lanes, data)
            leaves = [e for e in profile.events() if not e.cpu_children and e.name not in NOT_LAUNCHES]
            syncs = sum(e.name == "aten::_local_scalar_dense" for e in leaves)
            counts.append((len(leaves) - syncs, syncs))
        (eager, eager_syncs), (fused, fused_syncs) = counts
        print(
            f"{k:>5} {eager / args.batches:>8.1f} {fused / args.batches:>9.1f} {eager / fused:>5.1f}× "
            f"{eager_syncs:>10} / {fused_syncs:<9}"
        )


def halves(lanes: list[Lane]) -> list[list[Lane]]:
    """A tile's lanes in two stacks, split as Tile splits them for two workers."""
    return _split(lanes, 2)


def timed_rounds(work: Callable[[], object], args: argparse.Namespace) -> float:
    """Median wall seconds of `work` over `--rounds`, after one warm-up call (synchronised on CUDA)."""
    clock = Clock(args.device, "wall")
    work()
    return statistics.median(clock.time(work) for _ in range(args.rounds))


def parallel(args: argparse.Namespace, dataset: Dataset) -> None:
    print(f"\nparallel: {args.batches} batches per cell, {args.model} networks, wall clock, median of {args.rounds}")
    print(f"{'K':>5} {'1 thread ms/b':>14} {'2 threads ms/b':>15} {'×':>6} {'2 processes ms/b':>17} {'×':>6}")
    for k in args.cells:
        rows, cols = SHAPES.get(k, (1, k))
        lanes = lanes_of(
            make_cells(make_config(rows, cols, args.batches, args.device, args.model, args.width), dataset)
        )
        one = timed_rounds(lambda lanes=lanes: train_tile(lanes), args)
        with ThreadPoolExecutor(2) as pool:
            two = timed_rounds(lambda lanes=lanes: list(pool.map(train_tile, halves(lanes))), args)
        # Each process builds the same cells (one seed) and trains its half; both start together.
        command = [sys.executable, __file__, "--model", args.model, "--width", str(args.width), "--cells", str(k)]
        command += ["--batches", str(args.batches), "--rounds", str(args.rounds), "--device", args.device]
        command += ["--data-dir", str(args.data_dir), "--threads", str(args.threads)]
        command += ["--matmul-precision", args.matmul_precision]  # the children measure what the threads did
        children = [
            subprocess.Popen([*command, "--half", str(half)], stdout=subprocess.PIPE, text=True) for half in (0, 1)
        ]
        outputs = [child.communicate()[0] for child in children]
        if any(child.returncode for child in children):
            raise SystemExit(f"a --half process failed: {outputs}")
        apart = max(float(out.split()[-1]) for out in outputs)
        per = 1000 / args.batches
        print(
            f"{k:>5} {one * per:>14.2f} {two * per:>15.2f} {one / two:>5.2f}× {apart * per:>17.2f} {one / apart:>5.2f}×"
        )


def train_half(args: argparse.Namespace, dataset: Dataset) -> None:
    """--half i (a child of --parallel): half i of the K-lane tile, its median seconds last."""
    rows, cols = SHAPES.get(args.cells[0], (1, args.cells[0]))
    cells = make_cells(make_config(rows, cols, args.batches, args.device, args.model, args.width), dataset)
    part = halves(lanes_of(cells))[args.half]
    print(f"half {args.half}: {len(part)} lanes, median seconds {timed_rounds(lambda: train_tile(part), args)}")


def baselines(args: argparse.Namespace, dataset: Dataset, clock: Clock) -> None:
    config = make_config(1, 1, args.batches, args.device, args.model)
    budget = Budget(args.batches, args.batches)
    print(f"\nbaselines: N plain GANs, {args.batches} G + {args.batches} D steps each, {args.rounds} rounds (median)")
    print(f"{'N':>5} {'stacked GAN·steps/s':>20} {'alone GAN·steps/s':>18} {'ratio':>7}")
    for n in args.baselines:
        alone = min(n, args.alone)
        stacked_s, alone_s = [], []
        train_independent(config, [dataset] * n, Budget(2, 2), range(n), args.device)  # warm-up
        for _ in range(args.rounds):
            stacked_s.append(
                clock.time(lambda n=n: train_independent(config, [dataset] * n, budget, range(n), args.device))
            )
            one = clock.time(
                lambda a=alone: train_independent(config, [dataset] * a, budget, range(a), args.device, stacked=False)
            )
            alone_s.append(one * n / alone)
        stacked, by_one = statistics.median(stacked_s), statistics.median(alone_s)
        rate = n * args.batches
        print(
            f"{n:>5} {rate / stacked:>20,.0f} {rate / by_one:>18,.0f} {by_one / stacked:>6.1f}×"
            + ("" if alone == n else f"   (one by one: {alone} GANs, scaled)")
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cells", type=int, nargs="*", default=[1, 9, 36], help="tile sizes K for `steps` (none: skip)"
    )
    parser.add_argument("--batches", type=int, default=20, help="batches per iteration")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--alone", type=int, default=9, help="time one by one on at most this many cells, scaled to K")
    parser.add_argument("--grid", type=int, default=0, help="also run an R×R grid's whole iterations (0: no)")
    parser.add_argument("--iterations", type=int, default=3, help="--grid: timed iterations")
    parser.add_argument("--baselines", type=int, nargs="*", default=[], help="the referee's N plain GANs (none: skip)")
    parser.add_argument("--project", type=int, default=120_000, help="--grid: batches per cell to project to")
    parser.add_argument(
        "--model",
        choices=["mnist", "lipizzaner", "ring", "dcgan", "sngan"],
        default="mnist",
        help="MNIST's perceptrons (in Lipizzaner's faithful mode: lipizzaner), the toys' or MNIST DCGANs/SNGANs",
    )
    parser.add_argument("--width", type=int, default=64, help="dcgan/sngan: base channel count")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="steps: also the compiled tile; grid: the grid with compile on; --count-ops: launches, eager and compiled",
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="with --compile: compiled as `compile: graphs` does (CUDA graphs replayed; on a CPU as --compile alone)",
    )
    parser.add_argument("--count-ops", action="store_true", help="count ops and host syncs per iteration instead")
    parser.add_argument(
        "--parallel", action="store_true", help="a tile's training in one thread, two threads and two processes"
    )
    parser.add_argument("--half", type=int, choices=[0, 1], help=argparse.SUPPRESS)  # a --parallel child
    parser.add_argument("--json", type=Path, help="--count-ops: also write the counts here")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="CPU: process time or wall time")
    parser.add_argument(
        "--matmul-precision",
        choices=["highest", "high", "medium"],
        default="highest",
        help="torch.set_float32_matmul_precision: high lets a GPU's float32 products run as TF32 (a change of "
        "numerics palomino train does not make; measured here for the referee to weigh)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=data_dir("mnist"),
        help="the MNIST files (default: $PALOMINO_DATA_DIR/mnist, else the user cache's)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision(args.matmul_precision)
    if args.model == "ring":
        dataset = load_dataset(DataConfig(name="gaussian_ring"), 0)
        described = f"gaussian_ring ({len(dataset)} points)"
    else:
        dataset, described = load_data(args.data_dir)
    clock = Clock(args.device, args.clock)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {args.threads} torch thread(s)"
    precision = "" if args.matmul_precision == "highest" else f"; float32 products: {args.matmul_precision} precision"
    print(f"device: {device}; clock: {'wall' if clock.read is time.perf_counter else 'process CPU time'}{precision}")
    print(f"data: {described}")
    if args.count_ops:
        count_launches(args, dataset) if args.compile else count_ops(args, dataset)
        return 0
    if args.half is not None:
        train_half(args, dataset)
        return 0
    if args.parallel:
        parallel(args, dataset)
        return 0
    if args.cells:
        steps(args, dataset, clock)
    if args.grid:
        grid(args, dataset, clock)
    if args.baselines:
        baselines(args, dataset, clock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
