"""The dashboard's JSON API over a real run directory (written by the real `palomino train`), with httpx.

No broker here: history from run directories, the read-only rules, the token, CORS, validation
(404 never 500), the event parser, the hub, and the page's vendored libraries.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import REPO, cli_env, last_line, palomino, tiny, write_yaml

from palomino.errors import ConfigError
from palomino.services.common.runfiles import JsonlIndex, RunFiles, RunsFolder
from palomino.services.dashboard.app import create_app
from palomino.services.dashboard.events import EventHub, MalformedEvent, one_a_record, parse_event
from palomino.services.dashboard.history import CombinedHistory, OrchestratorHistory, RunsHistory
from palomino.services.dashboard.settings import dashboard_settings

PNG = b"\x89PNG\r\n\x1a\n"
CELLS = {"0-0", "0-1", "1-0", "1-1"}
ITERATIONS = 3


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 2×2 run: metrics, topology, samples of every cell, result/ (seconds)."""
    folder = tmp_path_factory.mktemp("dash")
    config = write_yaml(folder / "tiny.yaml", tiny(training={"iterations": ITERATIONS}))
    done = palomino("train", config, "--out", folder / "runs", cwd=folder)
    assert done.returncode == 0, done.stderr
    return Path(last_line(done.stdout))


def client_for(runs: Path, *, token: str | None = None, origins: tuple[str, ...] = ()) -> httpx.AsyncClient:
    app = create_app(CombinedHistory([RunsHistory(RunsFolder(runs))]), EventHub(), token=token, origins=origins)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dashboard")


async def test_experiments_summary_metrics_and_topology(finished_run: Path) -> None:
    experiment = finished_run.name
    async with client_for(finished_run.parent) as client:
        listed = (await client.get("/api/experiments")).json()
        assert [s["id"] for s in listed["experiments"]] == [experiment]
        summary = (await client.get(f"/api/experiments/{experiment}")).json()
        assert summary["state"] == "finished"
        assert (summary["rows"], summary["cols"], summary["iterations"]) == (2, 2, ITERATIONS)
        assert summary["records"] == len(CELLS) * ITERATIONS
        assert set(summary["cells"]) == CELLS

        everything = (await client.get(f"/api/experiments/{experiment}/metrics")).json()
        assert everything["next"] == everything["total"] == len(CELLS) * ITERATIONS
        assert {("-".join(map(str, r["cell"])), r["iteration"]) for r in everything["records"]} == {
            (c, i) for c in CELLS for i in range(ITERATIONS)
        }
        # Paging: since/limit walk the same records in the same order.
        paged, since = [], 0
        while True:
            page = (
                await client.get(f"/api/experiments/{experiment}/metrics", params={"since": since, "limit": 5})
            ).json()
            paged += page["records"]
            if page["next"] >= page["total"]:
                break
            since = page["next"]
        assert paged == everything["records"]

        layouts = (await client.get(f"/api/experiments/{experiment}/topology")).json()["layouts"]
        assert [(line["epoch"], line["rows"], line["cols"]) for line in layouts] == [(0, 2, 2)]


async def test_samples_real_and_result(finished_run: Path) -> None:
    experiment = finished_run.name
    async with client_for(finished_run.parent) as client:
        samples = (await client.get(f"/api/experiments/{experiment}/cells/1-0/samples")).json()
        assert samples["iterations"] == list(range(1, ITERATIONS + 1))  # sample_every: 1
        picture = await client.get(f"/api/experiments/{experiment}/cells/1-0/samples/{ITERATIONS}.png")
        assert picture.status_code == 200 and picture.headers["content-type"] == "image/png"
        assert picture.content == (finished_run / "samples" / "1-0" / f"iter-{ITERATIONS}.png").read_bytes()

        real = await client.get(f"/api/experiments/{experiment}/samples/real.png")
        if (finished_run / "samples" / "real.png").exists():
            assert real.status_code == 200 and real.content.startswith(PNG)
        else:
            assert real.status_code == 404 and "real" in real.json()["detail"]

        result = (await client.get(f"/api/experiments/{experiment}/result")).json()
        ranking = json.loads((finished_run / "result" / "ranking.json").read_text())
        assert result["ranking"] == ranking and result["samples"] is True
        assert {r["cell"] for r in result["ranking"]["ranking"]} == CELLS
        best = await client.get(f"/api/experiments/{experiment}/result/samples.png")
        assert best.status_code == 200 and best.content.startswith(PNG)


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/experiments/no-such-run", 404, "no experiment"),
        ("/api/experiments/no-such-run/metrics", 404, "no experiment"),
        ("/api/experiments/no-such-run/topology", 404, "no experiment"),
        ("/api/experiments/no-such-run/result", 404, "no experiment"),
        ("/api/experiments/no-such-run/result/samples.png", 404, "no experiment"),
        ("/api/experiments/%2E%2E/metrics", 404, ""),
        ("/api/experiments/..%2F..%2Fetc/topology", 404, ""),
        ("/api/experiments/-bad-id", 404, "no experiment"),
        ("/api/experiments/{run}/cells/7-7/samples", 404, "no cell 7-7"),
        ("/api/experiments/{run}/cells/0-0/samples/999.png", 404, "no samples of cell 0-0 at iteration 999"),
        ("/api/experiments/{run}/cells/zero/samples", 422, "use ROW-COL"),
        ("/api/experiments/{run}/cells/0-0/samples/x.png", 422, ""),
        ("/api/experiments/{run}/metrics?since=-1", 422, ""),
        ("/api/experiments/{run}/metrics?limit=0", 422, ""),
        ("/api/events?experiment=no-such-run", 404, "no experiment"),
    ],
)
async def test_bad_requests_are_4xx_naming_the_problem(finished_run: Path, path: str, status: int, says: str) -> None:
    async with client_for(finished_run.parent) as client:
        response = await client.get(path.replace("{run}", finished_run.name))
    assert response.status_code == status, response.text
    assert says in json.dumps(response.json())


async def test_read_only(finished_run: Path) -> None:
    async with client_for(finished_run.parent) as client:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            response = await client.request(method, f"/api/experiments/{finished_run.name}")
            assert response.status_code == 405, method
    assert (finished_run / "result" / "ranking.json").exists()


async def test_token_guards_the_api_but_not_the_page(finished_run: Path) -> None:
    url = f"/api/experiments/{finished_run.name}"
    async with client_for(finished_run.parent, token="s3cret-token") as client:
        assert (await client.get(url)).status_code == 401
        assert (await client.get(url, headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await client.get(url, headers={"Authorization": "Bearer s3cret-token"})).status_code == 200
        # EventSource and <img> cannot send headers: the page passes ?access_token=.
        picture = await client.get(f"{url}/result/samples.png", params={"access_token": "s3cret-token"})
        assert picture.status_code == 200
        assert (await client.get("/")).status_code == 200  # the page itself holds no data
        assert (await client.get("/healthz")).status_code == 200  # probes


async def test_no_cors_unless_origins_are_named(finished_run: Path) -> None:
    url = f"/api/experiments/{finished_run.name}"
    async with client_for(finished_run.parent) as client:
        response = await client.get(url, headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in response.headers
    async with client_for(finished_run.parent, origins=("https://lab.example.org",)) as client:
        allowed = await client.get(url, headers={"Origin": "https://lab.example.org"})
        assert allowed.headers["access-control-allow-origin"] == "https://lab.example.org"
        other = await client.get(url, headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
    with pytest.raises(ConfigError, match=r"PALOMINO_DASHBOARD_ORIGINS.*'\*' is not allowed"):
        dashboard_settings(dashboard_origins=["*"])


def test_settings_name_the_bad_value() -> None:
    with pytest.raises(ConfigError, match=r"--broker.*amqp"):
        dashboard_settings(broker="http://127.0.0.1:5672")
    with pytest.raises(ConfigError, match=r"--orchestrator.*http"):
        dashboard_settings(orchestrator="127.0.0.1:8000")
    assert dashboard_settings().dashboard_runs == Path("runs")  # nothing given: ./runs, like `palomino train`
    assert dashboard_settings(orchestrator="http://h:8000/").dashboard_runs is None


async def test_page_and_vendored_library(finished_run: Path) -> None:
    async with client_for(finished_run.parent) as client:
        page = await client.get("/")
        assert page.status_code == 200 and "static/app.js" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for asset in (
            "static/app.js",
            "static/style.css",
            "static/vendor/uPlot.iife.min.js",
            "static/vendor/uPlot.min.css",
        ):
            assert f'"{asset}"' in page.text, asset
            assert (await client.get("/" + asset)).status_code == 200, asset
        assert "://" not in page.text, "the page must load nothing from elsewhere (no CDN)"
    # The vendored file is the version pinned in the lock file.
    lock = json.loads((REPO / "frontend" / "package-lock.json").read_text())
    pinned = lock["packages"]["node_modules/uplot"]["version"]
    vendored = (REPO / "services/dashboard/static/vendor/uPlot.iife.min.js").read_text()
    assert vendored.startswith(f"/*! https://github.com/leeoniya/uPlot (v{pinned}) */")
    built = REPO / "frontend" / "node_modules" / "uplot" / "dist" / "uPlot.iife.min.js"
    if built.exists():  # after `npm ci && npm run build`: the committed copy is the built one
        assert built.read_text() == vendored


async def test_orchestrator_down_is_a_503_naming_it_and_runs_still_answer(finished_run: Path) -> None:
    history = CombinedHistory(
        [OrchestratorHistory("http://127.0.0.1:9", timeout=2), RunsHistory(RunsFolder(finished_run.parent))]
    )
    app = create_app(history, EventHub())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dashboard") as client:
        listed = (await client.get("/api/experiments")).json()
        assert [s["id"] for s in listed["experiments"]] == [finished_run.name]
        assert "cannot reach the orchestrator at http://127.0.0.1:9" in listed["unavailable"]["orchestrator"]
        assert (await client.get(f"/api/experiments/{finished_run.name}")).json()["source"] == "runs"
        missing = await client.get("/api/experiments/elsewhere")
        assert missing.status_code == 503 and "orchestrator" in missing.json()["detail"]


def orchestrator_app_holding(run: Path):
    """The orchestrator's real HTTP app holding `run` as one of its experiments (not started: no broker needed)."""
    from palomino.config import load_config
    from palomino.runs.directory import RunDirectory
    from palomino.services.common.service_settings import ServiceSettings
    from palomino.services.orchestrator.api import create_app as orchestrator_app
    from palomino.services.orchestrator.experiment import Experiment

    app = orchestrator_app(ServiceSettings(), run.parent)
    app.state.orchestrator.experiments[run.name] = Experiment(
        run.name, load_config(run / "config.yaml"), RunDirectory(run), state="finished"
    )
    return app


async def test_the_orchestrator_serves_its_run_directories_read_only(finished_run: Path) -> None:
    experiment = finished_run.name
    transport = httpx.ASGITransport(app=orchestrator_app_holding(finished_run))
    async with httpx.AsyncClient(transport=transport, base_url="http://orchestrator") as client:
        layouts = (await client.get(f"/experiments/{experiment}/topology")).json()["layouts"]
        assert [(line["rows"], line["cols"]) for line in layouts] == [(2, 2)]
        assert (await client.get(f"/experiments/{experiment}/cells/0-1/samples")).json()["iterations"] == [1, 2, 3]
        picture = await client.get(f"/experiments/{experiment}/cells/0-1/samples/2.png")
        assert picture.content == (finished_run / "samples" / "0-1" / "iter-2.png").read_bytes()
        assert (await client.get(f"/experiments/{experiment}/result")).json()["ranking"]["ranking"]
        assert (await client.get(f"/experiments/{experiment}/result/samples.png")).content.startswith(PNG)
        for path, status in (
            ("/experiments/elsewhere/topology", 404),
            ("/experiments/elsewhere/result", 404),
            (f"/experiments/{experiment}/cells/2-0/samples", 404),
            (f"/experiments/{experiment}/cells/0-1/samples/99.png", 404),
            (f"/experiments/{experiment}/cells/a-b/samples", 422),
        ):
            assert (await client.get(path)).status_code == status, path

    # A dashboard on another machine reads the same through the orchestrator alone.
    history = CombinedHistory([OrchestratorHistory("http://orchestrator", transport=transport)])
    app = create_app(history, EventHub())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dashboard") as client:
        summary = (await client.get(f"/api/experiments/{experiment}")).json()
        assert summary["source"] == "orchestrator" and summary["state"] == "finished"
        assert (
            len((await client.get(f"/api/experiments/{experiment}/metrics")).json()["records"])
            == len(CELLS) * ITERATIONS
        )
        picture = await client.get(f"/api/experiments/{experiment}/cells/1-1/samples/1.png")
        assert picture.content == (finished_run / "samples" / "1-1" / "iter-1.png").read_bytes()
        assert (await client.get(f"/api/experiments/{experiment}/cells/5-5/samples")).status_code == 404
        assert (await client.get("/api/experiments/elsewhere")).status_code == 404


# ---- the pieces ------------------------------------------------------------------------------


def test_jsonl_index_reads_complete_lines_only_and_notices_a_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    index = JsonlIndex(path)
    assert not index.refresh() and index.count == 0  # no file yet
    path.write_bytes(b'{"cell": [0, 0], "iteration": 0}\n\n{"cell": [0, 0], "iteration": 1}\n{"cell": [0, 0], "iter')
    assert not index.refresh()
    assert index.count == 2  # the blank line is skipped, the torn one waits
    with open(path, "ab") as handle:
        handle.write(b'ation": 2}\nnot json\n')
    index.refresh()
    records, following = index.read(1, 10)
    assert [r["iteration"] for r in records] == [1, 2] and following == 4  # the malformed line is skipped
    assert index.read(4, 10) == ([], 4) and index.read(99, 10) == ([], 4)
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(b'{"cell": [0, 0], "iteration": 0}\n')
    os.replace(replacement, path)  # what keep_metrics() does on a resume
    assert index.refresh() and index.count == 1


def test_run_state_from_the_files(tmp_path: Path, finished_run: Path) -> None:
    assert RunFiles(finished_run).state() == "finished"
    run = tmp_path / "x-1"
    run.mkdir()
    (run / "config.yaml").write_text("name: x\ngrid: {rows: 1, cols: 2}\ntraining: {iterations: 4}\n")
    files = RunFiles(run)
    assert files.state() == "running"
    assert files.state(now=os.stat(run / "config.yaml").st_mtime + 3600) == "stopped"
    summary = files.summary()
    assert (summary["rows"], summary["cols"], summary["records"], summary["source"]) == (1, 2, 0, "runs")
    assert files.has_cell("0-1") and not files.has_cell("1-0") and not files.has_cell("../0")


@pytest.mark.parametrize(
    ("body", "key", "why"),
    [
        (b"\x00\xff garbage", None, "not JSON"),
        (b"[1, 2]", None, "not an object"),
        (b'{"experiment": "../etc", "kind": "state"}', None, "experiment"),
        (b'{"experiment": "e1", "kind": "metrics"}', None, "without its record"),
        (b'{"experiment": "e1", "kind": "metrics", "record": {"cell": [0], "iteration": 1}}', None, "cell"),
        (b'{"experiment": "e1", "kind": "metrics", "record": {"cell": [0, 0], "iteration": -1}}', None, "iteration"),
        (b'{"experiment": "e1", "kind": "metrics", "records": []}', None, "without its record"),
        (b'{"experiment": "e1", "kind": "metrics", "records": [{"cell": [0, 0], "iteration": 1}, 7]}', None, "records"),
        (
            b'{"experiment": "e1", "kind": "metrics", "records": [{"cell": [0, 0], "iteration": 1}, {"cell": [0, 0]}]}',
            None,
            "iteration",
        ),
        (b'{"experiment": "e1", "kind": "state", "state": "running"}', "exp.e2.state", "routing key"),
        (b"{" + b" " * (1 << 20) + b"}", None, "limit"),
    ],
)
def test_malformed_events_are_refused_with_a_reason(body: bytes, key: str | None, why: str) -> None:
    with pytest.raises(MalformedEvent, match=why):
        parse_event(body, key)


def test_events_parse_nan_as_null() -> None:
    event = parse_event(
        b'{"experiment": "e1", "kind": "metrics", "record": {"cell": [1, 0], "iteration": 4, "score": NaN}}',
        "exp.e1.metrics",
    )
    assert event["record"]["score"] is None


def test_a_metrics_event_of_several_records_reaches_the_browser_as_one_event_a_record() -> None:
    body = b'{"experiment": "e1", "kind": "metrics", "records": [{"cell": [0, 0], "iteration": 3}, {"cell": [0, 1], "iteration": 3}]}'
    events = one_a_record(parse_event(body, "exp.e1.metrics"))
    assert events == [
        {"experiment": "e1", "kind": "metrics", "record": {"cell": [0, 0], "iteration": 3}},
        {"experiment": "e1", "kind": "metrics", "record": {"cell": [0, 1], "iteration": 3}},
    ]
    state = {"experiment": "e1", "kind": "state", "state": "running"}
    assert one_a_record(state) == [state]


async def test_a_stream_that_falls_behind_is_told_to_resync() -> None:
    hub = EventHub(buffer=3, linger=0)
    with hub.subscribe("e1") as slow, hub.subscribe(None) as listing:
        for i in range(5):
            hub.publish({"experiment": "e1", "kind": "metrics", "record": {"cell": [0, 0], "iteration": i}})
        hub.publish({"experiment": "e2", "kind": "state", "state": "finished"})
        batch = await anext(hub.batches(slow))
        # 0, 1, 2 filled it; 3 overflowed: those four are dropped for one `resync`, then 4 arrives.
        assert batch[0]["kind"] == "resync" and slow.lost == 4
        assert [e["record"]["iteration"] for e in batch[1:]] == [4]
        assert [e["experiment"] for e in await anext(hub.batches(listing))] == ["e2"]  # the list gets no metrics
    assert hub.subscribers == 0


def test_the_dashboard_imports_no_torch() -> None:
    code = "import sys, palomino.services.dashboard, palomino.services.orchestrator.api; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO, check=False
    )
    assert done.stdout.strip() == "False", done.stderr


def test_cli_refuses_bad_flags_with_exit_2(tmp_path: Path) -> None:
    missing = palomino("dashboard", "--runs", tmp_path / "nowhere", "--port", "0", cwd=tmp_path, timeout=60)
    assert missing.returncode == 2 and "--runs" in missing.stderr and "no such folder" in missing.stderr
    bad = palomino("dashboard", "--broker", "http://127.0.0.1:5672", "--port", "0", cwd=tmp_path, timeout=60)
    assert bad.returncode == 2 and "--broker" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = palomino("dashboard", "--runs", tmp_path, "--port", port, cwd=tmp_path, timeout=60)
        assert busy.returncode == 2 and f"--port {port}: cannot listen" in busy.stderr
        config = write_yaml(tmp_path / "t.yaml", tiny())
        train = palomino("train", config, "--out", tmp_path / "runs", "--dashboard", port, cwd=tmp_path, timeout=120)
        assert train.returncode == 2 and f"--dashboard {port}: cannot listen" in train.stderr
        assert not (tmp_path / "runs").exists()  # refused before any run directory is written
