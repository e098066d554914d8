"""The real stack under a real container engine: the project's docker-compose.yml, unchanged, with
its environment in an env file as a user's .env, built and started by podman (tests/engine_stack.py)."""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from engine_stack import Engine, get_json, missing_or_skip, run, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ITERATIONS = 8


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    missing_or_skip()
    run(["bash", "deploy/local-images.sh"], timeout=900)
    # Without a reachable PyTorch index, torch comes from pip's own configuration (e.g. PIP_FIND_LINKS).
    run(["bash", "deploy/wheelhouse.sh"], timeout=900, env=None)
    engine = Engine(tmp_path_factory.mktemp("engine"))
    engine.start()
    yield engine
    engine.stop()


def env_file(folder: Path, **settings: str) -> Path:
    token = secrets.token_hex(16)
    values = {
        "RABBITMQ_USER": "palomino",
        "RABBITMQ_PASSWORD": secrets.token_hex(12),
        "REDIS_PASSWORD": secrets.token_hex(12),
        "PALOMINO_ORCHESTRATOR_TOKEN": token,
        "PALOMINO_MESSAGE_KEY": secrets.token_hex(16),
        "PALOMINO_CLASSIFIER": "",
        # Another loopback address than the host's own services: the published ports cannot clash.
        "PALOMINO_PUBLISH_ADDRESS": "127.0.0.2",
        **settings,
    }
    path = folder / ".env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


@pytest.mark.timeout(1800)
def test_compose_up_trains_replaces_a_killed_cell_and_comes_down_clean(engine: Engine, tmp_path: Path) -> None:
    project = f"palomino-e2e-{uuid.uuid4().hex[:6]}"
    env = env_file(
        tmp_path,
        PALOMINO_EXPERIMENT="examples/ring-3x3.yaml",
        PALOMINO_SET=" ".join(
            [
                "name=compose-engine",
                f"training.iterations={ITERATIONS}",
                "training.batches_per_iteration=15",
                "training.checkpoint_every=1",
                "training.fitness.sample_size=200",
            ]
        ),
        PALOMINO_CELLS="4",  # 3 workers of 3 cells + 1 spare
        PALOMINO_CELLS_PER_WORKER="3",
    )
    token = dict(line.split("=", 1) for line in env.read_text().splitlines())["PALOMINO_ORCHESTRATOR_TOKEN"]
    api = "http://127.0.0.2:8000"
    volumes_before = set(engine.podman("volume", "ls", "-q").split())
    engine.watch_health(project)
    try:
        started = time.monotonic()
        engine.compose(project, env, "up", "-d", "--build", timeout=1500)
        print(f"compose up --build: {time.monotonic() - started:.0f} s")

        def experiment() -> dict | None:
            try:
                found = get_json(f"{api}/experiments", token)
            except OSError:
                return None
            return found[0] if found else None

        # `submit` sent the experiment through the API with the token; the API refuses it without.
        with pytest.raises(urllib.error.HTTPError) as refused:
            get_json(f"{api}/experiments")
        assert refused.value.code == 401
        wait_until(lambda: (e := experiment()) and e["records"] >= 2 * 9, "two iterations recorded", timeout=600)

        # Kill a container that hosts cells: its cells go to the spare and the run goes on.
        summary = experiment()
        assert summary["state"] == "running" and summary["records"] < ITERATIONS * 9, summary
        hosts = {worker.split("-")[0] for worker in summary["cells"].values()}
        victim = next(c for c in engine.containers(project, "cell") if c["Id"][:12] in hosts)
        engine.podman("kill", victim["Id"])
        # The orchestrator restarted mid-run keeps it (its state is in the runs volume and Redis).
        engine.compose(project, env, "restart", "orchestrator", timeout=120)

        finished = wait_until(
            lambda: (e := experiment()) and e["state"] in {"finished", "failed", "stopped"} and e,
            "the experiment to end",
            timeout=900,
        )
        assert finished["state"] == "finished", finished
        print(f"up to the experiment's end: {time.monotonic() - started:.0f} s")
        assert victim["Id"][:12] not in {w.split("-")[0] for w in finished["cells"].values()}, finished
        (submit,) = engine.containers(project, "submit", all=True)
        assert submit["ExitCode"] == 0, engine.logs(submit["Id"])

        volume = json.loads(engine.podman("volume", "inspect", f"{project}_runs"))[0]["Mountpoint"]
        run_dir = Path(volume) / Path(finished["run_dir"]).name
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        recorded = [(tuple(r["cell"]), r["iteration"]) for r in records]
        assert sorted(recorded) == sorted({((r, c), i) for r in range(3) for c in range(3) for i in range(ITERATIONS)})

        # The dashboard's page and its event stream, through the published port.
        page = urllib.request.urlopen("http://127.0.0.2:8080/", timeout=10).read().decode()
        assert "<html" in page.lower()
        with urllib.request.urlopen("http://127.0.0.2:8080/api/events", timeout=10) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert stream.readline().startswith(b"event: hello")
    finally:
        logs = tmp_path / "compose.log"
        logs.write_text(engine.compose(project, env, "logs", "--no-color", "--tail", "200", timeout=120))
        engine.compose(project, env, "down", "-v", "--remove-orphans", timeout=300)
    label = f"label=com.docker.compose.project={project}"
    assert engine.podman("ps", "-a", "-q", "--filter", label) == ""
    # Named and anonymous (the images' VOLUME folders that compose mounts nothing on) alike.
    assert set(engine.podman("volume", "ls", "-q").split()) == volumes_before
    assert project not in engine.podman("network", "ls", "--format", "{{.Name}}")
