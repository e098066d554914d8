"""Running the dashboard: `palomino dashboard` (blocking) and `palomino train --dashboard` (a background thread)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from palomino.endpoints import DASHBOARD_PORT
from palomino.errors import ConfigError
from palomino.services.common.runfiles import RunsFolder
from palomino.services.dashboard.app import create_app
from palomino.services.dashboard.events import EventHub
from palomino.services.dashboard.feeds import BrokerFeed, RunsFeed
from palomino.services.dashboard.history import CombinedHistory, OrchestratorHistory, RunsHistory
from palomino.services.dashboard.settings import DEFAULT_RUNS, DashboardSettings, dashboard_settings

log = logging.getLogger(__name__)


def build_app(settings: DashboardSettings) -> FastAPI:
    """The app with the history sources and live feeds that `settings` name."""
    hub = EventHub()
    sources, feeds = [], []
    if settings.orchestrator_url:
        token = settings.orchestrator_token.get_secret_value() if settings.orchestrator_token else None
        sources.append(OrchestratorHistory(settings.orchestrator_url, token=token))
    if settings.dashboard_runs is not None:
        folder = RunsFolder(settings.dashboard_runs)
        sources.append(RunsHistory(folder))
        feeds.append(RunsFeed(folder, hub, settings.dashboard_poll_seconds))
    if settings.broker_url:
        feeds.append(BrokerFeed(settings.broker_url, hub))
    return create_app(
        CombinedHistory(sources), hub, feeds=feeds, token=settings.token, origins=settings.dashboard_origins
    )


def listen(host: str, port: int, flag: str = "--port") -> socket.socket:
    """A listening socket (port 0: any free one), or a ConfigError naming `flag` when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ConfigError(
            f"dashboard: {flag} {port}: cannot listen on {host}:{port} ({error.strerror}); pick another port"
        ) from None
    sock.listen(128)  # from now on connections wait in the backlog until the server accepts them
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{'[' + shown + ']' if ':' in shown else shown}:{port}"


async def _preflight(settings: DashboardSettings) -> None:
    """Fail fast, naming the URL, when the broker cannot be reached (history sources may come later)."""
    if settings.broker_url:
        from palomino.transport.broker import connect

        connection = await connect(settings.broker_url)
        await connection.close()


def _config(app: FastAPI) -> uvicorn.Config:
    # A short grace: open event streams never end by themselves.
    return uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")


def serve(settings: DashboardSettings, host: str = "127.0.0.1", port: int = DASHBOARD_PORT, on_ready=None) -> None:
    """`palomino dashboard`: serve until interrupted."""
    runs = settings.dashboard_runs
    if runs is not None and not runs.is_dir():
        if runs != DEFAULT_RUNS:
            raise ConfigError(f"dashboard: --runs {runs}: no such folder (give the folder that holds run directories)")
        log.warning("dashboard: %s does not exist yet; its runs will show once it does", runs)
    asyncio.run(_preflight(settings))
    sock = listen(host, port)
    if on_ready is not None:
        on_ready(url_of(sock))
    uvicorn.Server(_config(build_app(settings))).run(sockets=[sock])


class ServerThread:
    """An app served from a thread on an already bound socket; stopped (and the socket closed) by stop()."""

    def __init__(self, app: FastAPI, sock: socket.socket) -> None:
        self.url = url_of(sock)
        self._sock = sock
        self._server = uvicorn.Server(_config(app))
        self._thread = threading.Thread(target=self._run, name="palomino-dashboard", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as error:  # noqa: BLE001 — noted; whoever started the thread goes on without its page
            self.error = error
            log.warning("dashboard stopped: %s", error)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class BackgroundDashboard(ServerThread):
    """The dashboard over one run directory, for `palomino train --dashboard PORT`.

    Give it a socket from `listen()` (taken before the run directory is written) or a port.
    The server runs between __enter__ and __exit__; only this run is shown, from its files.
    """

    def __init__(self, run_dir: Path, sock: socket.socket | int, host: str = "127.0.0.1") -> None:
        base = dashboard_settings()  # the token and allowed origins still come from the environment
        settings = base.model_copy(
            update={"dashboard_runs": Path(run_dir), "orchestrator_url": None, "broker_url": None}
        )
        super().__init__(build_app(settings), listen(host, sock) if isinstance(sock, int) else sock)
