"""Schemathesis against the orchestrator's and the dashboard's APIs, each served by its real process
(`palomino orchestrator` on the session's throwaway RabbitMQ and Redis; `palomino dashboard` over a
real run): generated requests, valid and not, never get a 5xx; with the token the responses are what
the schema documents; without it every guarded route answers 401."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from conftest import cli_command, cli_env, palomino, tiny, write_yaml
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import response_schema_conformance
from servers import Servers

from palomino.services.common.client import OrchestratorClient
from palomino.services.local import free_port, stop_processes

pytestmark = pytest.mark.slow
TOKEN = secrets.token_hex(16)
EXAMPLES = int(os.environ.get("PALOMINO_FUZZ_EXAMPLES", "25"))  # per operation, each sent with and without the token


def serve(folder: Path, name: str, args: list, env: dict[str, str], health: str) -> Iterator[str]:
    """Start `palomino <args>` until /healthz answers; yield its URL; stop it and check its log."""
    port = free_port()
    with open(folder / f"{name}.log", "wb") as log:
        process = subprocess.Popen(
            cli_command(*args, "--port", str(port)), env={**cli_env(), **env}, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + health, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, (folder / f"{name}.log").read_text()
        time.sleep(0.3)
    yield url
    stop_processes([process])
    text = (folder / f"{name}.log").read_text()
    assert "Traceback" not in text, text[-3000:]


@pytest.fixture(scope="module")
def orchestrator_url(tmp_path_factory: pytest.TempPathFactory, servers: Servers) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("fuzz-orchestrator")
    env = {
        **servers.env,  # set before the tests' own environment is (module scope)
        "PALOMINO_ORCHESTRATOR_TOKEN": TOKEN,
        "PALOMINO_NAMESPACE": f"fuzz-{secrets.token_hex(4)}",
        "PALOMINO_DATA_ROOTS": str(folder),
    }
    for url in serve(folder, "orchestrator", ["orchestrator", "--runs", folder / "runs"], env, "/healthz"):
        # One experiment to find: the generated ids then also hit a real one now and then.
        OrchestratorClient(url, token=TOKEN).submit("name: fuzzed\ngrid: {rows: 1, cols: 1}\n")
        yield url


@pytest.fixture(scope="module")
def dashboard_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("fuzz-dashboard")
    trained = palomino("train", write_yaml(folder / "tiny.yaml", tiny()), "--out", folder / "runs", cwd=folder)
    assert trained.returncode == 0, trained.stderr[-2000:]
    yield from serve(
        folder, "dashboard", ["dashboard", "--runs", folder / "runs"], {"PALOMINO_DASHBOARD_TOKEN": TOKEN}, "/healthz"
    )


def fuzz(url: str, schema_path: str, open_paths: set[str], skip: set[str] = frozenset()) -> None:
    # (schemathesis's own pytest plugin does not load under pytest 9: its strategies, with Hypothesis.)
    loaded = schemathesis.openapi.from_url(url + schema_path)
    checked, calls = [], []
    for operation in (result.ok() for result in loaded.get_all_operations()):
        if operation.path in skip:
            continue

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def call(case) -> None:
            for headers in ({"Authorization": f"Bearer {TOKEN}"}, {}):  # with the token, and as a stranger
                response = case.call(base_url=url, headers=headers)
                calls.append(response.status_code)
                assert response.status_code < 500, (
                    f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
                )
                if headers:
                    case.validate_response(response, checks=[response_schema_conformance])
                elif case.path not in open_paths:
                    assert response.status_code == 401, (
                        f"{case.method} {case.formatted_path} answered {response.status_code} without the token"
                    )

        call()
        checked.append(f"{operation.method.upper()} {operation.path}")
    assert len(calls) >= 2 * len(checked) and 401 in calls and 200 in calls, sorted(set(calls))
    print(f"[fuzz] {url}: {len(calls)} requests over {len(checked)} operations; status codes {sorted(set(calls))}")
    return checked


@pytest.mark.integration
def test_the_orchestrator_api_never_errs_and_matches_its_schema(orchestrator_url: str) -> None:
    checked = fuzz(orchestrator_url, "/openapi.json", {"/healthz", "/metrics"})
    assert "POST /experiments" in checked and "GET /experiments/{experiment_id}/metrics" in checked, checked


def test_the_dashboard_api_never_errs_and_matches_its_schema(dashboard_url: str) -> None:
    # /api/events is a stream that never ends: tests/test_dashboard_live.py follows it.
    checked = fuzz(dashboard_url, "/api/openapi.json", {"/healthz"}, skip={"/api/events"})
    assert "GET /api/experiments/{experiment}/metrics" in checked, checked
