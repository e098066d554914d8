"""Training and using a run: `train` (embedded, one process), `runs`, `sample`, `score`."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from palomino.cli.main_app import stderr
from palomino.errors import ConfigError, PalominoError
from palomino.heap import freeze_startup_objects
from palomino.services.common.command_options import board_folder
from palomino.services.common.command_options import device as device_option

if TYPE_CHECKING:  # torch-heavy: the service commands start without them
    from palomino.config import ExperimentConfig
    from palomino.data import Dataset
    from palomino.engine.embedded import TrainOutcome
    from palomino.runs import RunDirectory


def train(
    config: Path | None = typer.Argument(None, help="Experiment YAML (optional with --resume)."),
    out: Path = typer.Option(Path("runs"), "--out", help="Folder in which the run directory is created."),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a key: --set training.iterations=20 (repeatable)."
    ),
    resume: Path | None = typer.Option(None, "--resume", help="Continue a killed run from its checkpoints."),
    dashboard: int | None = typer.Option(
        None,
        "--dashboard",
        min=0,
        max=65535,
        help="Serve the live dashboard of this run on this port (0: any free port) while it trains.",
    ),
    tensorboard: Path | None = typer.Option(
        None,
        "--tensorboard",
        help="Also log to TensorBoard, in DIR/<run>: tensorboard --logdir DIR (pip install 'palomino[tensorboard]').",
    ),
) -> None:
    """Train every cell of the grid in this process; prints the run directory last."""
    if tensorboard is not None:
        board_folder(tensorboard)
    listening = _dashboard_socket(dashboard)  # a taken port fails before anything is written
    holding = contextlib.ExitStack()  # the run's lock, from before anything of it is written until the end
    try:
        cfg, run, dataset = _prepare_run(config, out, overrides, resume, holding)
    except PalominoError:
        holding.close()
        raise
    freeze_startup_objects()  # the libraries and the dataset: out of the collector's walks (heap.py)
    with (
        holding,
        _dashboard_of(run, listening),
        Progress(*_PROGRESS_COLUMNS, console=stderr, transient=False) as progress,
    ):
        grid = f"{cfg.grid.rows}×{cfg.grid.cols} cells"
        if cfg.partitioned:
            grid = f"{len(cfg.data.labels or ())} classes × {cfg.grid.per_class} cells"
        task = progress.add_task(grid, total=cfg.cells * cfg.training.iterations, best="–")
        try:
            board = None if tensorboard is None else tensorboard / run.experiment
            outcome = asyncio.run(_train_until_done(cfg, run, dataset, resume is not None, progress, task, board))
        except asyncio.CancelledError:
            stderr.print("aborted")
            print(run.path)
            raise typer.Exit(130) from None
    _report_outcome(outcome, run.path)


def runs(
    folder: Path = typer.Argument(Path("runs"), help="The folder the runs are in (palomino train --out)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object a run instead of the table."),
) -> None:
    """List the runs under FOLDER, newest first: state, grid, iterations done, best score, path."""
    import json

    from rich.table import Table

    from palomino.runs.listing import list_runs

    if not folder.is_dir():
        raise PalominoError(f"runs: no folder {folder}: give the folder palomino train --out wrote to")
    found = list_runs(folder)
    if as_json:
        for summary in found:
            print(json.dumps(summary.as_json()))
        return
    if not found:
        stderr.print(f"no runs under {folder} (palomino train writes them there)")
        return
    table = Table(box=None, header_style="bold")
    for column in ("run", "state", "grid", "iterations", "best score", "path"):
        table.add_column(column, overflow="fold")  # names and paths whole, folded where the terminal is narrow
    colour = {"running": "cyan", "finished": "green", "killed": "yellow", "stopped": "yellow", "failed": "red"}
    for summary in found:
        state = f"[{colour[summary.state]}]{summary.state}[/]"
        if summary.resumable:
            state += " (resumable)"
        total = "?" if summary.iterations is None else summary.iterations
        best = "–" if summary.best_score is None else f"{summary.best_score:.4g} {summary.score_name}"
        table.add_row(summary.name, state, summary.grid, f"{summary.iterations_done}/{total}", best, summary.path)
    out = Console()
    if not out.is_terminal:  # piped: one line a run, however long
        out = Console(width=1_000)
    out.print(table)


_PROGRESS_COLUMNS = (
    TextColumn("[bold]{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TextColumn("best score {task.fields[best]}"),
    TimeElapsedColumn(),
    TimeRemainingColumn(),
)


def _prepare_run(
    config: Path | None, out: Path, overrides: list[str], resume: Path | None, holding: contextlib.ExitStack
) -> tuple[ExperimentConfig, RunDirectory, Dataset]:
    """(config, run directory, dataset) of a new run, or of the run to resume (with any overrides
    written into its config.yaml), its lock held in `holding` (one trainer a run: a second
    --resume of a running one fails, naming the first); a PalominoError names what is wrong."""
    from palomino.config import dump_config, load_config
    from palomino.io import atomic_write
    from palomino.runs import RunDirectory

    if resume is not None:
        run = RunDirectory.open(resume)
        holding.enter_context(run.lock.hold())  # before its config.yaml is rewritten
        cfg = load_config(run.config_path, overrides)  # the same loader as a CONFIG file: exit 2 naming the problem
        if overrides:  # e.g. more iterations: the run directory keeps describing the run
            atomic_write(run.config_path, dump_config(cfg).encode())
    elif config is None:
        raise ConfigError("train: give a CONFIG file, or --resume RUN_DIR")
    else:
        cfg = load_config(config, overrides)
    from palomino.data import load_dataset  # torch: once the configuration is known good (its errors at once)

    dataset = load_dataset(cfg.data, cfg.seed)
    if resume is None:
        out.mkdir(parents=True, exist_ok=True)
        run = RunDirectory.create(out, cfg)
        holding.enter_context(run.lock.hold())
    return cfg, run, dataset


async def _train_until_done(
    cfg: ExperimentConfig,
    run: RunDirectory,
    dataset: Dataset,
    resume: bool,
    progress: Progress,
    task: TaskID,
    tensorboard: Path | None,
) -> TrainOutcome:
    """The embedded training, the progress bar following it; Ctrl-C (or SIGTERM) stops after the
    current iteration with checkpoints, a second one at once."""
    from palomino.engine.embedded import train_embedded
    from palomino.grid import cell_name

    stop = asyncio.Event()
    main_task = asyncio.current_task()
    latest: dict[str, float] = {}

    def interrupt() -> None:
        if stop.is_set():  # a second Ctrl-C: stop now, without the final checkpoints
            main_task.cancel()
        stderr.print("[yellow]stopping after this iteration and writing checkpoints… (Ctrl-C again to abort)")
        stop.set()

    def on_metrics(record: dict) -> None:
        score = record.get("score")
        if score is not None and math.isfinite(score):
            latest[cell_name(record["cell"])] = score
        progress.update(task, advance=1, best=f"{min(latest.values()):.4g}" if latest else "–")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupt)
    loop.add_signal_handler(signal.SIGTERM, interrupt)
    features = None
    if dataset.kind == "image" and cfg.grid_ensemble:  # (palomino.scoring loads torchmetrics: only then)
        from palomino.scoring.extractors import ensemble_features

        features = ensemble_features(cfg, dataset.kind, cfg.device)
    return await train_embedded(
        cfg,
        run,
        dataset,
        resume=resume,
        stop=stop,
        on_metrics=on_metrics,
        on_restored=lambda done: progress.update(task, completed=done),
        ensemble_features=features,
        tensorboard=tensorboard,
    )


def _report_outcome(outcome: TrainOutcome, run_path: Path) -> None:
    """What the run reached, on stderr; the run directory last, on stdout (exit 130 when stopped)."""
    if outcome.finished and outcome.classes is not None:
        per_class = ", ".join(f"{label}: {score:.4g} (cell {cell})" for label, (cell, score) in outcome.classes.items())
        stderr.print(
            f"class mixture of {len(outcome.classes)} classes; best MMD² per class: {per_class}", highlight=False
        )
    elif outcome.finished and outcome.best_cell == "grid":
        stderr.print(f"result: the whole grid's ensemble, held-out score {outcome.best_score:.4g}", highlight=False)
    elif outcome.finished:
        stderr.print(
            f"best mixture: cell {outcome.best_cell}, {outcome.score_name} {outcome.best_score:.4g}", highlight=False
        )
    else:
        stderr.print(f"stopped; checkpoints written. Continue with: palomino train --resume {run_path}")
    print(run_path)
    if not outcome.finished:
        raise typer.Exit(130)


def _dashboard_socket(port: int | None):
    """`--dashboard PORT`: the listening socket, taken now (None without the flag)."""
    if port is None:
        return None
    from palomino.services.dashboard.server import listen

    return listen("127.0.0.1", port, "--dashboard")


def _dashboard_of(run, sock):
    """The dashboard over `run` on `sock` while it trains, else nothing."""
    import contextlib

    if sock is None:
        return contextlib.nullcontext()
    from palomino.services.dashboard.server import BackgroundDashboard

    try:
        server = BackgroundDashboard(run.path, sock)
    except PalominoError:
        sock.close()
        raise
    stderr.print(f"dashboard: {server.url}/#/exp/{run.experiment}", highlight=False, soft_wrap=True)
    return server


def sample(
    run_dir: Path = typer.Argument(..., help="A finished run directory."),
    n: int = typer.Option(..., "--n", min=1, help="How many samples."),
    out: Path = typer.Option(..., "--out", help=".npy (float32, data space) or .png (image grid / scatter plot)."),
    seed: int = typer.Option(
        0, "--seed", min=0, help="Seed of the latent draws (the same seed gives the same samples)."
    ),
    label: int | None = typer.Option(
        None,
        "--class",
        help="Draw from this class only (conditional or partitioned runs); else classes follow the priors.",
    ),
) -> None:
    """Draw N samples from the run's best mixture, weights respected (a partitioned run's: the class mixture)."""
    from palomino.runs import RunDirectory

    suffix = out.suffix.lower()
    if suffix not in {".npy", ".png"}:
        raise ConfigError(f"--out {out}: use a .npy or .png file name")
    run = RunDirectory(run_dir)
    if not run.is_run():  # a usage error, as `score` says it
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml in it)")
    # torch only now: a usage error is told at once, not after seconds of imports.
    import numpy as np

    from palomino.runs import Mixture
    from palomino.runs.images import picture_of

    mixture = Mixture.load(run.result_dir)
    try:
        samples = mixture.sample(n, seed=seed, labels=None if label is None else [label] * n)
    except PalominoError as error:  # a class the run cannot draw: a usage error
        raise ConfigError(f"--class {label}: {error}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".npy":
        np.save(out, samples.numpy().astype(np.float32), allow_pickle=False)
    else:
        picture_of(samples, mixture.kind).save(out)
    print(out)


def score(
    run_dir: Path = typer.Argument(..., help="A finished run directory."),
    metrics: str | None = typer.Option(
        None,
        "--metrics",
        help="Comma-separated: fid,is,kid,tvd,modes,memorization (default: the run's scoring.metrics, else "
        "fid,is,kid,tvd,memorization for images, modes for points).",
    ),
    samples: int | None = typer.Option(
        None,
        "--samples",
        help="Generated samples per mixture (default by kind of data: scoring.samples in docs/configuration.md).",
    ),
    extractor: Literal["classifier", "lipizzaner", "inception"] | None = typer.Option(
        None, "--extractor", help="Feature extractor (default: classifier; lipizzaner: Lipizzaner's MNIST CNN)."
    ),
    classifier: Path | None = typer.Option(
        None, "--classifier", help="File of `palomino classifier train` (else PALOMINO_CLASSIFIER)."
    ),
    inception_weights: Path | None = typer.Option(
        None, "--inception-weights", help="torch-fidelity's Inception-v3 weights (else PALOMINO_INCEPTION_WEIGHTS)."
    ),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="Real-statistics cache (else PALOMINO_CACHE_DIR, else ~/.cache/palomino)."
    ),
    real_samples: int | None = typer.Option(
        None,
        "--real-samples",
        help="Real images behind the real statistics (default: docs/scoring.md; 0 = all).",
    ),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Where the run's real data is, if not where its config says."
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="Parallel scoring processes (default: one per core)."
    ),
    seed: int | None = typer.Option(
        None, "--seed", min=0, help="Seed of the generated and real samples (default: the run's seed)."
    ),
    device: str | None = typer.Option(
        None, "--device", metavar="cpu|cuda[:N]", callback=device_option, help="Where to run the extractor."
    ),
) -> None:
    """Score the run's best mixture and every cell's neighbourhood mixture; writes scores.json (printed last)."""
    # Long only by its options' declarations: the body is the next 20 lines.
    from palomino.runs import RunDirectory

    run = RunDirectory(run_dir)
    if not run.is_run():  # told before the scoring's imports (torch): at once
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml in it)")
    from palomino.scoring import ScoringOptions, parse_metrics, score_run
    from palomino.scoring.report import scores_table

    config = run.load_config()
    options = ScoringOptions.build(
        config.scoring,
        metrics=parse_metrics(metrics),
        samples=samples,
        extractor=extractor,
        classifier=classifier,
        inception_weights=inception_weights,
        cache_dir=cache_dir,
        real_samples=real_samples,
        seed=seed,
        device=device,
    )
    data = config.data.model_copy(update={"dir": data_dir}) if data_dir is not None else None
    report = score_run(run_dir, options, workers, data=data)
    Console(soft_wrap=True).print(scores_table(report))
    print(run.scores_path)
