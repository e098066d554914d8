"""The referee: Palomino's grid vs one plain GAN vs N independent GANs, at equal total compute.

This file is the command that joins its parts: its cases (referee_cases.py), how it scores
(referee_scoring.py), what it trains beside the grid (referee_methods.py) and its table
(referee_table.py).

For a grid of N cells × S optimiser steps each (generator + discriminator steps, counted by the
trainer in metrics.jsonl), on the same data and seeds:
- grid       Palomino's result, the mixture `palomino sample` draws from (result/);
- plain      one GAN with the grid's total steps: same networks, loss, Adam; no coevolution
             (--plain-scale S: the same samples in batches S times larger, "plain-batch×S");
- indep-best N independent GANs with S steps each, the one whose MMD² to the training data is lowest;
- indep-mix  their equal-weight mixture.
- grid-alone, grid-no-selection, grid-no-mutation  with --ablations (all three, or those named):
             the grid without communication (no neighbours), without selection (tournaments of one,
             generational replacement) and without its cells' own policies (no learning-rate
             mutation, the first loss only, as the baselines train); where the grid has nothing of
             it to take away (no neighbourhood; one individual a cell and no migrants; one loss and
             no mutation) its own run is the row.
- indep-regions  with training.data_regions: N independent GANs, GAN i on exactly the data cell i
             trains on (its k-means region), mixed by their data's share: the grid's data split
             without coevolution, so the table tells what each of the two contributes.
- indep-regions-search  the same GANs mixed by the grid's own ensemble search (forward selection,
             then a (1+1)-ES, on the grid's score) where the case's ensemble scope is grid, instead
             of by data share: the search without the coevolution.
Toys: modes covered and high-quality share (HQ) of 2,500 samples, and per-cell diversity (modes
covered by each cell's own generator, their union). Images: FID with the classifier extractor and
TVD of its predicted class histogram, against held-out real images the GANs never saw, and beside
FID the memorization ratio (palomino.scoring.memorization): the median pixel distance of a sample to
its nearest training image over that of a held-out image. About 1 for new images; a row whose mean
is below 0.9 is flagged as memorizing (`memorizing` in table.json, `!` in the printed table), for
FID rewards copies of the training images.

Tuned baselines (`--rates 1e-4 2e-4 5e-4 1e-3`): every method, the grid included, trains at each
learning rate with its own budget; each is shown at the rate its validation scores liked best
(toys: modes, then HQ, of other samples; images: FID against 1,000 training images set aside,
never trained on and never the held-out images the table reports). The `lr` column lists the
rate each seed chose; table.json keeps every rate's results under "sweep".

    python benchmarks/quality.py --quick                  # a few minutes: ring 3×3, short, 2 seeds
    python benchmarks/quality.py ring-3x3 grid-4x4        # 5 seeds each (the default)
    python benchmarks/quality.py mnist-1x1 mnist-2x2 mnist-3x3 --seeds 0 1 --set training.iterations=20
    python benchmarks/quality.py --out bench/quality      # table.json, table.png and the runs there
    python benchmarks/quality.py ring-3x3 --seeds 0 1 2 --rates 1e-4 2e-4 5e-4 1e-3   # tuned
    python benchmarks/quality.py mnist-3x3 --seeds 0 --ablations --baselines regions  # grid variants only
    python benchmarks/quality.py mnist-3x3 --seeds 0 --ablations grid-no-mutation --baselines regions
    python benchmarks/quality.py mnist-3x3 --seeds 0 --extractor lipizzaner  # FID on Lipizzaner's MNIST CNN

Baselines train on two threads (one torch thread each) while nothing else runs: the plain GAN's
steps in sequence on one; on the other the N independent GANs as one stack (palomino.baselines:
every step one batched update for all of them), then those on the regions; without the plain GAN
the stacks have both. `--device cuda` trains the grid and the baselines on a GPU; samples are
scored on the CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its parts, beside it

import referee_scoring
from referee_cases import BASELINES, CASES, MNIST, MNIST_DIR, ROOT, THREADS, VALIDATION, Case, Result
from referee_methods import (
    ABLATIONS,
    Baseline,
    _cells,
    communicates,
    grid_steps,
    mutates,
    own_generator,
    plain_setting,
    regions_baseline,
    run_grid,
    searched_weights,
    selects,
    train_baselines,
    without_mutation,
    without_neighbours,
    without_selection,
)
from referee_scoring import IMAGE_SAMPLES, SAMPLES, Referee, draw, selection_score, split_data
from referee_table import format_table, plot, report, shown, summarise, write_table

from palomino.baselines import Budget
from palomino.config import ExperimentConfig
from palomino.config.loading import load_config
from palomino.runs.images import picture_samples, progress_png
from palomino.runs.mixture import Mixture
from palomino.scoring import mode_coverage


@dataclass(frozen=True)
class Options:
    """How every case is run: the device; `ablations`: which of ABLATIONS to run, the grid again
    without communication (grid.neighbourhood none: each cell alone, the same policies),
    "grid-alone", without selection, "grid-no-selection", without its cells' own policies,
    "grid-no-mutation"; which baselines to train (plain, indep: best and mix,
    regions); the network whose features score images (classifier: Palomino's CNN; lipizzaner:
    Lipizzaner's MNIST CNN, for FIDs beside its published ones); `plain_scale` S: the plain GAN
    takes the grid's samples as batches S times larger in S times fewer steps (an 8×8 or 12×12
    grid's total steps in sequence outlast a short GPU run), its row then "plain-batch×S"."""

    device: str = "cpu"
    ablations: tuple[str, ...] = ()
    baselines: tuple[str, ...] = BASELINES
    extractor: str = "classifier"
    plain_scale: int = 1


def evaluate_case(
    name: str, seed: int, overrides: list[str], out: Path, options: Options = Options(), sweeping: bool = False
) -> list[Result]:
    """Every method's Result for one case, seed and learning rate; `sweeping`: each also scored on
    the validation split (images: VALIDATION training images set aside; toys: other samples)."""
    device, ablations, baselines = options.device, options.ablations, options.baselines
    case = CASES[name]
    config = load_config(
        ROOT / "examples" / f"{case.example}.yaml", [*case.overrides, *overrides, f"seed={seed}", f"device={device}"]
    )
    train, held_out, validation = split_data(config, seed, VALIDATION if sweeping else 0)
    referee = Referee(config, train, held_out, out, validation, options.extractor)
    latent, n = config.network.latent_dim, referee.sample_count()
    rate = config.training.learning_rate if sweeping else None

    def judged(method: str, steps: int, seconds: float, sample: Callable[[int], torch.Tensor]) -> Result:
        """Scored on samples of seed + 100; when sweeping also on the validation split (seed + 300)."""
        samples = sample(seed + 100)
        if held_out is not None:  # images: what the table's figures score, as a picture (the first 64)
            folder = out / "samples"
            folder.mkdir(parents=True, exist_ok=True)
            at_rate = "" if rate is None else f"-lr{rate:g}"
            picture = samples[: picture_samples("image")].reshape(-1, *train.samples.shape[1:])
            (folder / f"{name}-seed{seed}{at_rate}-{method}.png").write_bytes(progress_png(picture, "image"))
        result = Result(name, seed, method, steps, seconds, referee.score(samples), rate)
        if sweeping:
            result.validation = referee.score(sample(seed + 300), validation=True)
        return result

    if referee.extractor is not None:  # the grid's ensemble optimises FID on these features (training data)
        config = config.model_copy(
            update={"scoring": config.scoring.model_copy(update={"classifier": referee.classifier})}
        )
    run, grid_seconds = run_grid(config, train, out / name)
    g, d, cells = grid_steps(run)
    result = Mixture.load(run.result_dir)
    grid = judged("grid", g + d, grid_seconds, lambda at: result.sample(n, seed=at, data_space=False))
    ablated = []

    def variant(method: str, changed: ExperimentConfig, folder: str) -> Result:
        """The grid once more with `changed`, in its own run directory, scored as the grid is."""
        variant_run, seconds = run_grid(changed, train, out / name / folder)
        mixture = Mixture.load(variant_run.result_dir)
        return judged(
            method, sum(grid_steps(variant_run)[:2]), seconds, lambda at: mixture.sample(n, seed=at, data_space=False)
        )

    for method in ablations:
        folder, takes_out, applies = ABLATIONS[method]
        if applies(config):
            ablated.append(variant(method, takes_out(config), folder))
        else:  # nothing to take away: the grid's own run is the row
            print(f"{name} seed {seed} {method}: the grid's own run (its settings have nothing of it)")
            ablated.append(replace(grid, method=method))
    if held_out is None:  # per-cell diversity: each cell's own generator, and their union
        per_cell = [
            mode_coverage(draw([own_generator(run, c)], np.ones(1), n, latent, seed + 200), train.modes, train.mode_std)
            for c in sorted(_cells(run))
        ]
        union = np.array([[k >= 20 for k in p.counts] for p in per_cell]).any(0).sum()
        grid.scores.update(
            cell_modes=float(np.mean([p.covered for p in per_cell])),
            union=int(union),
            used=int((result.weights > 0).sum()),
        )

    # The plain GAN takes the grid's total steps in sequence on one thread; meanwhile the N
    # independent GANs (and those on the regions) train on the other, each set as one stack.
    # Without the plain GAN they have all of the grid's threads.
    torch.set_num_threads(1 if "plain" in baselines else THREADS)
    per = Budget(g // cells, d // cells)
    plain_config, plain_budget, plain_name = plain_setting(config, Budget(g, d), options.plain_scale)
    with ThreadPoolExecutor(1) as thread:
        plain_job = (
            thread.submit(train_baselines, plain_config, [train], plain_budget, [seed + 1000], device)
            if "plain" in baselines
            else None
        )
        indep = (
            train_baselines(config, [train] * cells, per, [seed + 2000 + i for i in range(cells)], device)
            if "indep" in baselines
            else None
        )
        with_regions = config.training.data_regions and "regions" in baselines
        regions = regions_baseline(seed, config, train, per, device) if with_regions else None
        plain_done = plain_job.result() if plain_job is not None else None
    baseline = Baseline(config, train, n, seed)
    results = [grid, *ablated]
    if plain_done is not None:
        (plain,), (plain_critic,), plain_seconds = plain_done
        steps = plain_budget.generator + plain_budget.discriminator
        results.append(
            judged(plain_name, steps, plain_seconds, lambda at: baseline.sample([plain], [plain_critic], at=at))
        )
    if indep is not None:
        nets, critics, seconds = indep
        best = min(range(len(nets)), key=lambda i: selection_score(nets[i], train, latent, seed, referee))
        results.append(
            judged("indep-best", g + d, seconds, lambda at: baseline.sample([nets[best]], [critics[best]], at=at))
        )
        results.append(judged("indep-mix", g + d, seconds, lambda at: baseline.sample(nets, critics, at=at)))
    if regions is not None:
        trained, parts, region_seconds = regions
        shares = np.array([len(part) for part in parts], dtype=float)
        steps = (per.generator + per.discriminator) * len(parts)
        results.append(
            judged(
                "indep-regions",
                steps,
                region_seconds,
                lambda at: baseline.sample(*trained, shares / shares.sum(), own_data=parts, at=at),
            )
        )
        if config.training.ensemble.scope == "grid":
            start = time.perf_counter()
            weights = searched_weights(config, train, *trained)
            seconds = region_seconds + time.perf_counter() - start
            results.append(
                judged(
                    "indep-regions-search",
                    steps,
                    seconds,
                    lambda at: baseline.sample(*trained, weights, own_data=parts, at=at),
                )
            )
    return results


def sweep_case(
    name: str, seed: int, overrides: list[str], out: Path, rates: list[float], options: Options = Options()
) -> tuple[list[Result], list[Result]]:
    """(each method at the rate its validation scores liked best, every rate's results): every
    method, the grid included, runs at each rate with its own budget; the pick never looks at the
    held-out split the table reports."""
    every = [
        r
        for rate in rates
        for r in evaluate_case(name, seed, [*overrides, f"training.learning_rate={rate}"], out, options, sweeping=True)
    ]
    return pick(every), every


def pick(every: list[Result]) -> list[Result]:
    """Per method, the result whose validation scores are best (the first rate on a tie)."""
    return [
        min((r for r in every if r.method == method), key=lambda r: Referee.worse(r.validation))
        for method in dict.fromkeys(r.method for r in every)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help=f"cases (default: ring-3x3 grid-4x4); any of {', '.join(CASES)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 3 4 (--quick: 0 1)")
    parser.add_argument("--quick", action="store_true", help="short runs of ring-3x3, 2 seeds: a few minutes")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="passed to every run"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="keep runs, table.json, table.png and samples/ (images: 64 of each method's scored samples, a PNG) here (default: a temp dir)",
    )
    parser.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=None,
        metavar="LR",
        help="sweep training.learning_rate over these for every method (grid included), each at its own budget; "
        "the table shows each method at the rate its validation split liked best (e.g. 1e-4 2e-4 5e-4 1e-3)",
    )
    parser.add_argument(
        "--device", default="cpu", help="train the grid and the baselines here (cuda: a GPU); scored on the CPU"
    )
    parser.add_argument(
        "--ablations",
        nargs="*",
        choices=tuple(ABLATIONS),
        default=None,
        help="also the grid with something taken out (alone: all three; else those named): grid-alone "
        "(grid.neighbourhood=none, each cell alone with the same policies), grid-no-selection (tournaments of one, "
        "generational replacement), grid-no-mutation (no learning-rate mutation, the first loss only); one more "
        "grid run each per case, seed and rate, none where the grid has nothing of it to take away",
    )
    parser.add_argument(
        "--baselines",
        nargs="*",
        choices=BASELINES,
        default=list(BASELINES),
        help="which baselines to train (default all): plain, indep (indep-best and indep-mix), regions "
        "(indep-regions); fewer when comparing variants of the grid",
    )
    parser.add_argument(
        "--plain-scale",
        type=int,
        default=1,
        metavar="S",
        help="the plain GAN sees the grid's samples in batches S times larger and S times fewer steps (default 1: "
        "the grid's steps in sequence); for the large grids, whose steps in sequence outlast a short GPU run",
    )
    parser.add_argument(
        "--extractor",
        choices=("classifier", "lipizzaner"),
        default="classifier",
        help="the features images are scored on (and the grid's ensemble chosen on): classifier (Palomino's CNN) or "
        "lipizzaner (Lipizzaner's MNIST CNN, for FIDs beside its published ones); trained once into --out",
    )
    args = parser.parse_args(argv)
    cases = args.cases or (["ring-3x3"] if args.quick else ["ring-3x3", "grid-4x4"])
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]}; choose from {', '.join(CASES)}")
    seeds = args.seeds or ([0, 1] if args.quick else [0, 1, 2, 3, 4])
    if args.plain_scale < 1:
        parser.error(f"--plain-scale {args.plain_scale}: must be ≥ 1 (1: the grid's steps in sequence)")
    ablations = () if args.ablations is None else tuple(args.ablations or ABLATIONS)
    options = Options(args.device, ablations, tuple(args.baselines), args.extractor, args.plain_scale)
    with tempfile.TemporaryDirectory(prefix="quality-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        results: list[Result] = []
        swept: list[Result] = []
        header = {
            "cases": cases,
            "seeds": seeds,
            "overrides": args.overrides,
            "quick": args.quick,
            "rates": args.rates,
            "baselines": args.baselines,
            "ablations": list(ablations),
            "extractor": args.extractor,
            "plain_scale": args.plain_scale,
        }
        done: list[list[Any]] = []
        for name in cases:
            overrides = [*(CASES[name].quick if args.quick else ()), *args.overrides]
            for seed in seeds:
                if args.rates:
                    chosen, every = sweep_case(name, seed, overrides, out, args.rates, options)
                    swept.extend(every)
                    for r in every:
                        report(r, "validation " + shown(r.validation) + "; ")
                else:
                    chosen = evaluate_case(name, seed, overrides, out, options)
                for r in chosen:
                    results.append(r)
                    report(r, "chosen: " if args.rates else "")
                done.append([name, seed])
                if args.out:  # a long run stopped early keeps the seeds it finished
                    write_table(out, {**header, "finished": done}, results, swept)
        rows = write_table(out, {**header, "finished": True}, results, swept)
        print(format_table(rows))
        plot(rows, out / "table.png")
        if args.out:
            print(f"\n{out / 'table.json'}  {out / 'table.png'}", file=sys.stderr)
    return 0


# What benchmarks/lipizzaner.py and the tests take from the referee, wherever it lives in its parts.
__all__ = [
    "ABLATIONS", "BASELINES", "CASES", "IMAGE_SAMPLES", "MNIST", "MNIST_DIR", "SAMPLES", "THREADS", "Case", "Options",
    "Referee", "Result", "communicates", "draw", "evaluate_case", "format_table", "grid_steps", "main", "mutates",
    "pick", "referee_scoring", "run_grid", "selects", "split_data", "summarise", "train_baselines", "without_mutation",
    "without_neighbours", "without_selection",
]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
