"""Where dataset files live, fetching them when allowed, and the error when they are missing."""

from __future__ import annotations

import hashlib
from http.client import HTTPException
from pathlib import Path
from urllib.request import urlopen

from palomino.cache import cache_root
from palomino.errors import DatasetError

TIMEOUT_S = 10.0
# What a failed fetch can raise: URLError and timeouts are OSErrors; bad md5 is our ValueError.
FETCH_ERRORS = (OSError, HTTPException, ValueError)


def cache_dir(name: str) -> Path:
    return cache_root() / name


def download(url: str, dest: Path, md5: str, timeout: float = TIMEOUT_S) -> None:
    """Stream `url` to `dest`, verifying md5; a partial or corrupt file never lands at `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.md5()
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
