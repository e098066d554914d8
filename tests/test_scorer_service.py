"""The scorer service against a real RabbitMQ (the session's own): jobs in, results out, dead letters, a kill mid-job."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import aio_pika
import pytest
from conftest import cli_command, cli_env, last_line, palomino, tiny, write_yaml

from palomino.services.local import stop_processes
from palomino.transport.score_queue import ScoreQueue
from palomino.wire.score_messages import ScoreJob, ScoreResult

NAMESPACE = f"test-scorer-{uuid.uuid4().hex[:6]}"  # its own score queue: no other stack's scorer takes these jobs
pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A tiny finished toy run: result/mixture.* is what the jobs carry."""
    folder = tmp_path_factory.mktemp("scorer-run")
    config = write_yaml(folder / "tiny.yaml", tiny(grid={"rows": 1, "cols": 1}, training={"iterations": 2}))
    done = palomino("train", config, "--out", folder / "runs", cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(last_line(done.stdout))


def job_of(run: Path, samples: int | None = None, payload: bytes | None = None) -> tuple[ScoreJob, bytes]:
    description = json.loads((run / "result" / "mixture.json").read_text())
    options = {"samples": samples} if samples else {}
    job = ScoreJob(
        job=f"test-{uuid.uuid4().hex[:8]}",
        experiment="scorer-test",
        target="best",
        mixture=description,
        data={"name": "gaussian_ring", "size": 500},
        options=options,
    )
    return job, payload if payload is not None else (run / "result" / "mixture.safetensors").read_bytes()


class Results:
    """Follows `score` events of the test experiment on a private queue."""

    def __init__(self, broker: str) -> None:
        self.broker = broker
        self.received: list[ScoreResult] = []

    async def __aenter__(self) -> Results:
        self.queue = await ScoreQueue(self.broker, NAMESPACE).connect()
        await self.queue._queue.purge()  # what an earlier test left
        self.connection = await aio_pika.connect(self.broker)
        self.name = f"palomino.test.scores.{uuid.uuid4().hex[:8]}"

        async def keep(result: ScoreResult) -> None:
            self.received.append(result)

        await self.queue.follow_results(self.name, keep, experiments="scorer-test")
        return self

    async def __aexit__(self, *exc: object) -> None:
        channel = await self.connection.channel()
        await channel.queue_delete(self.name)
        await self.connection.close()
        await self.queue.close()

    async def wait_for(self, job: str, timeout: float = 120) -> ScoreResult:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for result in self.received:
                if result.job == job:
                    return result
            await asyncio.sleep(0.1)
        raise AssertionError(f"no result for job {job} within {timeout} s")


def start_scorer(name: str, log: Path) -> subprocess.Popen:
    handle = open(log, "wb")
    env = {**cli_env(), "PALOMINO_NAMESPACE": NAMESPACE}
    return subprocess.Popen(cli_command("scorer", "--name", name), env=env, stdout=handle, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> None:
    stop_processes([process])


async def test_a_job_is_scored_and_bad_jobs_do_not_stop_the_scorer(
    finished_run: Path, tmp_path: Path, broker_url: str
) -> None:
    async with Results(broker_url) as results:
        scorer = start_scorer("scorer-a", tmp_path / "a.log")
        try:
            # Garbage: dead-lettered (never a result); a mixture that does not load: a result with the error.
            await results.queue._default.publish(aio_pika.Message(b"\x00garbage"), routing_key=results.queue.name)
            broken, payload = job_of(finished_run, payload=b"not safetensors")
            await results.queue.enqueue(broken, payload)
            good, payload = job_of(finished_run)
            await results.queue.enqueue(good, payload)
            failed = await results.wait_for(broken.job)
            assert failed.error and not failed.scores
            scored = await results.wait_for(good.job)
            assert scored.error is None and scored.scorer == "scorer-a"
            modes = scored.scores["metrics"]["modes"]
            assert modes["modes"] == 8 and 0 <= modes["value"] <= 8 and scored.scores["n"] == 2500
            assert scorer.poll() is None, "the scorer died"
        finally:
            stop(scorer)
    log = (tmp_path / "a.log").read_text()
    assert "dead-lettering a score job" in log and "cannot be scored" in log


async def test_a_job_is_redone_by_another_scorer_after_a_kill(
    finished_run: Path, tmp_path: Path, broker_url: str
) -> None:
    async with Results(broker_url) as results:
        first = start_scorer("scorer-first", tmp_path / "first.log")
        second = None
        try:
            slow, payload = job_of(finished_run, samples=1_000_000)  # the most a job may ask: time to kill it
            await results.queue.enqueue(slow, payload)
            deadline = time.monotonic() + 60
            while f"scoring job {slow.job}" not in (tmp_path / "first.log").read_text():
                assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "first.log").read_text()
                await asyncio.sleep(0.05)
            first.send_signal(signal.SIGKILL)
            first.wait()
            second = start_scorer("scorer-second", tmp_path / "second.log")
            result = await results.wait_for(slow.job, timeout=240)
            assert result.scorer == "scorer-second" and result.error is None
            assert result.scores["n"] == 1_000_000
            assert all(r.scorer != "scorer-first" for r in results.received if r.job == slow.job)
        finally:
            stop(first)
            if second is not None:
                stop(second)
