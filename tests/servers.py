"""Throwaway RabbitMQ and Redis servers for the integration tests: free ports, every file under a
temporary folder, their own Erlang node and cookie. The tests may stop and restart them; a RabbitMQ
or Redis that already runs on this machine is never contacted.

Standard library only, so that `python tests/servers.py` can start a pair by hand for debugging.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _die_with_parent() -> None:
    # A pytest killed outright (pytest-timeout's thread method, SIGKILL) leaves no server behind.
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _binary(name: str) -> str:
    path = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"]))
    if path is None:
        raise ServerError(
            f"{name} is not installed: `make services` (scripts/ensure-services.sh) installs it; "
            "or leave the integration tests out with -m 'not integration'"
        )
    return path


class _Server:
    name = "server"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.name}.out"

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def _wait(self, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(f"{self.name} exited ({self.process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.name} did not answer on port {self.port} in {timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def _end(self, timeout: float = 30) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def log_tail(self, chars: int = 3000) -> str:
        logs = sorted(p for p in self.folder.rglob("*") if p.is_file() and p.suffix in (".out", ".log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs)


class RedisServer(_Server):
    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.folder)]
        # Nothing on disk: a restart loses every key, as tests/test_distributed.py wants.
        self._spawn([*argv, "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes"])
        self._wait(self.ping, 30)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        self._end()

    def restart(self) -> None:
        """Stopped and started again on the same port, empty."""
        self.stop()
        self.start()


class RabbitMQServer(_Server):
    """A node of its own (name, ports, Erlang cookie, mnesia, logs, plugins: none), beside any other
    node on this machine; only the shared epmd is common to both."""

    name = "rabbitmq"

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.dist_port = free_port()
        self.node = f"palomino-test-{os.getpid()}-{uuid.uuid4().hex[:6]}@localhost"
        # Debian's rabbitmq-server is a wrapper that re-runs the real script as the rabbitmq user
        # (who cannot read our folder): the real scripts are beside the wrapper's target.
        self.scripts = Path(os.path.realpath(_binary("rabbitmq-server"))).parent

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.folder),  # where Erlang keeps this node's cookie
            RABBITMQ_CONF_ENV_FILE=str(self.folder / "rabbitmq-env.conf"),  # not the machine's
            RABBITMQ_CONFIG_FILE=str(self.folder / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.folder / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.folder / "enabled_plugins"),
            RABBITMQ_NODENAME=self.node,
        )
        return env

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "rabbitmq-env.conf").write_text("")
        (self.folder / "enabled_plugins").write_text("[].\n")  # no management plugin: no port 15672
        # The settings the deployments ship (listen backlog, handshake timeout), so that every test
        # broker checks them and the control-plane harness measures what a deployment would run.
        shipped = (Path(__file__).resolve().parent.parent / "charts/palomino/files/rabbitmq.conf").read_text()
        (self.folder / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n{shipped}")
        env = self._env() | {
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_PID_FILE": str(self.folder / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        self._spawn([str(self.scripts / "rabbitmq-server")], env)
        self._wait(lambda: listening(self.port), 120)
        self.ctl("await_startup")

    def ctl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """rabbitmqctl against this node only."""
        done = subprocess.run(
            [str(self.scripts / "rabbitmqctl"), "-n", self.node, *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise ServerError(f"rabbitmqctl -n {self.node} {' '.join(args)}: {done.stdout}{done.stderr}")
        return done

    def restart_app(self) -> None:
        """The broker application stops and starts again in its node: every connection drops,
        non-durable queues go, the port stays."""
        self.ctl("stop_app")
        time.sleep(2)
        self.ctl("start_app")
        self._wait(lambda: listening(self.port), 120)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.ctl("stop", check=False, timeout=60)
        self._end()


class Servers:
    """The pair the integration tests share; `env` is what their processes need to find them."""

    def __init__(self, folder: Path) -> None:
        self.rabbitmq = RabbitMQServer(folder / "rabbitmq")
        self.redis = RedisServer(folder / "redis")

    @property
    def broker_url(self) -> str:
        return self.rabbitmq.url

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @property
    def env(self) -> dict[str, str]:
        return {"PALOMINO_BROKER_URL": self.broker_url, "PALOMINO_REDIS_URL": self.redis_url}

    def start(self) -> Servers:
        try:
            self.redis.start()
            self.rabbitmq.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in (self.rabbitmq, self.redis):
            try:
                server.stop()
            except Exception as error:  # the other one still stops
                print(f"stopping {server.name}: {error}", file=sys.stderr)


if __name__ == "__main__":  # python tests/servers.py [folder]: a pair until Ctrl-C or SIGTERM
    import tempfile

    for sig in (signal.SIGINT, signal.SIGTERM):  # also where a background job ignores SIGINT
        signal.signal(sig, lambda *_: sys.exit(0))
    with tempfile.TemporaryDirectory(prefix="palomino-servers-") as tmp:
        servers = Servers(Path(sys.argv[1] if len(sys.argv) > 1 else tmp)).start()
        print(" ".join(f"{k}={v}" for k, v in servers.env.items()), flush=True)
        try:
            signal.pause()
        finally:
            servers.stop()
