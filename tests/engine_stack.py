"""A real container engine for the tests: podman, its Docker-compatible socket and docker-compose.

The tests start their own `podman system service` on a socket in a temporary folder (and, where no
systemd runs podman's healthcheck timers, deploy/podman-healthchecks.sh beside it), and drive the
project's own docker-compose.yml through it, each run under a compose project name of its own.
Images come from deploy/local-images.sh and deploy/wheelhouse.sh, as a user without a registry
would make them; podman keeps them and their build cache between runs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO

REQUIRED = {"podman": "podman crun", "docker-compose": "docker-compose", "debootstrap": "debootstrap"}


def missing_or_skip() -> None:
    """Skip with the reason where no engine can run here; under CI (CI=1) that is a failure."""
    missing = [package for program, package in REQUIRED.items() if shutil.which(program) is None]
    reason = ""
    if missing:
        reason = f"no container engine: apt-get install {' '.join(missing)} (scripts/ensure-services.sh does)"
    elif os.geteuid() != 0:
        reason = "deploy/local-images.sh needs root (debootstrap, the engine's host settings): run as root"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


def run(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert done.returncode == 0, (
        f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done.stdout


class Engine:
    """podman behind a socket of its own, with docker-compose pointed at it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = folder / "podman.sock"
        self.env = os.environ | {"DOCKER_HOST": f"unix://{self.socket}", "COMPOSE_INTERACTIVE_NO_CLI": "1"}
        self.processes: list[subprocess.Popen] = []

    def start(self) -> None:
        log = (self.folder / "podman-service.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{self.socket}"], stdout=log, stderr=log
            )
        )
        wait_until(self.socket.exists, "podman's socket", timeout=30)

    def watch_health(self, project: str) -> None:
        """Where systemd runs, podman's own timers do this."""
        if Path("/run/systemd/system").is_dir():
            return
        log = (self.folder / f"healthchecks-{project}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                ["bash", str(REPO / "deploy" / "podman-healthchecks.sh"), project],
                env=os.environ | {"INTERVAL": "3"},
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # the healthcheck loop: its whole group
                    os.killpg(process.pid, 15) if process.args[0] == "bash" else process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()

    def compose(self, project: str, env_file: Path, *args: str, timeout: float = 900) -> str:
        command = ["docker-compose", "--compatibility", "-p", project, "--env-file", str(env_file), *args]
        return run(command, timeout, self.env)

    def podman(self, *args: str, timeout: float = 120) -> str:
        return run(["podman", *args], timeout)

    def logs(self, container: str) -> str:
        done = subprocess.run(
            ["podman", "logs", "--tail", "50", container], capture_output=True, text=True, timeout=60, check=False
        )
        return done.stdout + done.stderr

    def containers(self, project: str, service: str | None = None, all: bool = False) -> list[dict]:
        filters = ["--filter", f"label=com.docker.compose.project={project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        return json.loads(self.podman("ps", *(["-a"] if all else []), "--format", "json", *filters) or "[]")


def wait_until(condition: Callable[[], object], what: str, timeout: float, every: float = 1.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting {timeout:.0f} s for {what}"
        time.sleep(every)


def get_json(url: str, token: str | None = None, timeout: float = 10) -> object:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())
