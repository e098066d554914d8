"""Shared helpers: tiny experiment configs, a way to run the real `palomino` command line, the
throwaway RabbitMQ and Redis of the integration tests (tests/servers.py), and the real datasets
(`mnist_dir`, `fashion_mnist_dir`: skipped when absent, failed when CI is set).

Nothing here imports torch at import time, so tests of the torch-free layers stay torch-free.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from servers import ServerError, Servers

REPO = Path(__file__).resolve().parents[1]

# Where the tests find RabbitMQ and Redis. A value from the shell never reaches a test: integration
# tests get the throwaway servers' URLs (the `servers` fixture), the others none at all.
SERVER_VARIABLES = ("PALOMINO_BROKER_URL", "PALOMINO_REDIS_URL")
for _name in SERVER_VARIABLES:
    os.environ.pop(_name, None)

# Tiny networks on a shared 2-core machine: one intra-op thread is ~100× faster than OpenMP threads
# spinning against other jobs. Set before torch is first imported (test modules import it later).
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
if "torch" in sys.modules:  # a plugin imported it first: the variables came too late
    sys.modules["torch"].set_num_threads(1)

# Where the tests find real datasets: $PALOMINO_DATA_DIR/<name> (`make test` sets it where a copy is
# at hand). The `mnist_dir` fixture is the one way a test gets MNIST.
DATA_DIR_ENV = "PALOMINO_DATA_DIR"

# This machine's data roots for orchestrators the tests start: the tests' datasets and pytest's
# temporary folders, besides the usual ones (tests/test_security.py sets its own).
os.environ.setdefault(
    "PALOMINO_DATA_ROOTS",
    os.pathsep.join(
        [
            *([os.environ[DATA_DIR_ENV]] if os.environ.get(DATA_DIR_ENV) else []),
            "/tmp",
            "data",
            "/data/datasets",
            "/usr/share/datasets",
            "~/.cache/palomino",
        ]
    ),
)

# The smallest experiment that still exercises every part of an iteration (seconds on a laptop CPU).
TINY: dict[str, Any] = {
    "name": "tiny",
    "seed": 7,
    "grid": {"rows": 2, "cols": 2, "neighbourhood": "von_neumann"},
    "training": {
        "iterations": 3,
        "batch_size": 32,
        "batches_per_iteration": 2,
        "fitness": {"sample_size": 32},
        "mixture": {"score_samples": 64},
        "checkpoint_every": 1,
        "sample_every": 1,
    },
    "data": {"name": "gaussian_ring", "size": 500},
    "network": {"name": "mlp", "hidden": 16, "latent_dim": 8},
}


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `base` with `changes` merged into it (nested dicts merged, the rest replaced)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture(scope="session")
def referee_classifier(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeds' table's referee classifier (benchmarks/lipizzaner.py --referee-only: ~2 min on 2
    cores), trained once a session into this folder; the tests of that table copy it into their
    --out, where the benchmark finds and reuses it, as a GPU host does the one `gpu.sh prepare` made."""
    folder = tmp_path_factory.mktemp("referee")
    assert benchmark_module("lipizzaner").main(["--referee-only", "--out", str(folder)]) == 0
    return folder


def benchmark_module(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module (the scripts are no package), loaded once a session."""
    key = f"{name}_benchmark"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[key]


def float32_dataset(data: Any) -> Any:
    """The dataset of a DataConfig loaded as float32 (datasets are float32 by contract), whatever
    the default dtype of the test (float64 in the equality tests)."""
    import torch

    from palomino.data import load_dataset

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        return load_dataset(data, 0)
    finally:
        torch.set_default_dtype(previous)


def tiny(**changes: Any) -> dict[str, Any]:
    """The TINY config with section-level changes: tiny(training={"iterations": 5})."""
    return merge(TINY, changes)


def write_yaml(path: Path, raw: Any) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    # Two cores shared with other jobs: tiny nets are fastest on one thread; wide lines keep
    # rich from wrapping log messages that tests look for.
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "300", "PYTHONUNBUFFERED": "1"})
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def cli_command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "palomino.cli", *map(str, args)]


def palomino(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real command line to completion (stdout and stderr captured as text)."""
    return subprocess.run(
        cli_command(*args), cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def start_palomino(*args: str | Path, cwd: Path) -> subprocess.Popen[str]:
    """Start the command line in the background; the caller signals and waits for it."""
    return subprocess.Popen(
        cli_command(*args), cwd=cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen | None = None, timeout: float = 120) -> None:
    """Poll `condition` until it holds; fails early if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"process ended (rc={proc.returncode}) before the condition held:\n{out}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            if proc is not None:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()
            pytest.fail("timed out waiting for the condition")
        time.sleep(0.02)


async def wait_until_async(condition: Callable[[], bool | Awaitable[bool]], timeout: float = 30) -> None:
    """wait_until for async tests: polls `condition` (plain or async) until it holds, else fails."""
    deadline = time.monotonic() + timeout
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for the condition")
        await asyncio.sleep(0.02)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "no output on stdout"
    return lines[-1].strip()


@pytest.fixture
def float64() -> Iterator[None]:
    """torch's default dtype float64 for the test (equality checks where only the order of float
    operations differs); torch is imported here, not when this module loads."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@pytest.fixture
def tiny_config() -> dict[str, Any]:
    return tiny()


def missing_data(reason: str) -> None:
    """Skip the test for want of data; under CI (the variable CI set) fail it instead: CI has the data."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


MNIST_FILES = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")  # the test split: all the tests need


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The MNIST folder, $PALOMINO_DATA_DIR/mnist, holding at least the test split (t10k-*)."""
    how = (
        f"set {DATA_DIR_ENV} to a folder whose mnist/ holds MNIST's IDX files, at least "
        f"{' and '.join(f + '.gz' for f in MNIST_FILES)} (a `palomino train` of MNIST with {DATA_DIR_ENV} set "
        "and --set data.download=true fetches them there)"
    )
    if not os.environ.get(DATA_DIR_ENV):
        missing_data(f"MNIST needed: {DATA_DIR_ENV} is not set; {how}")
    from palomino.data import data_dir  # imports torch: only where a test needs MNIST

    folder = data_dir("mnist")
    if not all((folder / f).is_file() or (folder / f"{f}.gz").is_file() for f in MNIST_FILES):
        missing_data(f"MNIST needed: no {' / '.join(MNIST_FILES)} in {folder}; {how}")
    return folder


@pytest.fixture(scope="session")
def mnist_classifier(tmp_path_factory: pytest.TempPathFactory, mnist_dir: Path) -> Path:
    """A classifier of MNIST trained by `palomino classifier train` at reduced size (seconds): the
    scoring tests' extractor (test_scoring.py checks that it beats 95 %)."""
    folder = tmp_path_factory.mktemp("classifier")
    out = folder / "mnist.safetensors"
    done = palomino(
        "classifier",
        "train",
        "--data",
        "mnist",
        "--data-dir",
        mnist_dir,
        "--out",
        out,
        "--train-size",
        "4000",
        "--test-size",
        "1000",
        "--epochs",
        "4",
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert last_line(done.stdout) == str(out)
    assert "test accuracy" in done.stderr
    return out


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> Path:
    """Debian's Fashion-MNIST (the dataset-fashion-mnist package; `make test` installs it)."""
    from palomino.data.idx import DEBIAN_FASHION_MNIST

    names = [
        f"{split}-{kind}-idx{d}-ubyte.gz" for split in ("train", "t10k") for kind, d in (("images", 3), ("labels", 1))
    ]
    if not all((DEBIAN_FASHION_MNIST / name).is_file() for name in names):
        missing_data(
            f"Fashion-MNIST needed: {DEBIAN_FASHION_MNIST} is missing; "
            "apt-get install dataset-fashion-mnist (`make test` installs it)"
        )
    return DEBIAN_FASHION_MNIST


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """This session's own RabbitMQ and Redis, started when the first integration test needs them."""
    pair = Servers(tmp_path_factory.mktemp("servers"))
    try:
        pair.start()
    except ServerError as error:
        pytest.fail(str(error))
    yield pair
    pair.stop()


@pytest.fixture(autouse=True)
def _server_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Integration tests (and the processes they start) see the throwaway servers' URLs."""
    marked = request.node.get_closest_marker("integration") is not None
    if "servers" in request.fixturenames and not marked:
        pytest.fail("this test uses the servers: mark it @pytest.mark.integration")
    if marked:
        for name, value in request.getfixturevalue("servers").env.items():
            monkeypatch.setenv(name, value)


@pytest.fixture
def broker_url(servers: Servers) -> str:
    return servers.broker_url


@pytest.fixture
def redis_url(servers: Servers) -> str:
    return servers.redis_url


async def exchange_exists(name: str) -> bool:
    """Whether the integration tests' broker has this exchange yet (a passive declare)."""
    import aio_pika
    from aio_pika.exceptions import ChannelClosed

    connection = await aio_pika.connect(os.environ["PALOMINO_BROKER_URL"])
    async with connection:
        try:
            await (await connection.channel()).get_exchange(name)
            return True
        except ChannelClosed:  # NOT_FOUND closes the channel
            return False


async def raw_publish(
    body: bytes | list[bytes], key: str, broker: str | None = None, exchange: str = "palomino.snapshots"
) -> None:
    """Publish raw bytes (one body or several) on an exchange, as a confused or hostile client would.
    The broker is the integration tests' own unless given."""
    import aio_pika

    connection = await aio_pika.connect(broker or os.environ["PALOMINO_BROKER_URL"])
    async with connection:
        channel = await connection.channel()
        target = channel.default_exchange if exchange == "" else await channel.get_exchange(exchange)
        for one in body if isinstance(body, list) else [body]:
            await target.publish(aio_pika.Message(one), routing_key=key)
