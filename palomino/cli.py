"""`palomino …`: the command line (typer + rich). Progress and logs go to stderr; results to stdout."""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from palomino.errors import ConfigError, PalominoError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Coevolutionary GAN training on a toroidal grid.")
stderr = Console(stderr=True)


def _fail(error: PalominoError) -> typer.Exit:
    stderr.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
    return typer.Exit(2 if isinstance(error, ConfigError) else 1)


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=stderr, show_path=False)],
    )


@app.command()
def train(
    config: Optional[Path] = typer.Argument(None, help="Experiment YAML (optional with --resume)."),
    out: Path = typer.Option(Path("runs"), "--out", help="Folder in which the run directory is created."),
    overrides: list[str] = typer.Option([], "--set", help="Override a key: --set training.iterations=20"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue a killed run from its checkpoints."),
) -> None:
    """Train every cell of the grid in this process; prints the run directory last."""
    from palomino.config import apply_overrides, dump_config, load_config, parse_config
    from palomino.data import load_dataset
    from palomino.runs import RunDirectory
    from palomino.runs.checkpoints import atomic_write
    from palomino.runs.embedded import train_embedded

    import yaml

    try:
        if resume is not None:
            run = RunDirectory.open(resume)
            raw = yaml.safe_load(run.config_path.read_text())
            cfg = parse_config(apply_overrides(raw, overrides)) if overrides else run.load_config()
            if overrides:  # e.g. more iterations: the run directory keeps describing the run
                atomic_write(run.config_path, dump_config(cfg).encode())
        elif config is None:
            raise ConfigError("train: give a CONFIG file, or --resume RUN_DIR")
        else:
            cfg = load_config(config, overrides)
        dataset = load_dataset(cfg.data, cfg.seed)
        if resume is None:
            out.mkdir(parents=True, exist_ok=True)
            run = RunDirectory.create(out, cfg)
    except PalominoError as error:
        raise _fail(error) from None

    total = cfg.cells * cfg.training.iterations
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best score {task.fields[best]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    latest: dict[str, float] = {}

    with Progress(*columns, console=stderr, transient=False) as progress:
        task = progress.add_task(f"{cfg.grid.rows}×{cfg.grid.cols} cells", total=total, best="–")

        def on_metrics(record: dict) -> None:
            score = record.get("score")
            if score is not None and math.isfinite(score):
                latest["-".join(map(str, record["cell"]))] = score
            best = f"{min(latest.values()):.4g}" if latest else "–"
            progress.update(task, advance=1, best=best)

        async def go():
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            main_task = asyncio.current_task()

            def interrupt() -> None:
                if stop.is_set():  # a second Ctrl-C: stop now, without the final checkpoints
                    main_task.cancel()
                stderr.print("[yellow]stopping after this iteration and writing checkpoints… (Ctrl-C again to abort)")
                stop.set()

            loop.add_signal_handler(signal.SIGINT, interrupt)
            loop.add_signal_handler(signal.SIGTERM, interrupt)
            return await train_embedded(
                cfg,
                run,
                dataset,
                resume=resume is not None,
                stop=stop,
                on_metrics=on_metrics,
                on_restored=lambda done: progress.update(task, completed=done),
            )

        try:
            outcome = asyncio.run(go())
        except PalominoError as error:
            raise _fail(error) from None
        except asyncio.CancelledError:
            stderr.print("aborted")
            print(run.path)
            raise typer.Exit(130) from None

    if outcome.finished:
        stderr.print(f"best mixture: cell {outcome.best_cell}, MMD² {outcome.best_score:.4g}", highlight=False)
        print(run.path)
    else:
        stderr.print(f"stopped; checkpoints written. Continue with: palomino train --resume {run.path}")
        print(run.path)
        raise typer.Exit(130)


@app.command()
def sample(
    run_dir: Path = typer.Argument(..., help="A finished run directory."),
    n: int = typer.Option(..., "--n", min=1, help="How many samples."),
    out: Path = typer.Option(..., "--out", help=".npy (float32, data space) or .png (image grid / scatter plot)."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Draw N samples from the run's best mixture, weights respected."""
    import numpy as np

    from palomino.runs import Mixture
    from palomino.runs.images import picture_of

    suffix = out.suffix.lower()
    if suffix not in {".npy", ".png"}:
        raise _fail(ConfigError(f"--out {out}: use a .npy or .png file name"))
    try:
        mixture = Mixture.load(run_dir / "result")
    except PalominoError as error:
        raise _fail(error) from None
    samples = mixture.sample(n, seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".npy":
        np.save(out, samples.numpy().astype(np.float32), allow_pickle=False)
    else:
        picture_of(samples, mixture.kind).save(out)
    print(out)


def run() -> None:  # console-script entry point
    app()


if __name__ == "__main__":
    sys.exit(app())
