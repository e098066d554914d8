"""What the commands of the services and of the orchestrator's clients share: the connection
options (flags over PALOMINO_* variables), the settings they make, a --device check, the
--tensorboard folder, and running a service until a signal asks it to leave. Errors are
PalominoErrors; the app (palomino/cli/main_app.py) turns them into exit codes."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from palomino.endpoints import ORCHESTRATOR_URL
from palomino.errors import ConfigError, describe_validation
from palomino.heap import freeze_startup_objects

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


def settings(
    broker: str | None = None, redis: str | None = None, orchestrator: str | None = None, client: bool = False
) -> Any:
    """The services' settings (flags over PALOMINO_* variables); a bad variable, or a broker or Redis
    password left at an example's placeholder, is a ConfigError naming it."""
    from pydantic import ValidationError

    from palomino.services.common.auth import refuse_placeholder_passwords
    from palomino.services.common.service_settings import ServiceSettings

    try:
        made = ServiceSettings().with_flags(broker_url=broker, redis_url=redis, orchestrator_url=orchestrator)
        if not client:  # a service: it connects to the broker and Redis with these
            refuse_placeholder_passwords(
                **{"--broker / PALOMINO_BROKER_URL": made.broker_url, "--redis / PALOMINO_REDIS_URL": made.redis_url}
            )
        return made
    except ValidationError as error:
        raise ConfigError(
            describe_validation(error, lambda field: "PALOMINO_" + field.upper(), show_input=False)
        ) from None
    except ValueError as error:
        raise ConfigError(str(error)) from None


def orchestrator_client(orchestrator: str | None) -> Any:
    from palomino.services.common.client import OrchestratorClient

    made = settings(orchestrator=orchestrator, client=True)
    return OrchestratorClient(made.orchestrator_url, token=made.token)


def device(value: str | None) -> str | None:
    """--device's check (a typer callback)."""
    if value is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", value):
        raise typer.BadParameter(f"{value!r}: use cpu, cuda or cuda:N")
    return value


def board_folder(folder: Path) -> None:
    """--tensorboard's folder made and the writer installed, or a ConfigError before anything starts."""
    from palomino.runs.tensorboard_log import require_writer

    require_writer()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--tensorboard {folder}: cannot write there: {error.strerror}") from None


def tensorboard(folder: Path | None) -> str | None:
    """The folder, once the writer is known to be installed (a ConfigError naming the extra otherwise)."""
    if folder is None or not str(folder):
        return None
    board_folder(folder)
    return str(folder)


def serve(service: Any) -> None:
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
            Console(stderr=True).print("stopped before it was connected", highlight=False)

    freeze_startup_objects()  # the libraries: out of the collector's walks (palomino/heap.py)
    asyncio.run(go())


def experiment_yaml(config: Path, overrides: list[str]) -> str:
    """An experiment file with its --set overrides, checked and written out whole (ConfigError naming
    the field otherwise): what `submit` and `up` send."""
    from palomino.config import dump_config, load_config

    return dump_config(load_config(config, overrides))
