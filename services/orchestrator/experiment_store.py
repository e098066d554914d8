"""What the orchestrator must not lose when it is killed: each experiment's state, layout and epoch,
and the results its cells already reported, written into the experiment's own run directory.

    <run>/orchestrator.json           state, reason, epoch, rows, cols, cell → worker, failures, …
    <run>/collected/<cell>/           a finished cell's result as it arrived (mixture.*, result.json, samples.png)

Every write is atomic (temp file + rename), so a kill at any moment leaves the previous version.
A restarted orchestrator reads them back (`read_states`, `read_collected`) and reloads the
experiments and their workers. Torch-free, like the orchestrator."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from palomino.io import atomic_write
from palomino.runs.result import CellResult, save_encoded

log = logging.getLogger(__name__)

STATE_FILE = "orchestrator.json"
COLLECTED = "collected"
VERSION = 1


def write_state(run_dir: Path, state: dict[str, Any]) -> None:
    atomic_write(Path(run_dir) / STATE_FILE, json.dumps({"version": VERSION, **state}, indent=1, default=str).encode())


def read_states(runs: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(run directory, its saved state) for every run under `runs` an orchestrator kept; unreadable ones are skipped."""
    if not Path(runs).is_dir():
        return
    for path in sorted(Path(runs).glob(f"*/{STATE_FILE}")):
        try:
            state = json.loads(path.read_text())
            if not isinstance(state, dict) or state.get("version") != VERSION:
                raise ValueError(
                    f"version {state.get('version') if isinstance(state, dict) else '?'}, expected {VERSION}"
                )
        except (OSError, ValueError) as error:
            log.warning("%s: not reloaded (%s)", path, error)
            continue
        yield path.parent, state


def write_collected(run_dir: Path, result: CellResult) -> None:
    """A cell's reported result, kept until the experiment's result/ is written."""
    folder = Path(run_dir) / COLLECTED / result.cell
    save_encoded(folder, result.payload, result.description)
    side = {
        "score": result.score,
        "components": result.components,
        "weights": result.weights,
        "trained_at": result.trained_at,
    }
    if result.samples_png:
        side["samples_png"] = base64.b64encode(result.samples_png).decode()
    atomic_write(folder / "result.json", json.dumps(side).encode())


def read_collected(run_dir: Path, cells: list[str], with_bytes: bool = True) -> dict[str, CellResult]:
    """The kept results of `cells` (those that are readable); without their mixtures' and pictures'
    bytes where `with_bytes` is false (an ended experiment's: Experiment.release_results)."""
    found = {}
    for cell in cells:
        folder = Path(run_dir) / COLLECTED / cell
        try:
            side = json.loads((folder / "result.json").read_text())
            payload = (folder / "mixture.safetensors").read_bytes() if with_bytes else b""
            png = base64.b64decode(side.get("samples_png", "")) if with_bytes else b""
            found[cell] = CellResult(
                cell, float(side["score"]), list(side["components"]), [float(w) for w in side["weights"]],
                payload, json.loads((folder / "mixture.json").read_text()), png, trained_at=str(side.get("trained_at", "")),
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning(
                "%s: the result of cell %s is not readable (%s); its coordinate is handled as a failed cell",
                run_dir,
                cell,
                error,
            )
    return found
