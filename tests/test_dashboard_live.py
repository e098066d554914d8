"""The dashboard's live stream (Server-Sent Events) fed by a real RabbitMQ (the session's own), by run
directories being written, and by `palomino train --dashboard` — read off a real uvicorn server with httpx."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
from conftest import cli_command, cli_env, tiny, write_yaml

from palomino.config import parse_config
from palomino.grid import Topology
from palomino.runs.directory import RunDirectory
from palomino.services.dashboard.server import ServerThread, build_app, listen
from palomino.services.dashboard.settings import dashboard_settings
from palomino.transport.broker import EVENTS_EXCHANGE
from palomino.transport.control_channel import ControlChannel


def new_run(runs: Path, name: str = "live") -> RunDirectory:
    run = RunDirectory.create(runs, parse_config(tiny(name=name)))
    run.append_topology(Topology(2, 2, "von_neumann"), {f"{r}-{c}": f"w{r}{c}" for r in range(2) for c in range(2)})
    return run


def record(cell: tuple[int, int], iteration: int, fitness: float) -> dict[str, Any]:
    return {
        "iteration": iteration, "cell": list(cell), "epoch": 0,
        "generator": {"loss": 0.7, "fitness": fitness, "learning_rate": 2e-4},
        "discriminator": {"loss": 1.3, "fitness": -fitness, "learning_rate": 2e-4},
        "losses_used": {"minimax": 2}, "score": 0.5, "mixture": {"0-0": 1.0}, "neighbours": {},
    }  # fmt: skip


def metrics(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["record"] for e in events if e["kind"] == "metrics"]


async def sse(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """(event name, decoded data) of a text/event-stream response."""
    name, data = "message", []
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield name, json.loads("\n".join(data))
            name, data = "message", []


async def collect(stream: AsyncIterator[tuple[str, Any]], until, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Events off the stream (after its `hello`) until `until(events)` holds."""
    events: list[dict[str, Any]] = []

    async def read() -> None:
        async for name, data in stream:
            if name == "events":
                events.extend(data)
                if until(events):
                    return

    await asyncio.wait_for(read(), timeout)
    return events


async def opened(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """The stream's events, once its `hello` has come (the server has subscribed us by then)."""
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    stream = sse(response)
    name, _ = await asyncio.wait_for(anext(stream), 10)
    assert name == "hello"
    return stream


@pytest.fixture
def dashboard(tmp_path: Path, broker_url: str):
    """A real dashboard server over tmp_path/runs, following the real broker."""
    runs = tmp_path / "runs"
    runs.mkdir()
    settings = dashboard_settings(runs=runs, broker=broker_url, dashboard_poll_seconds=0.2)
    with ServerThread(build_app(settings), listen("127.0.0.1", 0)) as server:
        yield server, runs


@pytest.mark.integration
async def test_events_published_to_rabbitmq_reach_the_stream(dashboard, broker_url: str) -> None:
    server, runs = dashboard
    run = new_run(runs)
    experiment = run.experiment
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        async with client.stream("GET", "/api/events", params={"experiment": experiment}) as response:
            stream = await opened(response)
            connection = await aio_pika.connect(broker_url)
            async with connection:
                channel = await connection.channel()
                exchange = await channel.get_exchange(EVENTS_EXCHANGE)
                # Garbage, a body whose key lies about it, and another experiment's event first:
                for body, key in (
                    (b"\x00garbage", f"exp.{experiment}.metrics"),
                    (
                        json.dumps({"experiment": "someone-else", "kind": "state", "state": "running"}).encode(),
                        f"exp.{experiment}.state",
                    ),
                    (
                        json.dumps({"experiment": "other-exp", "kind": "state", "state": "running"}).encode(),
                        "exp.other-exp.state",
                    ),
                ):
                    await exchange.publish(aio_pika.Message(body), routing_key=key)
            # …then what the orchestrator publishes, through the orchestrator's own publisher.
            publisher = await ControlChannel(broker_url, f"cell.dashboard-test-{os.getpid()}").connect()
            try:
                sent = [record((r, c), 0, 0.1 * (2 * r + c)) for r in range(2) for c in range(2)]
                for one in sent:
                    await publisher.event(experiment, "metrics", {"record": one})
                await publisher.event(experiment, "state", {"state": "finished", "best_cell": "0-1"})
                events = await collect(stream, lambda seen: any(e.get("state") == "finished" for e in seen))
            finally:
                await publisher.close()
    assert [e["record"] for e in events if e["kind"] == "metrics"] == sent
    # (The run directory's own feed may also say "running", before or after: it sees the new run being written.)
    assert "finished" in [e["state"] for e in events if e["kind"] == "state"]
    assert all(e["experiment"] == experiment for e in events)  # nothing of someone else's, nothing malformed
    health = httpx.get(f"{server.url}/healthz").json()
    broker = next(f for f in health["feeds"] if "connected" in f)
    assert broker["connected"] and broker["rejected"] >= 2


@pytest.mark.integration
async def test_run_directories_being_written_reach_the_stream(dashboard) -> None:
    server, runs = dashboard
    run = new_run(runs, "written")
    lines = [json.dumps(record((0, 1), i, 0.5 + i)) for i in range(3)]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        async with client.stream("GET", "/api/events", params={"experiment": run.experiment}) as response:
            stream = await opened(response)
            with open(run.metrics_path, "a") as handle:  # two lines and a half, as a writer is caught mid-line
                handle.write(lines[0] + "\n" + lines[1] + "\n" + lines[2][:20])
            first = await collect(stream, lambda seen: len(metrics(seen)) >= 2)
            await asyncio.sleep(0.5)  # a few polls of the torn line: nothing more comes
            with open(run.metrics_path, "a") as handle:
                handle.write(lines[2][20:] + "\n")
            rest = await collect(stream, lambda seen: len(metrics(seen)) >= 1)
            run.keep_metrics(lambda r: r["iteration"] < 1)  # a resume rewrites metrics.jsonl
            reload = await collect(stream, lambda seen: any(e["kind"] == "reload" for e in seen))
    assert [r["iteration"] for r in metrics(first)] == [0, 1]
    assert [r["iteration"] for r in metrics(rest)] == [2]
    assert reload[-1] == {"experiment": run.experiment, "kind": "reload"}
    page = httpx.get(f"{server.url}/api/experiments/{run.experiment}/metrics").json()
    assert [r["iteration"] for r in page["records"]] == [0]


@pytest.mark.integration
async def test_the_list_stream_follows_every_experiment_without_metrics(dashboard, broker_url: str) -> None:
    server, _runs = dashboard
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        async with client.stream("GET", "/api/events") as response:
            stream = await opened(response)
            publisher = await ControlChannel(broker_url, f"cell.dashboard-list-{os.getpid()}").connect()
            try:
                await publisher.event("exp-a-1", "metrics", {"record": record((0, 0), 0, 1.0)})
                await publisher.event("exp-a-1", "state", {"state": "running"})
                events = await collect(stream, lambda seen: any(e["kind"] == "state" for e in seen))
            finally:
                await publisher.close()
    assert [(e["experiment"], e["kind"]) for e in events] == [("exp-a-1", "state")]


@pytest.mark.slow
def test_train_with_dashboard_serves_the_run_live_and_stops_with_it(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    new_run(out, "older")  # another run in the same folder: not this dashboard's business
    config = write_yaml(
        tmp_path / "t.yaml",
        tiny(training={"iterations": 30, "batches_per_iteration": 10, "checkpoint_every": 10, "sample_every": 10}),
    )
    log = tmp_path / "train.err"
    with open(log, "w") as err:
        train = subprocess.Popen(
            cli_command("train", config, "--out", out, "--dashboard", "0"),
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"dashboard: (http://127\.0\.0\.1:\d+)/#/exp/(\S+)", log.read_text())):
            assert train.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        url, experiment = found[1], found[2]
        listed = httpx.get(f"{url}/api/experiments", timeout=10).json()["experiments"]
        assert [s["id"] for s in listed] == [experiment]
        assert listed[0]["state"] == "running"

        async def first_records() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                async with client.stream("GET", "/api/events", params={"experiment": experiment}) as response:
                    stream = await opened(response)
                    return await collect(
                        stream, lambda seen: sum(e["kind"] == "metrics" for e in seen) >= 4, timeout=90
                    )

        events = asyncio.run(first_records())
        assert {tuple(e["record"]["cell"]) for e in events if e["kind"] == "metrics"} <= {
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
        }
        stdout, _ = train.communicate(timeout=300)
    finally:
        if train.poll() is None:
            train.send_signal(signal.SIGKILL)
            train.wait()
    assert train.returncode == 0, log.read_text()[-3000:]
    assert stdout.strip().endswith(experiment)
    with pytest.raises(httpx.ConnectError):  # the page goes when training ends
        httpx.get(f"{url}/healthz", timeout=5)
