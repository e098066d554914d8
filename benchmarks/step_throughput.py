"""Training throughput: one cell's iteration against a plain PyTorch GAN loop.

A cell takes the same two Adam steps per batch as a plain GAN loop (one generator step,
one discriminator step). Its fitness evaluation, selection, replacement and mixture work
happen once per iteration, so over a realistic iteration they should cost little:
the target is cell samples/s ≥ 0.9 × plain samples/s.

What is measured, per network, in one process:
  cell   the whole `Cell.iterate` call of the centre cell of a 3×3 von Neumann grid
         (itself + 4 neighbours, whose snapshots come from 4 other Cells' `snapshot()`),
         population 1, batch 100, fitness sample size 100, losses [minimax], mixture defaults;
  plain  the same networks (same builders), the same data tensor and batch size, the same
         number of batches, each: G step (G(z) → D → BCE → backward into G only → Adam)
         then D step (G(z') without grad → D(real), D(fake) → BCE → backward into D only
         → Adam), Adam betas (0.5, 0.999). No `.item()` per step.
samples/s = batch_size × batches / seconds. Rounds alternate plain/cell (and swap which
goes first each round) so background load falls on both; the ratio is the median of the
per-round ratios, the samples/s columns are medians over rounds.

Seconds are this process's CPU time on CPU (one torch thread by default) and wall time on
CUDA: with other jobs sharing the cores, wall time of a CPU run mostly measures their load
(`--clock wall` to use it anyway; the table always shows the other clock's ratio).

The breakdown times the functions `Cell.iterate` calls (wrapped during the timed rounds with
a clock read, and a CUDA synchronize on CUDA; nothing in palomino is edited) and shows where
a cell iteration's time goes, and how much more than the plain loop each part costs.

    python benchmarks/step_throughput.py                       # mlp and dcgan, CPU
    python benchmarks/step_throughput.py --network mlp --batches 100 --rounds 5
    python benchmarks/step_throughput.py --device cuda --batches 100
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import palomino.coevolution.cell as cell_module
from palomino.coevolution import Cell
from palomino.coevolution.individual import Individual
from palomino.config import DataConfig, ExperimentConfig
from palomino.data import Dataset, data_dir, load_dataset
from palomino.grid import Coord, Topology
from palomino.nn import build_discriminator, build_generator, get_loss

TARGET = 0.9
SAMPLE_SHAPE = (1, 28, 28)
# On one CPU thread a DCGAN batch (width 64) takes ~0.45 s, so 100 batches per round would take
# minutes: by default the CPU run uses 10 DCGAN batches and projects the ratio to 100 (see below).
DEFAULT_BATCHES = {"cuda": {"mlp": 100, "dcgan": 100}, "cpu": {"mlp": 100, "dcgan": 10}}
PROJECT_TO = 100


# ---- setup ------------------------------------------------------------------------------------


def load_data(data_dir: Path) -> tuple[Dataset, str]:
    """The MNIST test split if it is there, otherwise random images of the same shape."""
    try:
        dataset = load_dataset(DataConfig(name="mnist", dir=data_dir, split="test", download=False), 0)
        return dataset, f"MNIST test split from {data_dir} ({len(dataset)} images)"
    except Exception as e:  # noqa: BLE001 - any failure means: use the fallback, and say so
        samples = torch.rand((10_000, *SAMPLE_SHAPE), generator=torch.Generator().manual_seed(0)) * 2 - 1
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return Dataset(
            "random", samples, None, "image"
        ), f"RANDOM tensors (10000, 1, 28, 28) in [-1, 1] - no MNIST: {reason}"


def make_config(network: str, batches: int, batch_size: int, device: str) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "bench",
            "seed": 0,
            "device": device,
            "grid": {"rows": 3, "cols": 3, "neighbourhood": "von_neumann"},
            "training": {
                "batch_size": batch_size,
                "batches_per_iteration": batches,
                "population_size": 1,
                "losses": ["minimax"],
                "fitness": {"sample_size": 100},
            },
            "data": {"name": "mnist", "split": "test"},
            # Lipizzaner's perceptron: latent 64, hidden 256; DCGAN: latent 64, width 64.
            "network": {"name": network, "latent_dim": 64, "hidden": 256, "width": 64},
        }
    )


def make_cell(config: ExperimentConfig, dataset: Dataset, device: str) -> tuple[Cell, dict[Coord, Any]]:
    """The centre cell of a 3×3 grid and snapshots of its 4 von Neumann neighbours."""
    topology = Topology(3, 3, "von_neumann")
    centre = Coord(1, 1)
    cell = Cell(centre, topology, config, dataset, experiment="bench", device=device)
    neighbours = {}
    for coord in topology.neighbours(centre):
        other = Cell(coord, topology, config, dataset, experiment="bench", device=device)
        neighbours[coord] = other.snapshot()
    return cell, neighbours


class PlainGAN:
    """A textbook GAN loop on the same networks, data and batch as the cell."""

    def __init__(self, config: ExperimentConfig, dataset: Dataset, device: str) -> None:
        torch.manual_seed(1)
        self.device = torch.device(device)
        self.G = build_generator(config.network, dataset.sample_shape, dataset.kind).to(self.device)
        self.D = build_discriminator(config.network, dataset.sample_shape, dataset.kind).to(self.device)
        betas = config.training.adam_betas
        lr = config.training.learning_rate
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=lr, betas=betas)
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=lr, betas=betas)
        self.loss = get_loss("minimax")
        self.data = dataset.samples.to(self.device)
        self.batch_size = config.training.batch_size
        self.latent = config.network.latent_dim
        self.order = torch.randperm(len(self.data), device=self.device)
        self.cursor = 0

    def run(self, batches: int) -> torch.Tensor:
        g_params, d_params = list(self.G.parameters()), list(self.D.parameters())
        total = torch.zeros((), device=self.device)
        for _ in range(batches):
            if self.cursor + self.batch_size > len(self.order):
                self.order = torch.randperm(len(self.data), device=self.device)
                self.cursor = 0
            real = self.data[self.order[self.cursor : self.cursor + self.batch_size]]
            self.cursor += self.batch_size
            n = real.shape[0]
            # Generator step.
            fake = self.G(torch.randn(n, self.latent, device=self.device))
            g_loss = self.loss.generator(self.D(fake))
            self.opt_g.zero_grad(set_to_none=True)
            g_loss.backward(inputs=g_params)
            self.opt_g.step()
            # Discriminator step.
            with torch.no_grad():
                fake = self.G(torch.randn(n, self.latent, device=self.device))
            d_loss = self.loss.discriminator(self.D, real, fake)
            self.opt_d.zero_grad(set_to_none=True)
            d_loss.backward(inputs=d_params)
            self.opt_d.step()
            total += g_loss.detach() + d_loss.detach()
        return total


# ---- timing -----------------------------------------------------------------------------------


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def timed(fn: Callable[[], Any], device: str) -> dict[str, float]:
    """Seconds of fn() on both clocks: wall, and this process's CPU time (all its threads)."""
    sync(device)
    start = {name: clock() for name, clock in CLOCKS.items()}
    fn()
    sync(device)
    return {name: clock() - start[name] for name, clock in CLOCKS.items()}


class Probe:
    """Times the functions `Cell.iterate` calls, in call order, without editing palomino."""

    def __init__(self, device: str, clock: str) -> None:
        self.device = device
        self.clock = CLOCKS[clock]
        self.events: list[tuple[str, float, bool]] = []  # (name, seconds, inside the mixture)
        self._in_mixture = False
        self.called: set[str] = set()

    def wrap(self, name: str, fn: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            inside = self._in_mixture
            if name == "mixture_of":
                self._in_mixture = True
            sync(self.device)
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                sync(self.device)
                self.events.append((name, self.clock() - start, inside))
                if name == "mixture_of":
                    self._in_mixture = False

        return wrapper

    MODULE_HOOKS = ("fitness_tables", "neighbourhood_select", "replace")  # names cell.py imports
    CELL_HOOKS = (
        "_from_snapshot",
        "_generate",
        "_train",
        "mixture_draw",
        "mixture_of",
        "apply_mixture",
    )

    @contextlib.contextmanager
    def attached(self, cell: Cell) -> Iterator[None]:
        """Wrap what exists; a hook cell.py no longer has is skipped (its time lands in 'other')."""
        saved_module = {n: getattr(cell_module, n) for n in self.MODULE_HOOKS if hasattr(cell_module, n)}
        saved_clone = getattr(Individual, "clone", None)
        wrapped_cell = [n for n in self.CELL_HOOKS if hasattr(cell, n)]
        for n, fn in saved_module.items():
            setattr(cell_module, n, self.wrap(n, fn))
        if saved_clone is not None:
            Individual.clone = self.wrap("clone", saved_clone)  # type: ignore[method-assign]
        for n in wrapped_cell:
            setattr(cell, n, self.wrap(n.lstrip("_"), getattr(cell, n)))
        try:
            yield
        finally:
            for n, fn in saved_module.items():
                setattr(cell_module, n, fn)
            if saved_clone is not None:
                Individual.clone = saved_clone  # type: ignore[method-assign]
            for n in wrapped_cell:
                delattr(cell, n)  # back to the class's method

    def phases(self, total: float) -> dict[str, float]:
        """One iteration's events → seconds per phase (call order tells fitness from re-evaluation)."""
        out: dict[str, float] = defaultdict(float)
        generate_seen = table_seen = 0
        for name, seconds, inside in self.events:
            self.called.add(name)
            if name == "from_snapshot":
                out["neighbour snapshots → modules"] += seconds
            elif name == "generate" and inside:
                out["mixture: generate"] += seconds
            elif name == "generate":
                out["fitness (all-vs-all)" if generate_seen == 0 else "re-evaluation"] += seconds
                generate_seen += 1
            elif name == "fitness_tables":
                out["fitness (all-vs-all)" if table_seen == 0 else "re-evaluation"] += seconds
                table_seen += 1
            elif name in ("neighbourhood_select", "clone"):
                out["selection (tournament + clone)"] += seconds
            elif name == "train":
                out["training (batches)"] += seconds
            elif name == "replace":
                out["replacement"] += seconds
            elif name == "mixture_of":
                out["mixture: MMD kernels"] += seconds  # its generate is subtracted below
            elif name in ("mixture_draw", "apply_mixture"):
                out["mixture: (1+1)-ES"] += seconds  # the draw and the ES's steps
        out["mixture: MMD kernels"] -= out["mixture: generate"]
        out["other (report, bookkeeping)"] = total - sum(out.values())
        self.events.clear()
        return dict(out)


PHASE_ORDER = (
    "neighbour snapshots → modules",
    "fitness (all-vs-all)",
    "selection (tournament + clone)",
    "training (batches)",
    "re-evaluation",
    "replacement",
    "mixture: generate",
    "mixture: MMD kernels",
    "mixture: (1+1)-ES",
    "other (report, bookkeeping)",
)


def bench_network(
    network: str,
    batches: int,
    rounds: int,
    warmup: int,
    device: str,
    dataset: Dataset,
    breakdown: bool,
    clock: str,
) -> dict[str, Any]:
    config = make_config(network, batches, 100, device)
    cell, neighbours = make_cell(config, dataset, device)
    plain = PlainGAN(config, dataset, device)
    probe = Probe(device, clock)
    other = "wall" if clock == "cpu" else "cpu"
    samples = config.training.batch_size * batches

    # Warm-up: allocator, kernels, and the cell's first iteration (it builds its neighbour slots).
    config.training.batches_per_iteration = warmup
    cell.iterate(neighbours)
    config.training.batches_per_iteration = batches
    timed(lambda: plain.run(warmup), device)

    per_round: list[dict[str, Any]] = []
    for r in range(rounds):
        got: dict[str, Any] = {}
        for which in ("plain", "cell") if r % 2 == 0 else ("cell", "plain"):
            if which == "plain":
                got["plain"] = timed(lambda: plain.run(batches), device)
            elif breakdown:
                with probe.attached(cell):
                    got["cell"] = timed(lambda: cell.iterate(neighbours), device)
                got["phases"] = probe.phases(got["cell"][clock])
            else:
                got["cell"] = timed(lambda: cell.iterate(neighbours), device)
        per_round.append(got)
        p, c = got["plain"], got["cell"]
        print(
            f"  {network} round {r + 1}/{rounds}: {clock} plain {p[clock]:.2f} s, cell {c[clock]:.2f} s, "
            f"ratio {p[clock] / c[clock]:.3f} ({other}: {p[other]:.2f} s, {c[other]:.2f} s)",
            file=sys.stderr,
            flush=True,
        )

    def med(fn: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(fn(g) for g in per_round)

    ratios = [g["plain"][clock] / g["cell"][clock] for g in per_round]
    out: dict[str, Any] = {
        "network": network,
        "batches": batches,
        "plain": med(lambda g: samples / g["plain"][clock]),
        "cell": med(lambda g: samples / g["cell"][clock]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "other_ratio": med(lambda g: g["plain"][other] / g["cell"][other]),
        "plain_seconds": med(lambda g: g["plain"][clock]),
        "clock": clock,
    }
    if breakdown:
        out["phases"] = {k: med(lambda g: g["phases"].get(k, 0.0)) for k in PHASE_ORDER}  # noqa: B023 — called at once
        # Paired within a round, so load that slowed both rounds' halves alike cancels.
        hooks = {n.lstrip("_") for n in (*Probe.MODULE_HOOKS, *Probe.CELL_HOOKS, "clone")}
        out["hooks_not_called"] = sorted(hooks - probe.called)
        out["train_minus_plain"] = med(lambda g: g["phases"]["training (batches)"] - g["plain"][clock])
        out["fixed"] = med(lambda g: g["cell"][clock] - g["phases"]["training (batches)"])
    return out


# ---- report -----------------------------------------------------------------------------------


def print_breakdown(result: dict[str, Any]) -> None:
    phases, batches = result["phases"], result["batches"]
    plain = result["plain_seconds"]
    per_batch = plain / batches
    total = sum(phases.values())
    print(
        f"\n{result['network']}: where one cell iteration goes ({batches} batches; {result['clock']} clock, "
        "medians over rounds; batches≈ = in plain-loop batches)"
    )
    print(f"  {'phase':32} {'ms':>9} {'% iter':>7} {'batches≈':>9}")
    for name in PHASE_ORDER:
        print(
            f"  {name:32} {phases[name] * 1e3:9.1f} {100 * phases[name] / total:6.1f}% {phases[name] / per_batch:9.2f}"
        )
    print(f"  {'total':32} {total * 1e3:9.1f}")
    if result["hooks_not_called"]:
        print(f"  (not timed - cell.py changed? {', '.join(result['hooks_not_called'])}: their time is in 'other')")
    fixed, extra_train = result["fixed"], result["train_minus_plain"]
    print(f"  plain loop, same batches: {plain * 1e3:.1f} ms ({per_batch * 1e3:.2f} ms/batch)")
    print(
        f"  cell − plain (paired per round): training loop {extra_train * 1e3:+.1f} ms "
        f"({extra_train / batches * 1e3:+.2f} ms/batch), once-per-iteration work {fixed * 1e3:.1f} ms "
        f"(= {fixed / per_batch:.2f} batches)"
    )
    # Once-per-iteration work does not grow with the batches; project to other iteration lengths.
    for b in sorted({batches, PROJECT_TO}):
        with_loop = per_batch * b / (per_batch * b + extra_train / batches * b + fixed)
        fixed_only = per_batch * b / (per_batch * b + fixed)
        print(
            f"  projected ratio at {b:3d} batches/iteration: {with_loop:.3f} "
            f"(once-per-iteration work alone: {fixed_only:.3f})"
        )
    print(
        f"  ratio ≥ {TARGET} needs ≥ {fixed / per_batch * TARGET / (1 - TARGET):.0f} batches/iteration "
        f"even with a training loop as fast as plain"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--network", nargs="+", choices=("mlp", "dcgan"), default=["mlp", "dcgan"])
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help="batches per iteration (= per round); default 100, except dcgan on CPU: 10 (projected to 100)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per network (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up batches (plus one cell iteration)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads; default 1 on CPU (see benchmarks/README.md: steadier under other jobs' load), "
        "torch's default on CUDA; 0 = torch's default",
    )
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default=None,
        help="seconds measured on: cpu = this process's CPU time (default on CPU: other jobs' load does "
        "not inflate it), wall = wall clock (default on CUDA); the table shows the other clock's ratio too",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=data_dir("mnist"),
        help="MNIST directory, test split (default: $PALOMINO_DATA_DIR/mnist, else the user cache's)",
    )
    parser.add_argument("--no-breakdown", action="store_true", help="time the cell with no wrappers at all")
    parser.add_argument(
        "--profile", action="store_true", help="also print torch.profiler's top ops of one cell iteration"
    )
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda, but torch.cuda.is_available() is False")
    threads = args.threads if args.threads is not None else (0 if args.device.startswith("cuda") else 1)
    if threads:
        torch.set_num_threads(threads)

    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    clock = args.clock or ("wall" if kind == "cuda" else "cpu")
    other = "wall" if clock == "cpu" else "cpu"
    dataset, source = load_data(args.data_dir)
    print(f"data: {source}")
    print(
        f"device: {args.device} (torch {torch.__version__}, {torch.get_num_threads()} threads); "
        f"3×3 grid, von Neumann, population 1, batch 100, fitness 100 samples, losses [minimax], "
        f"mixture score_samples {make_config('mlp', 1, 100, 'cpu').training.mixture.score_samples}; "
        f"{args.rounds} rounds, alternating plain/cell; clock: {clock}"
    )
    results = []
    for network in args.network:
        batches = args.batches or DEFAULT_BATCHES[kind][network]
        print(f"{network}: {batches} batches per iteration", flush=True)
        results.append(
            bench_network(
                network, batches, args.rounds, args.warmup, args.device, dataset, not args.no_breakdown, clock
            )
        )

    print(
        f"\n{'network':8} {'batches':>7} {'plain samples/s':>16} {'cell samples/s':>15} {'cell/plain':>11}"
        f" {'rounds min–max':>15} {other + '-clock ratio':>17}"
    )
    for r in results:
        flag = "" if r["ratio"] >= TARGET else "  below target"
        spread = f"{r['ratio_min']:.2f}–{r['ratio_max']:.2f}"
        print(
            f"{r['network']:8} {r['batches']:7d} {r['plain']:16.0f} {r['cell']:15.0f} {r['ratio']:11.3f}"
            f" {spread:>15} {r['other_ratio']:17.3f}{flag}"
        )
    print(f"target ≥ {TARGET}   (cell/plain: median over rounds of plain seconds / cell seconds, {clock} clock)")
    for r in results:
        if "phases" in r:
            print_breakdown(r)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for network in args.network:
            batches = args.batches or DEFAULT_BATCHES[kind][network]
            config = make_config(network, batches, 100, args.device)
            cell, neighbours = make_cell(config, dataset, args.device)
            cell.iterate(neighbours)  # warm-up
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if kind == "cuda" else [])
            with profile(activities=activities) as prof:
                cell.iterate(neighbours)
            key = "self_cuda_time_total" if kind == "cuda" else "self_cpu_time_total"
            print(f"\n{network}: torch.profiler, one cell iteration ({batches} batches), top ops by {key}")
            print(prof.key_averages().table(sort_by=key, row_limit=15))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
