"""Where a submitted experiment may read data from: the allowed roots (PALOMINO_DATA_ROOTS).

The orchestrator reads a submitted config's data.dir (real samples for the dashboard) and hands it
to cells: without roots, anyone who can submit could read any folder the service can. A path
outside every root is refused with the same message whether it exists or not."""

from __future__ import annotations

import os
from pathlib import Path

from palomino.cache import cache_root
from palomino.errors import ConfigError

# The usual dataset folders: the working directory's data/, the images' datasets volume, Debian's
# dataset packages, and Palomino's download cache.
DEFAULT_ROOTS = ("data", "/data/datasets", "/usr/share/datasets", str(cache_root()))


def data_roots(setting: str | None = None) -> list[Path]:
    """The allowed roots: `setting` (os.pathsep-separated, as PALOMINO_DATA_ROOTS), else the defaults."""
    given = [part for part in (setting or "").split(os.pathsep) if part.strip()]
    return [Path(os.path.realpath(Path(root.strip()).expanduser())) for root in given or DEFAULT_ROOTS]


def check_data_dir(directory: Path | None, roots: list[Path]) -> None:
    """ConfigError unless `directory` (symlinks and .. resolved) lies under one of `roots`."""
    if directory is None:
        return  # the download cache or a package folder: Palomino's own choice
    resolved = Path(os.path.realpath(Path(directory).expanduser()))
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        raise ConfigError(
            f"data.dir: {str(directory)[:200]!r} is not under an allowed data root; the orchestrator reads data only under "
            f"PALOMINO_DATA_ROOTS ({os.pathsep.join(map(str, roots))}): put the data there or add its folder to that variable"
        )
