"""`palomino up`: an orchestrator and N+K cells as local processes, one experiment, then tidy up."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from palomino.errors import PalominoError
from palomino.runs.directory import RunDirectory
from palomino.services.common.client import OrchestratorClient
from palomino.services.common.service_settings import ServiceSettings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when `up` dies, even by SIGKILL (no orphaned workers)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the children outlive a killed `up`


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "palomino", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )


def stop_processes(processes: list[subprocess.Popen], grace: float = 15.0) -> None:
    """SIGTERM to each (they finish their iteration and checkpoint), SIGKILL to any still there after `grace` s."""
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


def summarise_scores(entry: dict[str, Any]) -> str:
    """One line of a scores.json entry: each metric's value, or the error."""
    if entry.get("error"):
        return f"not scored: {entry['error']}"
    parts = []
    for name, metric in entry.get("metrics", {}).items():
        value = metric.get("value")
        if name == "modes" and value is not None:
            parts.append(f"modes {value}/{metric.get('modes')} (high quality {metric.get('high_quality', 0):.1%})")
        else:
            parts.append(f"{name} {value:.4g}" if isinstance(value, (int, float)) else f"{name} n/a")
    return ", ".join(parts) or json.dumps(entry)[:200]


def wait_for_scores(run_dir: Path, targets: int, timeout: float) -> dict[str, Any]:
    """scores.json once it holds `targets` final results (or whatever it holds after `timeout`)."""
    path = RunDirectory(run_dir).scores_path
    deadline = time.monotonic() + timeout
    scores: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            scores = json.loads(path.read_text())
        except (OSError, ValueError):
            scores = {}
        if ("best" in scores) + len(scores.get("cells", {})) >= targets:
            break
        time.sleep(0.5)
    return scores


def _roots_with(roots: str, directory: str | None) -> str:
    """PALOMINO_DATA_ROOTS (or the defaults) plus `directory`, for a stack started by its own user."""
    from palomino.config.data_roots import DEFAULT_ROOTS

    given = [r for r in roots.split(os.pathsep) if r.strip()] or list(DEFAULT_ROOTS)
    return os.pathsep.join([*given, str(Path(directory).expanduser().resolve())] if directory else given)


def worker_sizes(cells: int, per_worker: int) -> list[int]:
    """How many cells each worker process hosts: `per_worker` each, the last one the rest."""
    full, rest = divmod(cells, per_worker)
    return [per_worker] * full + ([rest] if rest else [])


def run_up(
    config_yaml: str,
    cells: int,
    spares: int,
    out: Path,
    settings: ServiceSettings,
    port: int,
    console: Console,
    scorers: int = 1,
    score_timeout: float = 600.0,
    per_worker: int = 1,
) -> dict[str, Any]:
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    logs = Path(out) / ".up-logs" / time.strftime("%Y%m%d-%H%M%S")
    env, token = _stack_environment(settings, config_yaml, port)
    orchestrator = _spawn(["orchestrator", "--runs", str(out), "--port", str(port)], logs / "orchestrator.log", env)
    workers: list[subprocess.Popen] = []
    try:
        client = OrchestratorClient(url, token=token)
        _wait_until_healthy(client, orchestrator, url, logs)
        prefix = f"up{port}"
        for i, hosted in enumerate(worker_sizes(cells, per_worker) + worker_sizes(spares, per_worker)):
            args = ["cell", "--worker-id", f"{prefix}-{i}", "--cells", str(hosted)]
            workers.append(_spawn(args, logs / f"cell-{i}.log", env))
        for i in range(scorers):
            workers.append(_spawn(["scorer", "--name", f"{prefix}-scorer-{i}"], logs / f"scorer-{i}.log", env))
        experiment = client.submit(config_yaml)["id"]
        console.print(f"experiment {experiment}: {cells} cells + {spares} spares; logs in {logs}", highlight=False)
        summary = _follow(client, experiment, console)
        if summary["state"] != "finished":
            console.print(f"experiment {experiment} {summary['state']}: {summary['reason']}", highlight=False)
        elif scorers and yaml.safe_load(config_yaml).get("scoring", {}).get("final", True):
            _report_scores(summary, console, logs, score_timeout)
        return summary
    finally:
        stop_processes(workers)
        stop_processes([orchestrator])


def _stack_environment(settings: ServiceSettings, config_yaml: str, port: int) -> tuple[dict[str, str], str]:
    """The stack's environment and its API token. Its own namespace: another stack on the same broker
    (another `up`, a deployment) never sees its messages."""
    namespace = settings.namespace or f"up-{port}-{os.getpid()}"
    # PALOMINO_ORCHESTRATOR_TOKEN when set, else one made for this stack alone: its API is never open.
    token = settings.token or secrets.token_urlsafe(32)
    # Likewise the key that signs its services' messages: nothing else on the broker can speak for them.
    key = settings.message_key.get_secret_value() if settings.message_key else secrets.token_urlsafe(32)
    data_dir = (yaml.safe_load(config_yaml) or {}).get("data", {}).get("dir")
    env = {
        **os.environ, "PALOMINO_BROKER_URL": settings.broker_url, "PALOMINO_REDIS_URL": settings.redis_url,
        "PALOMINO_NAMESPACE": namespace, "PALOMINO_ORCHESTRATOR_TOKEN": token, "PALOMINO_MESSAGE_KEY": key,
        # Its own experiment's data folder is allowed: the user who runs `up` chose it.
        "PALOMINO_DATA_ROOTS": _roots_with(settings.data_roots, data_dir),
        "PALOMINO_TENSORBOARD": str(Path(settings.tensorboard).resolve()) if settings.tensorboard else "",
        # Two malloc arenas, not one a thread: long-lived torch services' memory stays flat (docs/distributed.md).
        "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2"),
    }  # fmt: skip
    return env, token


def _wait_until_healthy(client: OrchestratorClient, orchestrator: subprocess.Popen, url: str, logs: Path) -> None:
    deadline = time.monotonic() + 60
    while not client.healthy():
        if orchestrator.poll() is not None:
            raise PalominoError(
                f"the orchestrator exited (code {orchestrator.returncode}); see {logs / 'orchestrator.log'}"
            )
        if time.monotonic() > deadline:
            raise PalominoError(
                f"the orchestrator did not answer on {url} within 60 s; see {logs / 'orchestrator.log'}"
            )
        time.sleep(0.3)


def _follow(client: OrchestratorClient, experiment: str, console: Console) -> dict[str, Any]:
    """The experiment's summary once it ends, a progress bar of its cell-iterations meanwhile."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("cell-iterations", total=None, state="waiting")

        def on_poll(summary: dict[str, Any]) -> None:
            total = len(summary["cells"]) * summary["iterations"] or None
            epoch = f", epoch {summary['epoch']}" if summary["epoch"] else ""
            progress.update(task, total=total, completed=summary["records"], state=summary["state"] + epoch)

        return client.wait(experiment, on_poll=on_poll)


def _report_scores(summary: dict[str, Any], console: Console, logs: Path, score_timeout: float) -> None:
    """The best mixture and every cell's: the scorers' results land in scores.json."""
    targets = len(summary["cells"]) + ("classes" not in summary)  # partitioned: no single best mixture
    with console.status(f"scoring {targets} mixtures"):
        scores = wait_for_scores(Path(summary["run_dir"]), targets, score_timeout)
    best = scores.get("best")
    if "classes" in summary:
        console.print(
            f"{len(scores.get('cells', {}))} cells scored; the class mixture: palomino score {summary['run_dir']}",
            highlight=False,
        )
    elif best is None:
        console.print(f"no score arrived within {score_timeout:.0f} s; see {logs}", highlight=False)
    else:
        console.print(f"best mixture: {summarise_scores(best)}", highlight=False)
