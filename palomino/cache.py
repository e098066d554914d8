"""Palomino's cache folder: downloaded datasets, real-data statistics, extractor weights.

The platform's user cache directory (platformdirs): ~/.cache/palomino on Linux ($XDG_CACHE_HOME
respected), ~/Library/Caches/palomino on macOS. Torch-free: the orchestrator uses it too."""

from __future__ import annotations

from pathlib import Path

import platformdirs


def cache_root() -> Path:
    return Path(platformdirs.user_cache_dir("palomino", appauthor=False))
