"""`palomino up`: an orchestrator, N+K cells and scorers as local processes for one experiment."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from palomino.services.common import command_options as options
from palomino.wire.control_messages import MAX_CELLS_PER_WORKER


def up(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    cells: int = typer.Option(..., "--cells", min=1, help="Cell workers to start (the grid's cells)."),
    spares: int = typer.Option(0, "--spares", min=0, help="Extra workers that replace dead cells."),
    out: Path = typer.Option(Path("runs"), "--out", help="Where the run directory is written."),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a key: --set training.iterations=20 (repeatable)."
    ),
    broker: str | None = options.BROKER,
    redis: str | None = options.REDIS,
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
    tensorboard: Path | None = options.TENSORBOARD,
) -> None:
    """Start an orchestrator, N+K cells and scorers locally, run the experiment, stop them; prints the run directory."""
    from palomino.services.local import run_up

    yaml_text = options.experiment_yaml(config, [f"distributed.max_cells={cells}", *overrides])
    settings = options.settings(broker, redis).with_flags(tensorboard=options.tensorboard(tensorboard))
    outcome = run_up(
        yaml_text, cells, spares, out, settings, port, Console(stderr=True), scorers, score_timeout, per_worker
    )
    print(outcome["run_dir"])
    if outcome["state"] != "finished":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel="Services")(up)
