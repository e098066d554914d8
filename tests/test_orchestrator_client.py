"""`palomino wait` (OrchestratorClient.wait) against a real HTTP server that goes away and comes back."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from palomino.errors import TransportError
from palomino.services.common.client import OrchestratorClient
from palomino.services.local import free_port


def serve(port: int, state: str) -> HTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            body = json.dumps({"state": state, "reason": "", "run_dir": "runs/x"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_wait_outlasts_an_orchestrator_restart() -> None:
    port = free_port()
    client = OrchestratorClient(f"http://127.0.0.1:{port}", timeout=2)
    server = serve(port, "running")
    seen: list[str] = []

    def on_poll(summary: dict) -> None:
        seen.append(summary["state"])
        if len(seen) == 2:  # the orchestrator goes away mid-run, and a new one answers a little later
            server.shutdown()
            server.server_close()
            threading.Timer(1.5, lambda: seen.append(serve(port, "finished") and "restarted")).start()

    summary = client.wait("x", timeout=60, on_poll=on_poll, period=0.2)
    assert summary["state"] == "finished" and "restarted" in seen


def test_wait_gives_up_on_an_orchestrator_that_stays_away() -> None:
    client = OrchestratorClient(f"http://127.0.0.1:{free_port()}", timeout=1)
    with pytest.raises(TransportError, match="cannot reach the orchestrator"):
        client.wait("x", period=0.1, unreachable=1.0)
