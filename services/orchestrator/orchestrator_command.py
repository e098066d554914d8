"""`palomino orchestrator`: the orchestrator and its HTTP API."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from palomino.endpoints import ORCHESTRATOR_PORT
from palomino.errors import ConfigError
from palomino.services.common import command_options as options


def orchestrator(
    broker: str | None = options.BROKER,
    redis: str | None = options.REDIS,
    runs: Path = typer.Option(Path("runs"), "--runs", help="Where run directories are written."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to serve on; anything but loopback needs PALOMINO_ORCHESTRATOR_TOKEN."
    ),
    port: int = typer.Option(
        ORCHESTRATOR_PORT, "--port", min=0, max=65535, help="HTTP port of the API (0: any free one)."
    ),
    tensorboard: Path | None = options.TENSORBOARD,
) -> None:
    """The orchestrator: experiments, layout, liveness, failures, results, and its HTTP API."""
    import uvicorn

    from palomino.services.common.auth import is_loopback
    from palomino.services.orchestrator.api import create_app
    from palomino.services.orchestrator.orchestrator import preflight

    settings = options.settings(broker, redis).with_flags(tensorboard=options.tensorboard(tensorboard))
    if settings.token is None and not is_loopback(host):
        raise ConfigError(
            f"--host {host}: serving beyond this machine needs a token; set PALOMINO_ORCHESTRATOR_TOKEN "
            "(e.g. `export PALOMINO_ORCHESTRATOR_TOKEN=$(openssl rand -hex 32)`) and give it to its clients"
        )
    asyncio.run(preflight(settings))
    uvicorn.run(create_app(settings, runs), host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel="Services")(orchestrator)
