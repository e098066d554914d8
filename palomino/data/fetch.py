"""Where dataset files live, fetching them when allowed, and the error when they are missing.

`data_dir(name, configured)` is the one rule for a dataset's folder: `data.dir` when set, else
`$PALOMINO_DATA_DIR/<name>` when that variable is set, else the user cache (`~/.cache/palomino/<name>`
on Linux). Everything that looks for dataset files — the loaders, the benchmarks, the tests — asks it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from http.client import HTTPException
from pathlib import Path
from urllib.request import urlopen

from palomino.cache import cache_root
from palomino.errors import DatasetError

DATA_DIR_ENV = "PALOMINO_DATA_DIR"
TIMEOUT_S = 10.0
# What a failed fetch can raise: URLError and timeouts are OSErrors; bad md5 is our ValueError.
FETCH_ERRORS = (OSError, HTTPException, ValueError)


def data_dir(name: str, configured: str | os.PathLike[str] | None = None) -> Path:
    """The folder of dataset `name`: `configured` (data.dir), else $PALOMINO_DATA_DIR/<name>, else the
    user cache's <name>/."""
    if configured is not None:
        return Path(configured).expanduser()
    if root := os.environ.get(DATA_DIR_ENV, "").strip():
        return Path(root).expanduser() / name
    return cache_root() / name


def how_to_get(name: str) -> str:
    """How to give Palomino a dataset's files: the line its missing-files messages end with."""
    return (
        f"To get them: put them in data.dir (--set data.dir=DIR), or in ${DATA_DIR_ENV}/{name} with data.dir unset; "
        "or download them: --set data.download=true (palomino classifier train: --download)."
    )


@contextlib.contextmanager
def leaves_nothing_on_failure(folder: Path) -> Iterator[None]:
    """What the block adds under `folder` — files, subfolders, `folder` itself and the parents it needed —
    is removed again if the block raises: a failed fetch leaves no partial file and no empty folder."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    before = set(folder.rglob("*")) if folder.is_dir() else set()
    try:
        yield
    except BaseException:
        added = set(folder.rglob("*")) - before if folder.is_dir() else set()
        for path in sorted(added, key=lambda p: len(p.parts), reverse=True):  # contents before their folders
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for made in created:
            with contextlib.suppress(OSError):  # not empty (someone else's files): leave it
                made.rmdir()
        raise


def download(url: str, dest: Path, md5: str, timeout: float = TIMEOUT_S) -> None:
    """Stream `url` to `dest`, verifying md5; a partial or corrupt file never lands at `dest`, and a
    failure removes the folders it made."""
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.md5()
    with leaves_nothing_on_failure(dest.parent):
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            with urlopen(url, timeout=timeout) as response, part.open("wb") as out:
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != md5:
                raise ValueError(f"{url}: md5 {digest.hexdigest()} != expected {md5}")
            part.replace(dest)
        finally:
            part.unlink(missing_ok=True)


def download_any(urls: tuple[str, ...], dest: Path, md5: str) -> None:
    """Try each mirror in turn; re-raise the last failure if none works."""
    error: Exception = ValueError("no mirror configured")
    for url in urls:
        try:
            return download(url, dest, md5)
        except FETCH_ERRORS as e:
            error = e
    raise error


def missing_files_error(
    what: str,
    searched: list[Path],
    target: Path,
    files: list[str],
    reason: str,
    note: str = "",
    hint: str = "",
) -> DatasetError:
    """One message that says exactly which files to put where."""
    listing = "".join(f"\n  {target / f}" for f in files)
    where = ", ".join(str(d) for d in searched)
    message = f"{what} not found (searched {where}); {reason}."
    message += f" Put these files in place{note}:{listing}"
    return DatasetError(message + (f"\n{hint}" if hint else ""))
