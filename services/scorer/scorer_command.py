"""`palomino scorer`: a scorer."""

from __future__ import annotations

import typer

from palomino.services.common import command_options as options


def scorer(
    broker: str | None = options.BROKER, name: str | None = typer.Option(None, "--name", help="Default: host-pid.")
) -> None:
    """A scorer: takes score jobs from the queue `palomino.score`, publishes the scores as events."""
    from palomino.services.scorer.scorer import Scorer

    options.serve(Scorer(options.settings(broker), name))


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel="Services")(scorer)
