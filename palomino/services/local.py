"""`palomino up`: an orchestrator and N+K cells as local processes, one experiment, then tidy up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from palomino.errors import PalominoError
from palomino.services.client import OrchestratorClient
from palomino.services.settings import ServiceSettings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen([sys.executable, "-m", "palomino", *args], stdout=handle, stderr=subprocess.STDOUT, env=env)


def _stop(processes: list[subprocess.Popen], grace: float = 15.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_up(config_yaml: str, cells: int, spares: int, out: Path, settings: ServiceSettings, port: int, console: Console) -> dict[str, Any]:
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    logs = Path(out) / ".up-logs" / time.strftime("%Y%m%d-%H%M%S")
    env = {**os.environ, "PALOMINO_BROKER_URL": settings.broker_url, "PALOMINO_REDIS_URL": settings.redis_url}
    orchestrator = _spawn(["orchestrator", "--runs", str(out), "--port", str(port)], logs / "orchestrator.log", env)
    workers: list[subprocess.Popen] = []
    try:
        client = OrchestratorClient(url)
        deadline = time.monotonic() + 60
        while not client.healthy():
            if orchestrator.poll() is not None:
                raise PalominoError(f"the orchestrator exited (code {orchestrator.returncode}); see {logs / 'orchestrator.log'}")
            if time.monotonic() > deadline:
                raise PalominoError(f"the orchestrator did not answer on {url} within 60 s; see {logs / 'orchestrator.log'}")
            time.sleep(0.3)
        prefix = f"up{port}"
        for i in range(cells + spares):
            workers.append(_spawn(["cell", "--worker-id", f"{prefix}-{i}"], logs / f"cell-{i}.log", env))
        experiment = client.submit(config_yaml)["id"]
        console.print(f"experiment {experiment}: {cells} cells + {spares} spares; logs in {logs}", highlight=False)
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[state]}"), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("cell-iterations", total=None, state="waiting")

            def on_poll(summary: dict[str, Any]) -> None:
                total = (summary["rows"] or 0) * (summary["cols"] or 0) * summary["iterations"] or None
                epoch = f", epoch {summary['epoch']}" if summary["epoch"] else ""
                progress.update(task, total=total, completed=summary["records"], state=summary["state"] + epoch)

            summary = client.wait(experiment, on_poll=on_poll)
        if summary["state"] != "finished":
            console.print(f"experiment {experiment} {summary['state']}: {summary['reason']}", highlight=False)
        return summary
    finally:
        _stop(workers)
        _stop([orchestrator])
