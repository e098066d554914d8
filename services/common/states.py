"""An experiment's states, as the orchestrator keeps them and its API and clients name them."""

from __future__ import annotations

from typing import Literal, get_args

State = Literal["waiting", "running", "finished", "failed", "stopped"]
STATES: tuple[State, ...] = get_args(State)
ENDED: tuple[State, ...] = ("finished", "failed", "stopped")  # nothing more will happen to it
