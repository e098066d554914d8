"""The orchestrator's API as an attacker meets it (issue 13): the real app, its lifespan on a real
RabbitMQ and Redis (the session's own), a namespace of its own."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path

import pytest
import yaml
from conftest import palomino, tiny, wait_until
from fastapi.testclient import TestClient
from servers import Servers

from palomino.services.common.service_settings import ServiceSettings
from palomino.services.orchestrator.api import MAX_CONFIG_BYTES, create_app

TOKEN = secrets.token_hex(16)


@pytest.fixture
def orchestrator(tmp_path: Path, servers: Servers):  # its lifespan connects to them (URLs from the environment)
    roots = tmp_path / "datasets"
    (roots / "mine").mkdir(parents=True)
    settings = ServiceSettings(namespace=f"sec-{secrets.token_hex(4)}", orchestrator_token=TOKEN, data_roots=str(roots))
    with TestClient(create_app(settings, tmp_path / "runs")) as client:
        yield client


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def body(**changes) -> bytes:
    return yaml.safe_dump(tiny(**changes)).encode()


@pytest.mark.integration
def test_the_api_needs_the_token_except_health_and_metrics(orchestrator: TestClient) -> None:
    for method, path in (("POST", "/experiments"), ("GET", "/experiments"), ("GET", "/experiments/x"), ("DELETE", "/experiments/x"),
                         ("GET", "/experiments/x/metrics"), ("GET", "/experiments/x/samples/real.png")):  # fmt: skip
        for headers in ({}, auth("wrong-" + TOKEN), {"Authorization": TOKEN}):
            reply = orchestrator.request(method, path, headers=headers, content=body() if method == "POST" else None)
            assert reply.status_code == 401, (method, path, headers, reply.text)
            assert (
                reply.headers["www-authenticate"] == "Bearer"
                and "PALOMINO_ORCHESTRATOR_TOKEN" in reply.json()["detail"]
            )
    assert orchestrator.get("/healthz").status_code == 200 and orchestrator.get("/metrics").status_code == 200
    created = orchestrator.post("/experiments", content=body(), headers=auth())
    assert created.status_code == 201, created.text
    assert orchestrator.get(f"/experiments/{created.json()['id']}", headers=auth()).json()["state"] == "waiting"


@pytest.mark.integration
def test_data_outside_the_roots_is_refused_alike_whether_it_exists_or_not(
    orchestrator: TestClient, tmp_path: Path
) -> None:
    (tmp_path / "secret-photos").mkdir()
    replies = []
    for folder in (
        tmp_path / "secret-photos",
        tmp_path / "no-such-folder",
        tmp_path / "datasets" / "mine" / ".." / ".." / "secret-photos",
        Path("/etc"),
    ):
        reply = orchestrator.post(
            "/experiments", content=body(data={"name": "image_folder", "dir": str(folder)}), headers=auth()
        )
        assert (
            reply.status_code == 422
            and "data.dir" in reply.json()["detail"]
            and "PALOMINO_DATA_ROOTS" in reply.json()["detail"]
        )
        replies.append(reply.json()["detail"].replace(str(folder), "PATH"))
    assert len(set(replies)) == 1, replies  # nothing tells which folders exist
    inside = orchestrator.post(
        "/experiments",
        content=body(data={"name": "image_folder", "dir": str(tmp_path / "datasets" / "mine")}),
        headers=auth(),
    )
    assert inside.status_code == 201, inside.text


@pytest.mark.integration
def test_oversized_and_alias_bomb_bodies_are_refused_and_health_still_answers(orchestrator: TestClient) -> None:
    big = b"name: x\n" + b"#" * (MAX_CONFIG_BYTES + 1)
    started = time.monotonic()
    assert orchestrator.post("/experiments", content=big, headers=auth()).status_code == 413
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(12)
    )
    reply = orchestrator.post("/experiments", content=bomb.encode(), headers=auth())
    assert reply.status_code == 422 and "aliases" in reply.json()["detail"]
    assert orchestrator.get("/healthz").status_code == 200
    assert time.monotonic() - started < 60  # generous: the point is that it returns at all


@pytest.mark.integration
def test_a_stalled_consumer_fails_healthz(orchestrator: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import palomino.services.orchestrator.api as api

    monkeypatch.setattr(api, "STALLED_AFTER", 0.05)
    app_orchestrator = orchestrator.app.state.orchestrator
    with app_orchestrator.control.in_flight:  # a control message whose handler has not returned
        # Stalled once it has been in flight longer than STALLED_AFTER: wait for that, however long it takes.
        wait_until(lambda: orchestrator.get("/healthz").status_code == 503, timeout=10)
        reply = orchestrator.get("/healthz")
        assert reply.status_code == 503 and "stalled" in reply.json()["status"]
    assert orchestrator.get("/healthz").status_code == 200


def test_the_orchestrator_refuses_a_network_address_without_a_token(tmp_path: Path) -> None:
    done = palomino(
        "orchestrator", "--host", "0.0.0.0", "--port", "0", "--runs", str(tmp_path), cwd=tmp_path, timeout=60
    )
    assert done.returncode == 2 and "PALOMINO_ORCHESTRATOR_TOKEN" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("token", ["change-me-orchestrator-token", "short"])
def test_placeholder_and_short_tokens_are_refused(tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PALOMINO_ORCHESTRATOR_TOKEN", token)
    done = palomino("status", "some-experiment", cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "PALOMINO_ORCHESTRATOR_TOKEN" in done.stderr and token not in done.stderr


@pytest.mark.integration
def test_submissions_are_capped_per_client_and_ended_experiments_leave_after_their_retention(tmp_path: Path) -> None:
    # 1,000 submissions in 7.5 s were all kept, forever.
    settings = ServiceSettings(
        namespace=f"sec-{secrets.token_hex(4)}", orchestrator_token=TOKEN, max_active_per_client=2, retention_seconds=0
    )
    with TestClient(create_app(settings, tmp_path / "runs")) as client:
        first, second = (client.post("/experiments", content=body(), headers=auth()).json()["id"] for _ in range(2))
        refused = client.post("/experiments", content=body(), headers=auth())
        assert refused.status_code == 429 and "PALOMINO_MAX_ACTIVE_PER_CLIENT" in refused.json()["detail"]
        assert client.delete(f"/experiments/{first}", headers=auth()).json()["state"] == "stopped"
        deadline = time.monotonic() + 10
        while (
            client.get(f"/experiments/{first}", headers=auth()).status_code != 404
        ):  # retention 0: gone at the next tick
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert (tmp_path / "runs" / first / "config.yaml").is_file()  # its run directory stays
        assert client.post("/experiments", content=body(), headers=auth()).status_code == 201
        assert client.get(f"/experiments/{second}", headers=auth()).json()["state"] == "waiting"


@pytest.mark.integration
def test_metrics_exposes_the_orchestrators_counters_as_counters(orchestrator: TestClient) -> None:
    text = orchestrator.get("/metrics").text
    assert "# TYPE palomino_orchestrator_total counter" in text
    assert 'palomino_orchestrator_total{name="untrusted_messages"} 0.0' in text


@pytest.mark.integration
def test_delete_stops_an_experiment_from_the_command_line(tmp_path: Path) -> None:
    import subprocess

    from conftest import cli_command, cli_env

    from palomino.services.common.client import OrchestratorClient
    from palomino.services.local import free_port, stop_processes

    port = free_port()
    env = {**cli_env(), "PALOMINO_ORCHESTRATOR_TOKEN": TOKEN, "PALOMINO_NAMESPACE": f"sec-{port}"}
    process = subprocess.Popen(cli_command("orchestrator", "--runs", tmp_path / "runs", "--port", str(port)), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        client = OrchestratorClient(f"http://127.0.0.1:{port}", token=TOKEN)
        deadline = time.monotonic() + 60
        while not client.healthy():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
        experiment = client.submit(yaml.safe_dump(tiny()))["id"]
        done = subprocess.run(cli_command("delete", experiment, "--orchestrator", f"http://127.0.0.1:{port}"), env=env,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0 and '"state": "stopped"' in done.stdout, done.stderr
        refused = subprocess.run(cli_command("delete", experiment, "--orchestrator", f"http://127.0.0.1:{port}"),
                                 env={k: v for k, v in env.items() if k != "PALOMINO_ORCHESTRATOR_TOKEN"}, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert refused.returncode == 1 and "401" in refused.stderr and "PALOMINO_ORCHESTRATOR_TOKEN" in refused.stderr
    finally:
        stop_processes([process])


@pytest.mark.slow
@pytest.mark.integration
def test_up_with_a_token_keeps_strangers_out_and_finishes_under_nested_json_on_every_exchange(tmp_path: Path) -> None:
    # Issue 13's end-to-end: the whole stack as `palomino up` starts it, attacked while it trains.
    import asyncio
    import json
    import subprocess

    import httpx
    from conftest import cli_command, cli_env, exchange_exists, raw_publish, wait_until_async, write_yaml

    from palomino.grid import Coord
    from palomino.services.local import free_port, stop_processes
    from palomino.transport.broker import EVENTS_EXCHANGE
    from palomino.transport.control_channel import CONTROL_EXCHANGE, cell_address, orchestrator_address
    from palomino.transport.rabbitmq import routing_key
    from palomino.transport.score_queue import score_queue_name
    from palomino.transport.signing import MessageKey

    port, namespace = free_port(), f"sec-up-{secrets.token_hex(3)}"
    config = tiny(name="attacked", training={"iterations": 25, "batches_per_iteration": 20})
    # A message key known here: the nested bodies below are sent both signed (they reach the
    # decoders, which must bound their depth) and unsigned (refused before any decoding).
    message_key = secrets.token_hex(16)
    env = {
        **cli_env(),
        "PALOMINO_ORCHESTRATOR_TOKEN": TOKEN,
        "PALOMINO_NAMESPACE": namespace,
        "PALOMINO_MESSAGE_KEY": message_key,
    }
    up = subprocess.Popen(cli_command("up", write_yaml(tmp_path / "ring.yaml", config), "--cells", "4", "--port", str(port), "--out", tmp_path / "runs"),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        api = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:  # the experiment `up` submitted
            assert up.poll() is None and time.monotonic() < deadline, (
                up.stderr.read() if up.poll() is not None else "no experiment"
            )
            try:
                listed = httpx.get(f"{api}/experiments", headers=auth(), timeout=2).json()
                if listed and listed[0]["state"] == "running":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        experiment = listed[0]["id"]
        assert httpx.post(f"{api}/experiments", content=body(), timeout=10).status_code == 401
        outside = httpx.post(
            f"{api}/experiments", content=body(data={"name": "image_folder", "dir": "/etc"}), headers=auth(), timeout=10
        )
        assert outside.status_code == 422 and "PALOMINO_DATA_ROOTS" in outside.text

        nested = nested_json_body()
        targets = [
            (CONTROL_EXCHANGE, orchestrator_address(namespace)),
            *((CONTROL_EXCHANGE, cell_address(f"up{port}-{i}")) for i in range(4)),
            *(("palomino.snapshots", routing_key(experiment, Coord(r, c))) for r in range(2) for c in range(2)),
            (EVENTS_EXCHANGE, f"exp.{experiment}.metrics"),
            ("", score_queue_name(namespace)),
        ]
        for exchange in {e for e, _ in targets if e}:  # the cells declare theirs as they start
            asyncio.run(wait_until_async(lambda name=exchange: exchange_exists(name), timeout=120))
        for exchange, key in targets:  # events are bare JSON; everything else is framed
            one = nested[8:] if exchange == EVENTS_EXCHANGE else nested
            asyncio.run(raw_publish([one] * 10, key, exchange=exchange))
            asyncio.run(signed_publish(one, 10, key, exchange, MessageKey(message_key)))

        out, err = up.communicate(timeout=400)
        assert up.returncode == 0, err[-3000:]
        run_dir = Path(out.strip().splitlines()[-1])
        assert (run_dir / "result" / "mixture.safetensors").is_file()
        assert json.loads((run_dir / "orchestrator.json").read_text())["state"] == "finished"
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "runs" / ".up-logs").rglob("*.log"))
        assert "nested deeper than 64" in logs and "unsigned message" in logs and "Traceback" not in logs
    finally:
        stop_processes([up])


async def signed_publish(body: bytes, times: int, key: str, exchange: str, signer) -> None:
    """`body` signed with the stack's message key, as an insider (or a bug) would send it."""
    import aio_pika

    connection = await aio_pika.connect(os.environ["PALOMINO_BROKER_URL"])
    async with connection:
        channel = await connection.channel()
        target = channel.default_exchange if exchange == "" else await channel.get_exchange(exchange)
        for _ in range(times):
            await target.publish(aio_pika.Message(body, headers=signer.sign(key, body)), routing_key=key)


def nested_json_body(levels: int = 5000) -> bytes:
    from palomino.wire.frame import LENGTH

    head = b'{"kind": "metrics", "x": ' + b"[" * levels + b"]" * levels + b"}"
    return LENGTH.pack(len(head)) + head


@pytest.mark.integration
def test_data_too_big_for_a_cell_is_refused_at_submit_naming_the_estimate(
    orchestrator: TestClient, tmp_path: Path
) -> None:
    # A 404 kB image folder with image_size 1024 took 5.4 GB in a cell.
    from PIL import Image

    folder = tmp_path / "datasets" / "mine"
    for i in range(400):
        Image.new("L", (8, 8), color=i % 256).save(folder / f"{i}.png")
    big = orchestrator.post(
        "/experiments",
        content=body(data={"name": "image_folder", "dir": str(folder), "image_size": 1024, "channels": 3}),
        headers=auth(),
    )
    assert big.status_code == 422, big.text
    detail = big.json()["detail"]
    assert "400 images of 3×1024×1024" in detail and "PALOMINO_MAX_DATA_BYTES" in detail and "data.image_size" in detail
    small = orchestrator.post(
        "/experiments",
        content=body(data={"name": "image_folder", "dir": str(folder), "image_size": 32}),
        headers=auth(),
    )
    assert small.status_code == 201, small.text
    assert (
        orchestrator.post("/experiments", content=body(data={"name": "cifar10"}), headers=auth()).status_code == 201
    )  # 1.1 GiB: fits


async def test_an_experiments_heartbeat_ttl_ends_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker that once ran an experiment with heartbeat_ttl 0.001 stayed invisible to every later one.
    from palomino.services.cell.block import Block
    from palomino.services.cell.worker import IDLE_TTL, CellWorker
    from palomino.services.common.service_settings import ServiceSettings
    from palomino.wire.control_messages import Assign

    worker = CellWorker(ServiceSettings(), "w-ttl")
    seen: list[float] = []

    async def run(block: Block) -> None:
        block.links.set_ttl("w-ttl", 1.0)  # what a block sets first: its experiment's TTL
        seen.append(worker._ttl["w-ttl"])

    async def report(*args: object, **kwargs: object) -> None:
        raise AssertionError("the block did not fail")

    monkeypatch.setattr(Block, "run", run)
    monkeypatch.setattr(worker, "_report_failure", report)
    assign = Assign(experiment="e", worker="w-ttl", config={}, coord=(0, 0), rows=1, cols=1, epoch=0)
    worker._assigned["w-ttl"] = (assign, b"")
    worker._start_blocks()
    await asyncio.gather(*worker._blocks)
    await asyncio.sleep(0)  # the finished block's callback
    assert seen == [1.0] and worker._ttl["w-ttl"] == IDLE_TTL and worker.busy("w-ttl") is None
