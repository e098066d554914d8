"""The `palomino` Typer app: logging set up once, and every command's PalominoError turned into its
exit code in one place (2 for a bad configuration or usage, 1 otherwise), with the message on stderr."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.logging import RichHandler

from palomino.errors import ConfigError, PalominoError

stderr = Console(stderr=True)  # progress and logs; results go to stdout


def fail(error: PalominoError) -> typer.Exit:
    stderr.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
    return typer.Exit(2 if isinstance(error, ConfigError) else 1)


class App(typer.Typer):
    """A Typer whose commands may raise PalominoError: the user sees its message, the shell its code."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        register = super().command(*args, **kwargs)

        def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(function)  # typer reads the options from the wrapped signature
            def guarded(*a: Any, **k: Any) -> Any:
                try:
                    return function(*a, **k)
                except PalominoError as error:
                    raise fail(error) from None

            register(guarded)
            return function

        return decorate


def configure_logging(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
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


def new_app() -> App:
    app = App(add_completion=False, no_args_is_help=True, help="Coevolutionary GAN training on a toroidal grid.")
    app.callback()(configure_logging)
    return app
