"""A throwaway one-node Slurm cluster for the tests: its own munge key and munged, slurmctld and
slurmd on free ports, this machine as the node (its CPUs and memory as `slurmd -C` reads them), and
every file under one folder. Commands reach it through `SLURM_CONF` alone; a Slurm or munged that
already runs on this machine is never contacted.

Standard library only, so that `python tests/slurm_cluster.py` can start one by hand for debugging.
"""

from __future__ import annotations

import os
import pwd
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servers import _die_with_parent, free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "scontrol", "squeue", "scancel", "sinfo")
# A job's end: scontrol says COMPLETING while the job's processes are still being ended.
ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


class SlurmMissing(RuntimeError):
    """A program the cluster needs is not installed."""


class SlurmError(RuntimeError):
    pass


def _program(name: str) -> str:
    path = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"]))
    if path is None:
        raise SlurmMissing(f"{name} is not installed: apt-get install slurm-wlm munge (Debian's Slurm and munge)")
    return path


class SlurmCluster:
    def __init__(self, folder: Path, kill_wait: int = 30) -> None:
        self.folder = folder
        self.kill_wait = kill_wait
        self.programs = {name: _program(name) for name in (*DAEMONS, *COMMANDS)}
        self.conf = folder / "slurm.conf"
        self.processes: dict[str, subprocess.Popen] = {}
        self.node = ""
        self._socket_dir: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        for name in ("munge", "state", "spool", "log"):
            (self.folder / name).mkdir(parents=True, exist_ok=True)
        munge = self.folder / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)  # munged refuses a key others can read
        socket = munge / "munge.socket"
        if len(str(socket)) > 100:  # a UNIX socket's path has at most 107 bytes
            self._socket_dir = tempfile.mkdtemp(prefix="munge-")
            socket = Path(self._socket_dir) / "munge.socket"
        # --force: munged wants every folder above its socket open to all users; a pytest folder is
        # private to its user, and only this user's processes talk to it.
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--socket={socket}",
            f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        self._wait(socket.exists, "munged to create its socket", 30)

        # This machine as the node, as slurmd itself sees it (NodeName=<short hostname> CPUs=… RealMemory=…).
        hardware = self._run(self.programs["slurmd"], "-C").stdout.splitlines()[0]
        self.node = hardware.split()[0].split("=", 1)[1]
        (self.folder / "plugstack.conf").write_text("")  # no SPANK plugins of the machine's
        user = pwd.getpwuid(os.getuid()).pw_name
        settings = {
            "ClusterName": "palominotest",
            "SlurmctldHost": f"{self.node}(127.0.0.1)",
            "SlurmUser": user,  # both daemons as this user: it may run only its own jobs, all we need
            "SlurmdUser": user,
            "SlurmctldPort": free_port(),
            "SlurmdPort": free_port(),
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={socket}",
            "CredType": "cred/munge",
            "StateSaveLocation": self.folder / "state",
            "SlurmdSpoolDir": self.folder / "spool",
            "SlurmctldPidFile": self.folder / "slurmctld.pid",
            "SlurmdPidFile": self.folder / "slurmd.pid",
            "SlurmctldLogFile": self.folder / "log" / "slurmctld.log",
            "SlurmdLogFile": self.folder / "log" / "slurmd.log",
            "PlugStackConfig": self.folder / "plugstack.conf",
            # Processes tracked by parentage: no cgroup hierarchy to set up on the machine.
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SchedulerType": "sched/builtin",
            "AccountingStorageType": "accounting_storage/none",  # no slurmdbd: no sacct, scontrol instead
            "JobAcctGatherType": "jobacct_gather/none",
            "JobCompType": "jobcomp/none",
            "MpiDefault": "none",
            "SwitchType": "switch/none",
            "MailProg": shutil.which("true") or "/bin/true",
            "ReturnToService": 2,
            # Between a job's SIGTERM and its SIGKILL: time for cells to checkpoint.
            "KillWait": self.kill_wait,
            # Job ids name the job's RabbitMQ node (palomino-<id>@localhost, in the machine's shared
            # epmd): not 1, 2, … in every test cluster on this machine.
            "FirstJobId": random.randrange(10_000, 60_000_000),
        }
        lines = [f"{key}={value}" for key, value in settings.items()]
        lines += [
            f"{hardware} NodeAddr=127.0.0.1 State=UNKNOWN",
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

        self._spawn("slurmctld", "-D", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf))
        self._wait(self._node_idle, f"node {self.node} to be idle", 60)

    def _node_idle(self) -> bool:
        done = self.command("sinfo", "--noheader", "--Node", "--format=%N %t", check=False)
        return done.returncode == 0 and done.stdout.split() == [self.node, "idle"]

    def command(self, name: str, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster."""
        return self._run(self.programs[name], *args, check=check, timeout=timeout)

    def sbatch(self, script: Path, *options: str, env: dict[str, str], cwd: Path) -> str:
        """Submit `script` with `options` (which override its #SBATCH lines) and `env` as the job's
        environment (sbatch's default --export=ALL); its job id."""
        done = subprocess.run(
            [self.programs["sbatch"], "--parsable", *options, str(script)],
            env={**env, **self.env},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise SlurmError(f"sbatch {' '.join(options)} {script}: {done.stdout}{done.stderr}")
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, NumTasks, …)."""
        line = self.command("scontrol", "--oneliner", "show", "job", job_id).stdout
        return dict(token.split("=", 1) for token in line.split() if "=" in token)

    def steps(self, job_id: str) -> list[dict[str, str]]:
        """The job's running steps (`scontrol show step`), each as a dict (StepId, Name, Tasks, …)."""
        done = self.command("scontrol", "--oneliner", "show", "step", job_id, check=False)
        return [dict(t.split("=", 1) for t in line.split() if "=" in t) for line in done.stdout.splitlines()]

    def wait_for_end(self, job_id: str, timeout: float, each_second=None) -> dict[str, str]:
        """The job's record once it has ended (its processes gone); `each_second(record)` meanwhile."""
        deadline = time.monotonic() + timeout
        while (record := self.job(job_id))["JobState"] not in ENDED:
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} still {record['JobState']} after {timeout:.0f} s\n{self.log_tail()}")
            if each_second is not None:
                each_second(record)
            time.sleep(1)
        return record

    def stop(self) -> None:
        """Every job cancelled and ended, then slurmd, slurmctld and munged stopped."""
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            jobs = self.command("squeue", "--noheader", "--format=%i", check=False).stdout.split()
            if jobs:
                self.command("scancel", *jobs, check=False)
                deadline = time.monotonic() + self.kill_wait + 30
                while self.command("squeue", "--noheader", check=False).stdout.strip():
                    if time.monotonic() > deadline:
                        print(f"slurm: jobs still there at stop: {jobs}", file=sys.stderr)
                        break
                    time.sleep(1)
        for name in reversed(list(self.processes)):
            process = self.processes.pop(name)
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def log_tail(self, chars: int = 3000) -> str:
        logs = sorted(p for p in self.folder.rglob("*") if p.is_file() and p.suffix in (".log", ".out"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs)

    def _run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        done = subprocess.run(
            argv,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)}: {done.stdout}{done.stderr}")
        return done

    def _spawn(self, name: str, *args: str) -> None:
        with open(self.folder / "log" / f"{name}.out", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [self.programs[name], *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def _wait(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise SlurmError(f"{name} exited ({process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise SlurmError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.log_tail()}")
            time.sleep(0.2)


if __name__ == "__main__":  # python tests/slurm_cluster.py [folder]: a cluster until Ctrl-C or SIGTERM
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(0))
    with tempfile.TemporaryDirectory(prefix="palomino-slurm-") as tmp:
        cluster = SlurmCluster(Path(sys.argv[1] if len(sys.argv) > 1 else tmp)).start()
        print(f"SLURM_CONF={cluster.conf}", flush=True)
        try:
            signal.pause()
        finally:
            cluster.stop()
