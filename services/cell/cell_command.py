"""`palomino cell`: a cell worker."""

from __future__ import annotations

import typer

from palomino.services.common import command_options as options
from palomino.wire.control_messages import MAX_CELLS_PER_WORKER


def cell(
    broker: str | None = options.BROKER,
    redis: str | None = options.REDIS,
    device: str = typer.Option(
        "cpu", "--device", metavar="cpu|cuda[:N]", callback=options.device, help="Where this worker trains."
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

    options.serve(CellWorker(options.settings(broker, redis), worker_id, device, cells))


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel="Services")(cell)
