"""`palomino …`: the command line (typer + rich). Progress and logs go to stderr; results to stdout.

The app (main_app.py) turns errors into exit codes; the commands live by what they are about: a run
(run_commands.py), the orchestrator's clients (client_commands.py), the classifier
(classifier_commands.py), and each service beside the service (services/<name>/<name>_command.py,
services/up_command.py), registered here in the order `--help` lists them."""

from __future__ import annotations

import sys

from palomino.cli import classifier_commands, client_commands, run_commands
from palomino.cli.main_app import App, new_app
from palomino.services import up_command
from palomino.services.cell import cell_command
from palomino.services.dashboard import dashboard_command
from palomino.services.orchestrator import orchestrator_command
from palomino.services.scorer import scorer_command

RUN = "Train and use a run"
CLIENTS = "Orchestrator clients"


def build() -> App:
    app = new_app()
    for command in (run_commands.train, run_commands.runs, run_commands.sample):
        app.command(rich_help_panel=RUN)(command)
    cell_command.register(app)
    orchestrator_command.register(app)
    for command in (client_commands.submit, client_commands.wait, client_commands.status, client_commands.delete):
        app.command(rich_help_panel=CLIENTS)(command)
    up_command.register(app)
    scorer_command.register(app)
    dashboard_command.register(app)
    app.command(rich_help_panel=RUN)(run_commands.score)
    classifier = App(
        no_args_is_help=True,
        help="The small CNN behind the classifier and lipizzaner extractors (FID/IS features, TVD's class predictions).",
    )
    classifier.command("train")(classifier_commands.train)
    classifier.command("import")(classifier_commands.import_weights)
    app.add_typer(classifier, name="classifier", rich_help_panel=RUN)
    return app


app = build()
VERBOSE = ("-v", "--verbose")


def run(argv: list[str] | None = None) -> None:  # console-script entry point
    # -v is the callback's option, which click takes only before the command: move it there, so
    # `palomino train x.yaml -v` works too.
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in VERBOSE for a in args[1:]):
        args = ["--verbose", *(a for a in args if a not in VERBOSE)]
    app(args=args)
