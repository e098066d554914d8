"""`palomino …`: the command line (typer + rich). Progress and logs go to stderr; results to stdout."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from palomino.endpoints import DASHBOARD_PORT, ORCHESTRATOR_PORT, ORCHESTRATOR_URL
from palomino.errors import ConfigError, PalominoError, describe_validation
from palomino.wire.control_messages import MAX_CELLS_PER_WORKER

if TYPE_CHECKING:  # torch-heavy: the service commands start without them
    from palomino.config import ExperimentConfig
    from palomino.data import Dataset
    from palomino.runs import RunDirectory
    from palomino.runs.embedded import TrainOutcome

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Coevolutionary GAN training on a toroidal grid.")
stderr = Console(stderr=True)


def _fail(error: PalominoError) -> typer.Exit:
    stderr.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
    return typer.Exit(2 if isinstance(error, ConfigError) else 1)


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    from palomino.transport.urls import RedactingFilter

    if stderr.is_terminal:
        handler: logging.Handler = RichHandler(console=stderr, show_path=False)
    else:  # a service's log (a file, a container, a batch job): plain lines, a tenth of rich's cost each
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())  # libraries log URLs too (aio-pika's reconnects): never a password
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s", handlers=[handler])
    for noisy in ("httpx", "aio_pika", "aiormq"):  # their INFO lines are per request / per reconnect try
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command(rich_help_panel="Train and use a run")
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
        _board_folder(tensorboard)
    listening = _dashboard_socket(dashboard)  # a taken port fails before anything is written
    holding = contextlib.ExitStack()  # the run's lock, from before anything of it is written until the end
    try:
        cfg, run, dataset = _prepare_run(config, out, overrides, resume, holding)
    except PalominoError as error:
        holding.close()
        raise _fail(error) from None
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
        except PalominoError as error:
            raise _fail(error) from None
        except asyncio.CancelledError:
            stderr.print("aborted")
            print(run.path)
            raise typer.Exit(130) from None
    _report_outcome(outcome, run.path)


@app.command(rich_help_panel="Train and use a run")
def runs(
    folder: Path = typer.Argument(Path("runs"), help="The folder the runs are in (palomino train --out)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object a run instead of the table."),
) -> None:
    """List the runs under FOLDER, newest first: state, grid, iterations done, best score, path."""
    import json

    from rich.table import Table

    from palomino.runs.listing import list_runs

    if not folder.is_dir():
        raise _fail(PalominoError(f"runs: no folder {folder}: give the folder palomino train --out wrote to"))
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


def _board_folder(folder: Path) -> None:
    """--tensorboard's folder made and the writer installed, or exit 2 before training starts."""
    from palomino.runs.tensorboard_log import require_writer

    try:
        require_writer()
        folder.mkdir(parents=True, exist_ok=True)
    except PalominoError as error:
        raise _fail(error) from None
    except OSError as error:
        raise _fail(ConfigError(f"--tensorboard {folder}: cannot write there: {error.strerror}")) from None


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
    from palomino.grid import cell_name
    from palomino.runs.embedded import train_embedded

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

    try:
        return listen("127.0.0.1", port, "--dashboard")
    except PalominoError as error:
        raise _fail(error) from None


def _dashboard_of(run, sock):
    """The dashboard over `run` on `sock` while it trains, else nothing."""
    import contextlib

    if sock is None:
        return contextlib.nullcontext()
    from palomino.services.dashboard import BackgroundDashboard

    try:
        server = BackgroundDashboard(run.path, sock)
    except PalominoError as error:
        sock.close()
        raise _fail(error) from None
    stderr.print(f"dashboard: {server.url}/#/exp/{run.experiment}", highlight=False, soft_wrap=True)
    return server


@app.command(rich_help_panel="Train and use a run")
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
        raise _fail(ConfigError(f"--out {out}: use a .npy or .png file name"))
    run = RunDirectory(run_dir)
    if not run.is_run():  # a usage error, as `score` says it
        raise _fail(ConfigError(f"{run_dir}: not a run directory (no config.yaml in it)"))
    # torch only now: a usage error is told at once, not after seconds of imports.
    import numpy as np

    from palomino.runs import Mixture
    from palomino.runs.images import picture_of

    try:
        mixture = Mixture.load(run.result_dir)
    except PalominoError as error:
        raise _fail(error) from None
    try:
        samples = mixture.sample(n, seed=seed, labels=None if label is None else [label] * n)
    except PalominoError as error:  # a class the run cannot draw: a usage error
        raise _fail(ConfigError(f"--class {label}: {error}")) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".npy":
        np.save(out, samples.numpy().astype(np.float32), allow_pickle=False)
    else:
        picture_of(samples, mixture.kind).save(out)
    print(out)


def _settings(
    broker: str | None = None, redis: str | None = None, orchestrator: str | None = None, client: bool = False
):
    """The services' settings (flags over PALOMINO_* variables); a bad variable, or a broker or Redis
    password left at an example's placeholder, exits 2 naming it."""
    from pydantic import ValidationError

    from palomino.services.common.auth import refuse_placeholder_passwords
    from palomino.services.common.service_settings import ServiceSettings

    try:
        settings = ServiceSettings().with_flags(broker_url=broker, redis_url=redis, orchestrator_url=orchestrator)
        if not client:  # a service: it connects to the broker and Redis with these
            refuse_placeholder_passwords(
                **{
                    "--broker / PALOMINO_BROKER_URL": settings.broker_url,
                    "--redis / PALOMINO_REDIS_URL": settings.redis_url,
                }
            )
        return settings
    except ValidationError as error:
        message = describe_validation(error, lambda field: "PALOMINO_" + field.upper(), show_input=False)
        raise _fail(ConfigError(message)) from None
    except ValueError as error:
        raise _fail(ConfigError(str(error))) from None


def _client(orchestrator: str | None):
    from palomino.services.common.client import OrchestratorClient

    settings = _settings(orchestrator=orchestrator, client=True)
    return OrchestratorClient(settings.orchestrator_url, token=settings.token)


def _device(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", value):
        raise typer.BadParameter(f"{value!r}: use cpu, cuda or cuda:N")
    return value


BROKER = typer.Option(
    None, "--broker", envvar="PALOMINO_BROKER_URL", show_envvar=True, help="RabbitMQ URL (default: local guest)."
)
REDIS = typer.Option(None, "--redis", envvar="PALOMINO_REDIS_URL", show_envvar=True, help="Redis URL (default: local).")
ORCH = typer.Option(
    None,
    "--orchestrator",
    envvar="PALOMINO_ORCHESTRATOR_URL",
    show_envvar=True,
    help=f"Orchestrator URL (default: {ORCHESTRATOR_URL}).",
)


TENSORBOARD = typer.Option(
    None,
    "--tensorboard",
    envvar="PALOMINO_TENSORBOARD",
    show_envvar=True,
    help="Also log each experiment to TensorBoard, in DIR/<experiment> (pip install 'palomino[tensorboard]').",
)


def _tensorboard(folder: Path | None) -> str | None:
    """The folder, once the writer is known to be installed (exit 2 naming the extra otherwise)."""
    if folder is None or not str(folder):
        return None
    _board_folder(folder)
    return str(folder)


@app.command(rich_help_panel="Services")
def cell(
    broker: str | None = BROKER,
    redis: str | None = REDIS,
    device: str = typer.Option(
        "cpu", "--device", metavar="cpu|cuda[:N]", callback=_device, help="Where this worker trains."
    ),
    worker_id: str | None = typer.Option(None, "--worker-id", help="Default: host-pid-random."),
    cells: int = typer.Option(
        1,
        "--cells",
        min=1,
        max=MAX_CELLS_PER_WORKER,
        envvar="PALOMINO_CELLS_PER_WORKER",
        show_envvar=True,
        help="Cells this worker hosts: a patch of the grid trained together (one tile where it pays, e.g. on a GPU).",
    ),
) -> None:
    """A cell worker: registers, heartbeats, trains the cells it is assigned."""
    from palomino.services.cell.worker import CellWorker

    _serve(CellWorker(_settings(broker, redis), worker_id, device, cells))


def _serve(service: Any) -> None:
    """Run a service until SIGINT/SIGTERM asks it to finish what it is doing and leave."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        running = asyncio.ensure_future(service.run())

        def on_signal() -> None:
            if service.ready:
                service.request_shutdown()
            else:  # still connecting (a broker that does not answer): there is nothing to finish
                running.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        try:
            await running
        except asyncio.CancelledError:
            stderr.print("stopped before it was connected", highlight=False)

    try:
        asyncio.run(go())
    except PalominoError as error:
        raise _fail(error) from None


@app.command(rich_help_panel="Services")
def orchestrator(
    broker: str | None = BROKER,
    redis: str | None = REDIS,
    runs: Path = typer.Option(Path("runs"), "--runs", help="Where run directories are written."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to serve on; anything but loopback needs PALOMINO_ORCHESTRATOR_TOKEN."
    ),
    port: int = typer.Option(
        ORCHESTRATOR_PORT, "--port", min=0, max=65535, help="HTTP port of the API (0: any free one)."
    ),
    tensorboard: Path | None = TENSORBOARD,
) -> None:
    """The orchestrator: experiments, layout, liveness, failures, results, and its HTTP API."""
    import uvicorn

    from palomino.services.common.auth import is_loopback
    from palomino.services.orchestrator.api import create_app
    from palomino.services.orchestrator.orchestrator import preflight

    settings = _settings(broker, redis).with_flags(tensorboard=_tensorboard(tensorboard))
    if settings.token is None and not is_loopback(host):
        raise _fail(ConfigError(
            f"--host {host}: serving beyond this machine needs a token; set PALOMINO_ORCHESTRATOR_TOKEN "
            "(e.g. `export PALOMINO_ORCHESTRATOR_TOKEN=$(openssl rand -hex 32)`) and give it to its clients"
        ))  # fmt: skip
    try:
        asyncio.run(preflight(settings))
    except PalominoError as error:
        raise _fail(error) from None
    uvicorn.run(create_app(settings, runs), host=host, port=port, log_level="warning")


def _experiment_yaml(config: Path, overrides: list[str]) -> str:
    from palomino.config import dump_config, load_config

    return dump_config(load_config(config, overrides))


@app.command(rich_help_panel="Orchestrator clients")
def submit(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a key: --set training.iterations=20 (repeatable)."
    ),
    orchestrator: str | None = ORCH,
) -> None:
    """Submit an experiment to the orchestrator; prints its id."""
    try:
        reply = _client(orchestrator).submit(_experiment_yaml(config, overrides))
    except PalominoError as error:
        raise _fail(error) from None
    print(reply["id"])


@app.command(rich_help_panel="Orchestrator clients")
def wait(
    experiment: str = typer.Argument(...),
    orchestrator: str | None = ORCH,
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds; default: no limit."),
) -> None:
    """Block until the experiment ends; prints its run directory (exit 1 unless it finished)."""
    try:
        summary = _client(orchestrator).wait(experiment, timeout)
    except PalominoError as error:
        raise _fail(error) from None
    if summary["state"] != "finished":
        stderr.print(f"experiment {experiment} {summary['state']}: {summary['reason']}", highlight=False)
    print(summary["run_dir"])
    if summary["state"] != "finished":
        raise typer.Exit(1)


@app.command(rich_help_panel="Orchestrator clients")
def status(experiment: str = typer.Argument(...), orchestrator: str | None = ORCH) -> None:
    """Print an experiment's state, layout and liveness as JSON."""
    import json

    try:
        summary = _client(orchestrator).experiment(experiment)
    except PalominoError as error:
        raise _fail(error) from None
    print(json.dumps(summary, indent=2))


@app.command(rich_help_panel="Orchestrator clients")
def delete(
    experiment: str = typer.Argument(..., help="The experiment's id (from `submit`)."),
    orchestrator: str | None = ORCH,
) -> None:
    """Stop an experiment (its cells checkpoint and stop); prints its summary as JSON. The run directory stays."""
    import json

    try:
        summary = _client(orchestrator).delete(experiment)
    except PalominoError as error:
        raise _fail(error) from None
    print(json.dumps(summary, indent=2))


@app.command(rich_help_panel="Services")
def up(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    cells: int = typer.Option(..., "--cells", min=1, help="Cell workers to start (the grid's cells)."),
    spares: int = typer.Option(0, "--spares", min=0, help="Extra workers that replace dead cells."),
    out: Path = typer.Option(Path("runs"), "--out", help="Where the run directory is written."),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a key: --set training.iterations=20 (repeatable)."
    ),
    broker: str | None = BROKER,
    redis: str | None = REDIS,
    port: int = typer.Option(0, "--port", help="Orchestrator port; 0 picks a free one."),
    scorers: int = typer.Option(
        1, "--scorers", min=0, help="Scorer processes; the final mixtures' scores go to scores.json."
    ),
    score_timeout: float = typer.Option(600.0, "--score-timeout", help="Seconds to wait for the final scores."),
    per_worker: int = typer.Option(
        1,
        "--per-worker",
        min=1,
        max=MAX_CELLS_PER_WORKER,
        help="Cells each worker process hosts (`palomino cell --cells`).",
    ),
    tensorboard: Path | None = TENSORBOARD,
) -> None:
    """Start an orchestrator, N+K cells and scorers locally, run the experiment, stop them; prints the run directory."""
    from palomino.services.local import run_up

    try:
        yaml_text = _experiment_yaml(config, [f"distributed.max_cells={cells}", *overrides])
        outcome = run_up(
            yaml_text,
            cells,
            spares,
            out,
            _settings(broker, redis).with_flags(tensorboard=_tensorboard(tensorboard)),
            port,
            stderr,
            scorers,
            score_timeout,
            per_worker,
        )
    except PalominoError as error:
        raise _fail(error) from None
    print(outcome["run_dir"])
    if outcome["state"] != "finished":
        raise typer.Exit(1)


@app.command(rich_help_panel="Services")
def scorer(
    broker: str | None = BROKER, name: str | None = typer.Option(None, "--name", help="Default: host-pid.")
) -> None:
    """A scorer: takes score jobs from the queue `palomino.score`, publishes the scores as events."""
    from palomino.services.scorer.scorer import Scorer

    _serve(Scorer(_settings(broker), name))


@app.command(rich_help_panel="Services")
def dashboard(
    orchestrator: str | None = typer.Option(
        None, "--orchestrator", help="Orchestrator URL for history and liveness (else PALOMINO_ORCHESTRATOR_URL)."
    ),
    broker: str | None = typer.Option(
        None, "--broker", help="RabbitMQ URL for live events (else PALOMINO_BROKER_URL)."
    ),
    runs: Path | None = typer.Option(
        None,
        "--runs",
        help="Folder of run directories (else PALOMINO_DASHBOARD_RUNS; default ./runs without --orchestrator).",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="0.0.0.0 to serve other machines (set PALOMINO_DASHBOARD_TOKEN then)."
    ),
    port: int = typer.Option(
        DASHBOARD_PORT, "--port", min=0, max=65535, help="HTTP port of the page and its API (0: any free one)."
    ),
) -> None:
    """The dashboard: live heat maps of the grid in the browser (read-only)."""
    from palomino.services.dashboard import dashboard_settings, serve

    try:
        settings = dashboard_settings(orchestrator=orchestrator, broker=broker, runs=runs)
        serve(settings, host, port, on_ready=lambda url: stderr.print(f"dashboard: {url}", highlight=False))
    except PalominoError as error:
        raise _fail(error) from None


@app.command(rich_help_panel="Train and use a run")
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
        None, "--device", metavar="cpu|cuda[:N]", callback=_device, help="Where to run the extractor."
    ),
) -> None:
    """Score the run's best mixture and every cell's neighbourhood mixture; writes scores.json (printed last)."""
    # Long only by its options' declarations: the body is the next 25 lines.
    from palomino.runs import RunDirectory

    run = RunDirectory(run_dir)
    if not run.is_run():  # told before the scoring's imports (torch): at once
        raise _fail(ConfigError(f"{run_dir}: not a run directory (no config.yaml in it)"))
    from palomino.scoring import ScoringOptions, parse_metrics, score_run
    from palomino.scoring.report import scores_table

    try:
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
    except PalominoError as error:
        raise _fail(error) from None
    Console(soft_wrap=True).print(scores_table(report))
    print(run.scores_path)


classifier_app = typer.Typer(
    no_args_is_help=True,
    help="The small CNN behind the classifier and lipizzaner extractors (FID/IS features, TVD's class predictions).",
)
app.add_typer(classifier_app, name="classifier", rich_help_panel="Train and use a run")


@classifier_app.command("train")
def classifier_train(
    data: Literal["mnist", "fashion_mnist", "cifar10", "image_folder"] = typer.Option(
        ..., "--data", help="A labelled image dataset."
    ),
    out: Path = typer.Option(..., "--out", help="FILE.safetensors (metadata beside it in FILE.json)."),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Where the dataset's files are (default: $PALOMINO_DATA_DIR/NAME, else the user cache).",
    ),
    download: bool = typer.Option(False, "--download", help="Download MNIST / Fashion-MNIST / CIFAR-10 when absent."),
    epochs: int | None = typer.Option(
        None, "--epochs", min=1, help="Default: about 150,000 images' worth, 5 to 30 epochs."
    ),
    holdout: int = typer.Option(2000, "--holdout", min=1, help="Test images held out when only one split is present."),
    train_size: int = typer.Option(0, "--train-size", min=0, help="Train on this many images (0 = all)."),
    test_size: int = typer.Option(0, "--test-size", min=0, help="Test on this many images (0 = all)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the initial weights and the data split."),
    arch: Literal["cnn", "lipizzaner"] = typer.Option(
        "cnn", "--arch", help="cnn: Palomino's own; lipizzaner: Lipizzaner's MNIST CNN (its logits the features)."
    ),
) -> None:
    """Train the classifier, report its test accuracy, save it; prints the file last."""
    from pydantic import ValidationError

    from palomino.config import DataConfig

    if out.suffix != ".safetensors":
        raise _fail(ConfigError(f"--out {out}: the classifier file must end in .safetensors"))
    try:
        config = DataConfig(name=data, dir=data_dir, download=download)
    except ValidationError as error:
        flags = {"name": f"--data {data}", "dir": "--data-dir"}
        raise _fail(ConfigError(describe_validation(error, lambda field: flags.get(field, field)))) from None
    from palomino.scoring.classifier import save_classifier, train_classifier  # torch: after the usage errors

    def on_epoch(epoch: int, total: int, loss: float) -> None:
        stderr.print(f"epoch {epoch}/{total}: loss {loss:.4f}", highlight=False)

    try:
        trained = train_classifier(
            config,
            seed=seed,
            epochs=epochs,
            holdout=holdout,
            train_size=train_size,
            test_size=test_size,
            arch=arch,
            on_epoch=on_epoch,
        )
        save_classifier(trained, out)
    except PalominoError as error:
        raise _fail(error) from None
    meta = trained.meta
    stderr.print(
        f"{meta['dataset']}: test accuracy {meta['accuracy']:.2%} on {meta['test_size']:,} images "
        f"(trained on {meta['train_size']:,}, {meta['epochs']} epochs, {meta['seconds']:.0f} s; {meta['split']})",
        highlight=False,
        soft_wrap=True,
    )
    print(out)


@classifier_app.command("import")
def classifier_import(
    weights: Path = typer.Option(
        ..., "--weights", help="Lipizzaner's MNIST CNN weights: .safetensors, or a PyTorch state dict (.pt/.pkl)."
    ),
    data: Literal["mnist", "fashion_mnist"] = typer.Option(..., "--data", help="The dataset they were trained on."),
    out: Path = typer.Option(..., "--out", help="FILE.safetensors (metadata beside it in FILE.json)."),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Where the dataset's files are (default: $PALOMINO_DATA_DIR/NAME, else the user cache).",
    ),
    holdout: int = typer.Option(2000, "--holdout", min=1, help="Test images held out when only one split is present."),
    test_size: int = typer.Option(0, "--test-size", min=0, help="Test on this many images (0 = all)."),
) -> None:
    """Take Lipizzaner's MNIST CNN weights trained elsewhere (every tensor's shape checked), test them, save
    them as a classifier for --extractor lipizzaner; prints the file last."""
    from pydantic import ValidationError

    from palomino.config import DataConfig
    from palomino.scoring.classifier import import_classifier, save_classifier

    if out.suffix != ".safetensors":
        raise _fail(ConfigError(f"--out {out}: the classifier file must end in .safetensors"))
    try:
        config = DataConfig(name=data, dir=data_dir)
    except ValidationError as error:
        flags = {"name": f"--data {data}", "dir": "--data-dir"}
        raise _fail(ConfigError(describe_validation(error, lambda field: flags.get(field, field)))) from None
    try:
        imported = import_classifier(weights, config, holdout=holdout, test_size=test_size)
        save_classifier(imported, out)
    except PalominoError as error:
        raise _fail(error) from None
    accuracy = imported.meta["accuracy"]
    stderr.print(
        f"{data}: test accuracy {accuracy:.2%} on {imported.meta['test_size']:,} images",
        highlight=False,
        soft_wrap=True,
    )
    if accuracy < 0.9:  # trained on its data, this network classifies 97–99 %: far below, wrong data or input range
        stderr.print(
            f"warning: {weights} classifies only {accuracy:.0%} of {data}'s test images: are they Lipizzaner's "
            f"{data} weights, trained on images in [-1, 1]?",
            highlight=False,
            soft_wrap=True,
        )
    print(out)


VERBOSE = ("-v", "--verbose")


def run(argv: list[str] | None = None) -> None:  # console-script entry point
    # -v is the callback's option, which click takes only before the command: move it there, so
    # `palomino train x.yaml -v` works too.
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in VERBOSE for a in args[1:]):
        args = ["--verbose", *(a for a in args if a not in VERBOSE)]
    app(args=args)


if __name__ == "__main__":
    run()
