"""`palomino dashboard`: the dashboard."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from palomino.endpoints import DASHBOARD_PORT


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
    from palomino.services.dashboard.server import serve
    from palomino.services.dashboard.settings import dashboard_settings

    settings = dashboard_settings(orchestrator=orchestrator, broker=broker, runs=runs)
    stderr = Console(stderr=True)
    serve(settings, host, port, on_ready=lambda url: stderr.print(f"dashboard: {url}", highlight=False))


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel="Services")(dashboard)
