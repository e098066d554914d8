"""One trainer a run: `palomino train` holds its run directory's training.lock (flock) while it trains.

The kernel lets go of a flock when its process dies, even by SIGKILL, so a held lock means
running and a free one killed (or finished): what `palomino runs` and the dashboard show, and why
a second `--resume` of a running run fails naming the first. POSIX only, as Palomino is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from palomino.errors import PalominoError

# A probe (`palomino runs`, a dashboard) holds the lock shared for a moment: a trainer waits this
# long before it says the run is taken.
PROBE_GRACE_S = 1.0


class RunLock:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Held until the block ends; PalominoError naming the holder when another process trains the run."""
        with open(self.path, "a+") as handle:
            deadline = time.monotonic() + PROBE_GRACE_S
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        handle.seek(0)
                        holder = handle.read().strip() or "another process"
                        raise PalominoError(
                            f"{self.path.parent} is being trained by {holder}: wait for it, or stop it (Ctrl-C) "
                            "before resuming"
                        ) from None
                    time.sleep(0.05)
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}\n")
            handle.flush()
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def held(self) -> bool | None:
        """Whether a process holds the lock now; None for a run without one (an orchestrator's)."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 (closed below, after the probe)
        except FileNotFoundError:
            return None
        except OSError:
            return None  # unreadable: say nothing rather than fail a listing
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
