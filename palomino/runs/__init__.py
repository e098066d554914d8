"""The run directory: its files, checkpoints, results and mixtures (the loops that fill it are
palomino/engine).

Only the torch-free parts load eagerly (the orchestrator imports this package without torch).
"""

from palomino.runs.directory import RunDirectory, read_jsonl

__all__ = ["Mixture", "RunDirectory", "read_jsonl"]


def __getattr__(name: str):
    if name == "Mixture":  # torch: loaded on first use only
        from palomino.runs.mixture import Mixture

        return Mixture
    raise AttributeError(name)
