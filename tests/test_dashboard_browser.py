"""The page in headless Chromium (Debian's, driven by Playwright) against a running distributed 2×2
experiment: a real orchestrator, four cell processes, RabbitMQ and Redis (the session's throwaway
ones) and `palomino dashboard`.

It sees four tiles, a tile's colour change as events arrive, a cell's charts and samples, a dead
cell marked and the grid redrawn when it shrinks, and the ranked result at the end. A screenshot
goes to tmp_path, and to $PALOMINO_DASHBOARD_SCREENSHOT when set (docs/dashboard.png is made so).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from servers import Servers

from palomino.services.common.client import OrchestratorClient
from palomino.services.local import free_port, stop_processes

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(
        "Debian's chromium is not installed (apt-get install chromium; `make test` installs it)",
        allow_module_level=True,
    )

from playwright.sync_api import sync_playwright  # noqa: E402  (after the skip: the browser is what it drives)


def experiment_yaml() -> str:
    return yaml.safe_dump({
        "name": "browser",
        "seed": 5,
        "grid": {"rows": 2, "cols": 2},
        "training": {
            "iterations": 120, "batch_size": 32, "batches_per_iteration": 20,
            "fitness": {"sample_size": 32}, "mixture": {"score_samples": 64},
            "checkpoint_every": 5, "sample_every": 5,
        },
        "data": {"name": "gaussian_ring", "size": 500},
        "network": {"name": "mlp", "hidden": 16, "latent_dim": 8},
        # A dead worker stays on the page (marked) for a heartbeat TTL before the grid shrinks.
        "distributed": {"heartbeat_ttl": 8.0, "neighbour_timeout": 20.0, "on_failure": "shrink", "min_cells": 2},
    })  # fmt: skip


@pytest.fixture
def broker(servers: Servers):
    """A virtual host of our own on the session's broker: another stack's orchestrator there would
    otherwise share the control queue and take some of our workers' registrations."""
    name = f"palomino-dashboard-{uuid.uuid4().hex[:8]}"
    servers.rabbitmq.ctl("-q", "add_vhost", name)
    servers.rabbitmq.ctl("-q", "set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    yield servers.broker_url.rstrip("/") + "/" + name
    servers.rabbitmq.ctl("-q", "delete_vhost", name, check=False)


class Processes:
    def __init__(self, tmp_path: Path, broker: str) -> None:
        self.tmp_path = tmp_path
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PALOMINO_BROKER_URL": broker}
        self.running: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}.log", "wb")
        self.running[name] = subprocess.Popen(
            [sys.executable, "-m", "palomino", *args], stdout=log, stderr=subprocess.STDOUT, env=self.env
        )
        return self.running[name]

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        stop_processes(list(self.running.values()))


def wait_http(url: str, what: str, processes: Processes, name: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert processes.running[name].poll() is None, f"{what} exited:\n{processes.log(name)}"
        assert time.monotonic() < deadline, f"{what} did not answer:\n{processes.log(name)}"
        time.sleep(0.3)


@pytest.fixture
def stack(tmp_path: Path, broker: str):
    processes = Processes(tmp_path, broker)
    yield processes
    processes.stop()


def colour(page, cell: str) -> str:
    return page.eval_on_selector(f'.tile[data-cell="{cell}"]', "e => getComputedStyle(e).backgroundColor")


def test_page_follows_a_running_2x2_experiment(stack: Processes, tmp_path: Path) -> None:
    orchestrator_port, dashboard_port = free_port(), free_port()
    orchestrator = f"http://127.0.0.1:{orchestrator_port}"
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    stack.start("orchestrator", "orchestrator", "--runs", str(tmp_path / "runs"), "--port", str(orchestrator_port))
    wait_http(f"{orchestrator}/healthz", "the orchestrator", stack, "orchestrator")
    stack.start(
        "dashboard",
        "dashboard",
        "--orchestrator",
        orchestrator,
        "--broker",
        stack.env["PALOMINO_BROKER_URL"],
        "--port",
        str(dashboard_port),
    )
    wait_http(f"{dashboard}/healthz", "the dashboard", stack, "dashboard")
    workers = [f"b{orchestrator_port}-{i}" for i in range(4)]
    for i, worker in enumerate(workers):
        stack.start(f"cell-{i}", "cell", "--worker-id", worker)
    experiment = OrchestratorClient(orchestrator).submit(experiment_yaml())["id"]

    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1500, "height": 1050})
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{dashboard}/#/exp/{experiment}")

        page.wait_for_function("() => document.querySelectorAll('#heatmap .tile').length === 4", timeout=120_000)
        cells = sorted(page.eval_on_selector_all("#heatmap .tile", "tiles => tiles.map(t => t.dataset.cell)"))
        assert cells == ["0-0", "0-1", "1-0", "1-1"]
        print(f"\n[browser] four tiles: {cells}")

        # A tile's colour changes when the next metrics events arrive.
        page.wait_for_function(
            "() => document.querySelector('.tile[data-cell=\"0-1\"]').dataset.iteration !== ''", timeout=120_000
        )
        before, events_before = colour(page, "0-1"), page.evaluate("window.palomino.events")
        iteration_before = int(page.get_attribute('.tile[data-cell="0-1"]', "data-iteration"))
        page.wait_for_function(
            "([c, n]) => getComputedStyle(document.querySelector('.tile[data-cell=\"0-1\"]')).backgroundColor !== c && window.palomino.events > n",
            arg=[before, events_before],
            timeout=60_000,
        )
        after = colour(page, "0-1")
        iteration_after = int(page.get_attribute('.tile[data-cell="0-1"]', "data-iteration"))
        assert after != before and iteration_after >= iteration_before
        print(
            f"[browser] tile 0-1: {before} (iteration {iteration_before}) → {after} (iteration {iteration_after}); "
            f"{page.evaluate('window.palomino.events')} events in {page.evaluate('window.palomino.batches')} batches"
        )

        # A cell's details: charts of its history, its newest samples beside the real ones.
        page.click('.tile[data-cell="1-1"]')
        page.wait_for_selector("#cell:not([hidden])")
        page.wait_for_function("() => document.querySelectorAll('#cell .chart canvas').length >= 5", timeout=30_000)
        page.wait_for_function("() => document.querySelector('#cell-samples').naturalWidth > 0", timeout=60_000)
        titles = page.eval_on_selector_all("#cell .u-title", "ts => ts.map(t => t.textContent)")
        assert titles[:4] == ["losses", "fitness", "learning rates", "mixture score (MMD², lower is better)"]
        assert "iteration" in page.inner_text("#cell-info")
        print(f"[browser] cell 1-1 details: charts {titles}; {page.inner_text('#cell-samples-caption')}")
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        if os.environ.get("PALOMINO_DASHBOARD_SCREENSHOT"):
            shutil.copy(shot, os.environ["PALOMINO_DASHBOARD_SCREENSHOT"])
        print(f"[browser] screenshot: {shot}")

        # A worker dies: its tile is marked dead, then the grid shrinks and is redrawn.
        stack.running["cell-0"].send_signal(signal.SIGKILL)
        page.select_option("#metric", "alive")
        page.wait_for_selector(".tile.dead", timeout=60_000)
        dead = page.eval_on_selector(".tile.dead", "t => t.dataset.cell")
        print(f"[browser] worker {workers[0]} killed: tile {dead} marked dead")
        page.wait_for_function("() => document.querySelectorAll('#heatmap .tile').length === 3", timeout=90_000)
        print(f"[browser] grid redrawn: {page.inner_text('#layout-note')}")
        page.select_option("#metric", "gfit")

        # The end: the ranked mixtures and their samples.
        page.wait_for_function("() => document.querySelector('#exp-state').textContent === 'finished'", timeout=300_000)
        page.wait_for_function("() => document.querySelectorAll('#ranking tbody tr').length === 3", timeout=30_000)
        page.wait_for_function("() => document.querySelector('#result-samples').naturalWidth > 0", timeout=30_000)
        print(
            f"[browser] finished; ranking rows: {page.eval_on_selector_all('#ranking tbody tr', 'rs => rs.map(r => r.cells[1].textContent)')}"
        )
        # No scorer in this stack to optimise the grid's ensemble: the result says it is the best cell's mixture.
        assert page.inner_text("#ensemble") == "result: the best cell's neighbourhood mixture"

        # Replay: the slider goes back to an earlier iteration, before the shrink.
        page.eval_on_selector("#iteration", "s => { s.value = 2; s.dispatchEvent(new Event('input')); }")
        page.wait_for_function("() => document.querySelectorAll('#heatmap .tile').length === 4", timeout=10_000)
        print("[browser] slider at iteration 2: the 2×2 layout again")
        browser.close()
    assert errors == [], errors
