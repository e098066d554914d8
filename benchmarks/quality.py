"""The referee: Palomino's grid vs one plain GAN vs N independent GANs, at equal total compute.

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
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from palomino.baselines import Budget, train_independent
from palomino.coevolution.ensemble_search import FINE_BANDWIDTH_FACTORS, FrechetScore
from palomino.coevolution.mixture_weights import MixtureScore
from palomino.config import ExperimentConfig
from palomino.config.loading import load_config
from palomino.data import Dataset, data_dir, load_dataset
from palomino.runs.directory import RunDirectory, read_jsonl
from palomino.runs.embedded import train_embedded
from palomino.runs.filter_rule import FilterRule
from palomino.runs.images import picture_samples, progress_png
from palomino.runs.mixture import Mixture
from palomino.scoring import mode_coverage
from palomino.scoring.extractors import ensemble_features
from palomino.scoring.memorization import MEMORIZING_BELOW, MemorizationScale

ROOT = Path(__file__).resolve().parent.parent
MNIST_DIR = data_dir("mnist")  # $PALOMINO_DATA_DIR/mnist, else the user cache's
SAMPLES = 2500  # toys: points scored per generator (the literature's protocol)
IMAGE_SAMPLES = 2000  # images: samples per FID, as many as the held-out real images
BASELINES = ("plain", "indep", "regions")  # --baselines: the rows beside the grid's
THREADS = 2  # torch threads of the grid's runs (the 2-core reference machine's cores)
VALIDATION = 1000  # images set aside from the training split when --rates sweeps learning rates


@dataclass(frozen=True)
class Case:
    example: str  # examples/<example>.yaml
    overrides: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()  # extra overrides under --quick


# Images: examples/mnist-regions-3x3.yaml at its own per-cell budget for every grid size (100
# iterations × 50 batches of 100), so a bigger grid spends more in all and its baselines get as
# much. At 30 × 50 every cell's generator was still drawing blurred strokes and the grid lost to
# one plain GAN on MNIST (docs/quality.md). --quick cuts it to 4 × 20.
IMAGE_BUDGET = (
    "training.iterations=100",
    "training.batches_per_iteration=50",
    "training.sample_every=0",
    "training.checkpoint_every=0",
)
IMAGE_QUICK = ("training.iterations=4", "training.batches_per_iteration=20")
MNIST = (f"data.dir={MNIST_DIR}", "data.split=test")  # the offline copy: 8,000 images to train on, 2,000 held out
FASHION = ("data.name=fashion_mnist", "data.split=train")  # scored against its test split
CASES: dict[str, Case] = {
    "ring-3x3": Case("ring-3x3", quick=("training.iterations=30",)),
    "grid-4x4": Case("grid-4x4", quick=("training.iterations=30",)),
    **{
        f"mnist-{n}x{n}": Case(
            "mnist-regions-3x3", (*IMAGE_BUDGET, f"grid.rows={n}", f"grid.cols={n}", *MNIST), IMAGE_QUICK
        )
        for n in (1, 2, 3, 4, 5, 8, 12)
    },
    "fashion-3x3": Case(
        "mnist-regions-3x3",
        (*IMAGE_BUDGET, *FASHION, "data.size=10000"),
        IMAGE_QUICK,
    ),
    # The main case for the larger grids: all 60,000 training images (a 5×5 cell's region
    # ~2,400 of them, against MNIST's 320), scored against the 10,000 of the test split.
    **{
        f"fashion-full-{n}x{n}": Case(
            "mnist-regions-3x3",
            (*IMAGE_BUDGET, *FASHION, f"grid.rows={n}", f"grid.cols={n}"),
            IMAGE_QUICK,
        )
        for n in (1, 3, 5, 8, 12)
    },
}


@dataclass
class Result:
    case: str
    seed: int
    method: str
    steps: int
    seconds: float
    scores: dict[str, float] = field(default_factory=dict)
    rate: float | None = None  # training.learning_rate of the run (set when sweeping --rates)
    validation: dict[str, float] = field(default_factory=dict)  # the same scores on the validation split


# ---- data and scores -------------------------------------------------------------------------


def split_data(
    config: ExperimentConfig, seed: int, validation: int = 0
) -> tuple[Dataset, Dataset | None, Dataset | None]:
    """(training data, held-out data, validation data): toys are drawn anew for scoring (and sampled
    with another seed for validation); images keep 2,000 aside, and `validation` more of the
    training images when a sweep picks learning rates (never trained on, never scored against)."""
    if config.data.name.startswith("gaussian"):
        return load_dataset(config.data, seed), None, None
    from palomino.data.dataset import subset_indices
    from palomino.scoring.classifier import classifier_split

    split = classifier_split(config.data, holdout=IMAGE_SAMPLES, seed=0)
    train = split.train
    if config.data.size and config.data.size < len(train):  # the case's data.size, as `palomino train` takes it
        train = train.rows(torch.from_numpy(subset_indices(len(train), config.data.size, 0, "the training split")))
    if not validation:
        return train, split.test, None
    kept, apart = torch.arange(len(train)).split([len(train) - validation, validation])
    return train.rows(kept), split.test, train.rows(apart)


@torch.no_grad()
def draw(generators: list[torch.nn.Module], weights: np.ndarray, n: int, latent: int, seed: int) -> torch.Tensor:
    """n samples of the mixture (generator space): component i draws about n·wᵢ of them."""
    from palomino.runs.mixture import component_counts

    g = torch.Generator().manual_seed(seed)
    parts = [
        net.eval()(torch.randn(int(k), latent, generator=g))
        for net, k in zip(generators, component_counts(weights, n))
        if k
    ]
    return torch.cat(parts)


class Referee:
    """Scores samples of one case the same way for every method."""

    def __init__(
        self,
        config: ExperimentConfig,
        train: Dataset,
        held_out: Dataset | None,
        out: Path,
        validation: Dataset | None = None,
        extractor: str = "classifier",
    ) -> None:
        self.config, self.train, self.held_out = config, train, held_out
        self.extractor = None
        if held_out is not None:
            from palomino.scoring.classifier import save_classifier, train_classifier
            from palomino.scoring.extractors import ClassifierExtractor

            arch = "lipizzaner" if extractor == "lipizzaner" else "cnn"
            path = out / f"classifier-{config.data.name}{'' if arch == 'cnn' else '-' + arch}.safetensors"
            if not path.exists():  # trained on the same 8,000 / 2,000 split the GANs use
                save_classifier(train_classifier(config.data, holdout=IMAGE_SAMPLES, arch=arch), path)
            self.classifier = path
            self.extractor = ClassifierExtractor(path)
            self.real = self.extractor.extract(((held_out.samples + 1) / 2).clamp(0, 1))
            self.validation_real = (
                None if validation is None else self.extractor.extract(((validation.samples + 1) / 2).clamp(0, 1))
            )
            # The memorization ratio's denominator, once per case: as many held-out images as samples scored.
            some = torch.randperm(len(held_out), generator=torch.Generator().manual_seed(0))[:IMAGE_SAMPLES]
            self.memorization = MemorizationScale.calibrate(train.samples, held_out.samples[some])

    def score(self, samples: torch.Tensor, validation: bool = False) -> dict[str, float]:
        """Scores against the held-out images (or, `validation`, the validation images: FID only)."""
        if self.extractor is None:
            coverage = mode_coverage(samples, self.train.modes, self.train.mode_std)
            return {"modes": coverage.covered, "hq": coverage.high_quality}
        from palomino.coevolution.ensemble_search import feature_fid
        from palomino.scoring.tvd import class_tvd

        features, logits = self.extractor.extract(((samples + 1) / 2).clamp(0, 1))
        real_features, real_logits = self.validation_real if validation else self.real
        scores = {"fid": feature_fid(features, real_features), "tvd": class_tvd(logits, real_logits)}
        if validation:
            return scores
        return {**scores, "memorization": self.memorization.of(samples).ratio}

    def sample_count(self) -> int:
        return SAMPLES if self.extractor is None else IMAGE_SAMPLES

    @staticmethod
    def worse(scores: dict[str, float]) -> float:
        """Lower is better: FID for images; for toys modes first, then the high-quality share."""
        return scores["fid"] if "fid" in scores else -(scores["modes"] + scores["hq"])


def selection_score(generator: torch.nn.Module, train: Dataset, latent: int, seed: int, referee: Referee) -> float:
    """How indep-best picks its GAN, as the grid's ensemble picks its weights: against training
    data, never the held-out data — FID on the classifier's features for images, MMD² for points."""
    fake = draw([generator], np.ones(1), 1000, latent, seed + 1)
    real = train.samples[torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:1000]]
    if referee.extractor is not None:
        features = [referee.extractor.extract(((x + 1) / 2).clamp(0, 1))[0] for x in (fake, real)]
        return FrechetScore.from_features([features[0]], features[1])(np.ones(1))
    return MixtureScore.from_samples([fake], real, FINE_BANDWIDTH_FACTORS)(np.ones(1))


# ---- the methods -----------------------------------------------------------------------------


def train_baselines(
    config: ExperimentConfig, datasets: list[Dataset], budget: Budget, seeds: list[int], device: str
) -> tuple[list[torch.nn.Module], list[torch.nn.Module], float]:
    """(generators, discriminators, seconds): plain GANs trained side by side as one stack
    (palomino.baselines), back on the CPU to be scored; GAN i on datasets[i] from seeds[i]."""
    start = time.perf_counter()
    trained = train_independent(config, datasets, budget, seeds, device)
    seconds = time.perf_counter() - start
    return [g.cpu() for g, _ in trained], [d.cpu() for _, d in trained], seconds


def run_grid(config: ExperimentConfig, train: Dataset, out: Path) -> tuple[RunDirectory, float]:
    torch.set_num_threads(THREADS)
    run = RunDirectory.create(out, config)
    start = time.perf_counter()
    features = ensemble_features(config, train.kind, config.device)
    outcome = asyncio.run(train_embedded(config, run, train, ensemble_features=features))
    if not outcome.finished:
        raise RuntimeError(f"{run.path}: training did not finish")
    return run, time.perf_counter() - start


def grid_steps(run: RunDirectory) -> tuple[int, int, int]:
    """(generator steps, discriminator steps, cells) summed over metrics.jsonl."""
    records = list(read_jsonl(run.path / "metrics.jsonl"))
    g = sum(r["steps"]["generator"] for r in records)
    d = sum(r["steps"]["discriminator"] for r in records)
    return g, d, len({tuple(r["cell"]) for r in records})


def own_generator(run: RunDirectory, cell: str) -> torch.nn.Module:
    mixture = Mixture.load(run.result_dir / "cells" / cell)
    return mixture.generators[mixture.components.index(cell)]


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


def plain_setting(config: ExperimentConfig, total: Budget, scale: int) -> tuple[ExperimentConfig, Budget, str]:
    """(config, budget, row name) of the plain GAN: the grid's total steps in sequence, or with
    `scale` S > 1 batches S times larger and S times fewer steps (the same samples seen)."""
    if scale == 1:
        return config, total, "plain"
    training = config.training.model_copy(update={"batch_size": config.training.batch_size * scale})
    budget = Budget(max(1, total.generator // scale), max(1, total.discriminator // scale))
    return config.model_copy(update={"training": training}), budget, f"plain-batch×{scale}"


def searched_weights(
    config: ExperimentConfig, train: Dataset, generators: list[torch.nn.Module], critics: list[torch.nn.Module]
) -> np.ndarray:
    """Mixture weights for independent GANs on the regions found as the grid's result finds its
    own (palomino.runs.grid_ensemble: forward selection, then a (1+1)-ES, on the same score and
    features): what the grid's lead over data-share weights owes to that search."""
    from palomino.grid import Topology
    from palomino.runs.grid_ensemble import grid_ensemble

    cells = [str(c) for c in Topology(config.grid.rows, config.grid.cols).cells()]
    features = ensemble_features(config, train.kind, "cpu")
    return grid_ensemble(generators, cells, train, config, "cpu", critics, features=features).ensemble.weights


def without_neighbours(config: ExperimentConfig) -> ExperimentConfig:
    """The grid without communication: grid.neighbourhood none, each cell alone with the same policies."""
    return config.model_copy(update={"grid": config.grid.model_copy(update={"neighbourhood": "none"})})


def communicates(config: ExperimentConfig) -> bool:
    return config.grid.neighbourhood != "none"


def without_selection(config: ExperimentConfig) -> ExperimentConfig:
    """The grid without selection: tournaments of one (a random candidate, no fitness pressure) and
    generational replacement (the trained offspring replace their parents whatever their fitness);
    the neighbourhood, migration and every other policy as they are."""
    training = config.training
    selection = training.selection.model_copy(update={"replacement": "generational"})
    return config.model_copy(
        update={"training": training.model_copy(update={"tournament_size": 1, "selection": selection})}
    )


def selects(config: ExperimentConfig) -> bool:
    """Whether fitness chooses anything in the grid: not under generational replacement with
    tournaments of one, or with one candidate each (one individual a cell, no migrants: the regions
    cases), where the grid already is its no-selection ablation."""
    training = config.training
    one_candidate = training.population_size == 1 and training.selection.migration == 0
    return training.selection.replacement != "generational" or not (training.tournament_size == 1 or one_candidate)


def without_mutation(config: ExperimentConfig) -> ExperimentConfig:
    """The grid without its cells' own policies: no learning-rate mutation and one loss, the first
    (the baselines' loss); the neighbourhood, selection and every other setting as they are."""
    training = config.training
    mutation = training.mutation.model_copy(update={"probability": 0.0})
    return config.model_copy(
        update={"training": training.model_copy(update={"mutation": mutation, "losses": training.losses[:1]})}
    )


def mutates(config: ExperimentConfig) -> bool:
    """Whether the cells do anything of their own beyond a plain GAN's step: mutate their rates
    (a chance and a step above 0) or draw among several losses."""
    mutation = config.training.mutation
    return (mutation.probability > 0 and mutation.alpha > 0) or len(config.training.losses) > 1


# --ablations: each name's run directory, the config with it taken out, and whether the grid has
# any of it (if not, the grid's own run is the row).
ABLATIONS: dict[str, tuple[str, Callable[[ExperimentConfig], ExperimentConfig], Callable[[ExperimentConfig], bool]]] = {
    "grid-alone": ("alone", without_neighbours, communicates),
    "grid-no-selection": ("no-selection", without_selection, selects),
    "grid-no-mutation": ("no-mutation", without_mutation, mutates),
}


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


def regions_baseline(
    seed: int, config: ExperimentConfig, train: Dataset, per: Budget, device: str
) -> tuple[tuple[list[torch.nn.Module], list[torch.nn.Module]], list[Dataset], float]:
    """indep-regions: each independent GAN on its cell's own data (cell_dataset, as the grid splits
    it): ((generators, discriminators), their data, seconds)."""
    from palomino.coevolution.cell_data import cell_dataset
    from palomino.grid import Topology

    topology = Topology(config.grid.rows, config.grid.cols, config.grid.neighbourhood)
    parts = [cell_dataset(train, config, coord, topology, None) for coord in topology.cells()]
    nets, critics, seconds = train_baselines(config, parts, per, [seed + 3000 + i for i in range(len(parts))], device)
    return (nets, critics), parts, seconds


@dataclass
class Baseline:
    """Samples of baseline generators as the grid's result is sampled: an equal-weight mixture and,
    where the case sets training.ensemble.critic_quantile, through their own discriminators
    calibrated the same way on training data (palomino.coevolution.rejection), by the same rule
    (training.ensemble.critic: together, or each generator through its own critic calibrated on
    its own data): the filter is then not what tells the grid from its baselines."""

    config: ExperimentConfig
    train: Dataset
    n: int
    seed: int

    def sample(
        self,
        generators: list[torch.nn.Module],
        critics: list[torch.nn.Module],
        weights: np.ndarray | None = None,
        own_data: list[Dataset] | None = None,
        at: int | None = None,
    ) -> torch.Tensor:
        """n samples; `at` seeds them (default the case's seed + 100, as the grid's are drawn)."""
        at = self.seed + 100 if at is None else at
        quantile = self.config.training.ensemble.critic_quantile
        weights = np.full(len(generators), 1 / len(generators)) if weights is None else weights
        if quantile <= 0:
            return draw(generators, weights, self.n, self.config.network.latent_dim, at)
        from palomino.coevolution.rejection import CriticFilter

        def real(data: Dataset) -> torch.Tensor:
            return data.samples[
                torch.randperm(len(data), generator=torch.Generator().manual_seed(self.seed + 11))[:2000]
            ]

        names = [str(i) for i in range(len(generators))]
        mixture = Mixture(
            generators,
            weights,
            names,
            self.config.network,
            self.train.sample_shape,
            self.train.kind,
            {},
            critics=critics,
            critic_cells=names,
        )
        if self.config.training.ensemble.critic == "own":
            own = own_data or [self.train] * len(generators)
            thresholds = [CriticFilter.calibrate([c], real(d), quantile).threshold for c, d in zip(critics, own)]
            mixture.use_filter(FilterRule(rule="own", thresholds=thresholds, quantile=quantile))
        else:
            threshold = CriticFilter.calibrate(critics, real(self.train), quantile).threshold
            mixture.use_filter(FilterRule(threshold=threshold, quantile=quantile))
        return mixture.sample(self.n, seed=at, data_space=False)


def _cells(run: RunDirectory) -> list[str]:
    return [p.name for p in (run.result_dir / "cells").iterdir() if p.is_dir()]


# ---- the table -------------------------------------------------------------------------------


def summarise(results: list[Result]) -> list[dict[str, Any]]:
    rows = []
    for case in dict.fromkeys(r.case for r in results):
        for method in dict.fromkeys(r.method for r in results if r.case == case):
            mine = [r for r in results if r.case == case and r.method == method]
            row: dict[str, Any] = {
                "case": case,
                "method": method,
                "seeds": len(mine),
                "steps": mine[0].steps,
                "seconds": float(np.mean([r.seconds for r in mine])),
            }
            if mine[0].rate is not None:  # a sweep: the rate each seed's validation split chose
                row["lr"] = [r.rate for r in mine]
            for key in mine[0].scores:
                values = [r.scores[key] for r in mine]
                row[key] = {
                    "mean": float(np.mean(values)),
                    "sd": float(np.std(values)),
                    "min": float(np.min(values)),
                    "values": values,
                }
            if "memorization" in row:  # FID cannot tell copies of the training images from new ones
                row["memorizing"] = row["memorization"]["mean"] < MEMORIZING_BELOW
            rows.append(row)
    return rows


MEMORIZATION_LEGEND = (
    "memorization: median distance of a sample to its nearest training image over that of a held-out image "
    f"(pixels in [-1, 1]; about 1 for new images); ! = below {MEMORIZING_BELOW}: memorizing"
)


def format_table(rows: list[dict[str, Any]]) -> str:
    keys = [
        k
        for k in ("modes", "hq", "cell_modes", "union", "used", "fid", "tvd", "memorization")
        if any(k in r for r in rows)
    ]
    width = max([12, *(len(r["case"]) + 2 for r in rows)])  # fashion-full-12x12 and the like
    lines = [
        f"{'case':<{width}}{'method':<21}{'seeds':>6}"
        + "".join(f"{k:>16}" for k in keys)
        + f"{'G+D steps':>12}{'wall s':>9}"
    ]

    def cell(r: dict[str, Any], k: str) -> str:
        if k not in r:
            return f"{'':>16}"
        flag = "!" if k == "memorization" and r.get("memorizing") else " "
        return f"{r[k]['mean']:>9.3f}{flag}±{r[k]['sd']:<5.3f}"

    for r in rows:
        cells = "".join(cell(r, k) for k in keys)
        rates = "  lr " + ",".join(f"{x:g}" for x in r["lr"]) if "lr" in r else ""
        lines.append(
            f"{r['case']:<{width}}{r['method']:<21}{r['seeds']:>6}{cells}{r['steps']:>12}{r['seconds']:>9.0f}{rates}"
        )
    if "memorization" in keys:
        lines.append(MEMORIZATION_LEGEND)
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(1, len(cases), figsize=(4 * len(cases), 3.2), squeeze=False)
    for ax, case in zip(axes[0], cases):
        mine = [r for r in rows if r["case"] == case]
        key = "hq" if "hq" in mine[0] else "fid"
        ax.bar(
            [r["method"] for r in mine],
            [r[key]["mean"] for r in mine],
            yerr=[r[key]["sd"] for r in mine],
            color="#5b8def",
        )
        if key == "hq":
            for i, r in enumerate(mine):
                ax.text(
                    i, r[key]["mean"] / 2, f"{r['modes']['mean']:.1f}\nmodes", ha="center", fontsize=7, color="white"
                )
        if key == "fid":  # a collapsed baseline is 10-20× the others: on a linear axis they vanish
            ax.set_yscale("log")
            ax.set_ylim(10, 2 * max(r[key]["mean"] for r in mine))
            for i, r in enumerate(mine):
                flag = " memorizing" if r.get("memorizing") else ""
                ax.text(i, r[key]["mean"] * 1.08, f"{r[key]['mean']:.0f}{flag}", ha="center", fontsize=7)
        ax.set_title(f"{case} ({key}; {mine[0]['seeds']} seeds)")
        ax.tick_params(axis="x", labelsize=8, labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def shown(scores: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in scores.items())


def report(r: Result, prefix: str = "") -> None:
    at = "" if r.rate is None else f" lr {r.rate:g}"
    print(
        f"{r.case} seed {r.seed} {r.method}{at}: {prefix}{shown(r.scores)} ({r.steps} steps, {r.seconds:.0f} s)",
        file=sys.stderr,
        flush=True,
    )


def write_table(out: Path, header: dict[str, Any], results: list[Result], swept: list[Result]) -> list[dict[str, Any]]:
    """table.json in `out`: how the referee was run, a row per method over the seeds so far, every
    swept rate's results; `header["finished"]`: True, or the [case, seed] pairs done so far."""
    rows = summarise(results)
    table = {**header, "rows": rows, "sweep": [asdict(r) for r in swept]}
    (out / "table.json").write_text(json.dumps(table, indent=2))
    return rows


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


if __name__ == "__main__":
    sys.exit(main())
