"""`python -m palomino` = the `palomino` command."""

from palomino.cli import run

run()
