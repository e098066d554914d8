"""Palomino's services: thin shells over the library — settings, wiring, lifecycle.

Installed as `palomino.services` (pyproject's package-dir mapping), so `pip install palomino`
ships them and the one `palomino` command starts each (`palomino orchestrator`, `cell`, `scorer`,
`dashboard`, `up`). No service imports another; what they share is in `common/`.
"""
