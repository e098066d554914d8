"""The orchestrator's clients: `submit`, `wait`, `status`, `delete`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from palomino.cli.main_app import stderr
from palomino.services.common.command_options import ORCH, experiment_yaml, orchestrator_client


def submit(
    config: Path = typer.Argument(..., help="Experiment YAML."),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override a key: --set training.iterations=20 (repeatable)."
    ),
    orchestrator: str | None = ORCH,
) -> None:
    """Submit an experiment to the orchestrator; prints its id."""
    print(orchestrator_client(orchestrator).submit(experiment_yaml(config, overrides))["id"])


def wait(
    experiment: str = typer.Argument(...),
    orchestrator: str | None = ORCH,
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds; default: no limit."),
) -> None:
    """Block until the experiment ends; prints its run directory (exit 1 unless it finished)."""
    summary = orchestrator_client(orchestrator).wait(experiment, timeout)
    if summary["state"] != "finished":
        stderr.print(f"experiment {experiment} {summary['state']}: {summary['reason']}", highlight=False)
    print(summary["run_dir"])
    if summary["state"] != "finished":
        raise typer.Exit(1)


def status(experiment: str = typer.Argument(...), orchestrator: str | None = ORCH) -> None:
    """Print an experiment's state, layout and liveness as JSON."""
    print(json.dumps(orchestrator_client(orchestrator).experiment(experiment), indent=2))


def delete(
    experiment: str = typer.Argument(..., help="The experiment's id (from `submit`)."),
    orchestrator: str | None = ORCH,
) -> None:
    """Stop an experiment (its cells checkpoint and stop); prints its summary as JSON. The run directory stays."""
    print(json.dumps(orchestrator_client(orchestrator).delete(experiment), indent=2))
