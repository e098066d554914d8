from palomino.cli import run

run()
