"""End to end through the real command line: `palomino train`, `--resume`, Ctrl-C and `palomino sample`.

Each run is a tiny 2×2 grid on the Gaussian ring (seconds); they are still marked slow because a
Python start with torch costs a few seconds each on a loaded 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import last_line, palomino, start_palomino, tiny, wait_until, write_yaml

from palomino.runs.listing import list_runs

PNG = b"\x89PNG\r\n\x1a\n"
CELLS = ["0-0", "0-1", "1-0", "1-1"]
SIDE_FIELDS = {"loss", "fitness", "learning_rate"}
RECORD_FIELDS = {
    "iteration", "cell", "epoch", "generator", "discriminator", "losses_used", "score", "mixture", "neighbours", "seconds", "steps",
    "tile",  # an embedded mlp run is one tile (docs/tiles.md)
}  # fmt: skip


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def line_count(path: Path) -> int:
    """Complete lines so far (safe to call while a writer appends)."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def cell_key(record: dict[str, Any]) -> str:
    return "-".join(map(str, record["cell"]))


def checkpoint_iterations(run: Path, cell: str) -> list[int]:
    folder = run / "checkpoints" / cell
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := re.fullmatch(r"iter-(\d+)\.json", p.name)))


def assert_complete(run: Path, iterations: int) -> None:
    """metrics.jsonl holds exactly one record per (cell, iteration), for every cell and iteration."""
    rows = records(run)
    pairs = Counter((cell_key(r), r["iteration"]) for r in rows)
    duplicates = [pair for pair, n in pairs.items() if n > 1]
    assert duplicates == []
    assert len(rows) == len(CELLS) * iterations
    assert set(pairs) == {(c, i) for c in CELLS for i in range(iterations)}


def assert_finished(run: Path) -> None:
    for name in ("mixture.safetensors", "mixture.json", "ranking.json", "samples.png"):
        assert (run / "result" / name).is_file(), name
    ranking = json.loads((run / "result" / "ranking.json").read_text())["ranking"]
    for entry in ranking:  # every cell's neighbourhood mixture is kept for the scorer
        assert (run / "result" / "cells" / entry["cell"] / "mixture.json").is_file(), entry["cell"]
    assert (run / "samples" / "real.png").read_bytes().startswith(b"\x89PNG")


# --- one finished run, inspected by several tests -------------------------------------------------

ITERATIONS = 4


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    home = tmp_path_factory.mktemp("e2e")
    raw = tiny(training={"iterations": ITERATIONS, "checkpoint_every": 1, "checkpoint_keep": 2, "sample_every": 2})
    config = write_yaml(home / "experiment.yaml", raw)
    result = palomino(
        "train", config, "--out", home / "runs", "--set", "training.losses=[minimax,mse]", "--set", "seed=11", cwd=home
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = Path(last_line(result.stdout))
    if not run.is_absolute():
        run = home / run
    return run, result


@pytest.mark.slow
def test_run_directory_is_printed_last(finished: tuple[Path, Any]) -> None:
    run, _result = finished
    assert run.is_dir()
    assert run.parent.name == "runs" and run.name.startswith("tiny-")
    assert (run / "config.yaml").is_file()


@pytest.mark.slow
def test_config_and_topology(finished: tuple[Path, Any]) -> None:
    run, _ = finished
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["training"]["losses"] == ["minimax", "mse"]  # the --set override was applied and recorded
    assert config["seed"] == 11
    assert config["grid"] == {"rows": 2, "cols": 2, "neighbourhood": "von_neumann"}
    assert config["training"]["iterations"] == ITERATIONS
    topology = [json.loads(line) for line in (run / "topology.jsonl").read_text().splitlines()]
    assert len(topology) == 1
    assert topology[0]["epoch"] == 0 and topology[0]["rows"] == 2 and topology[0]["cols"] == 2
    assert sorted(topology[0]["cells"]) == CELLS


@pytest.mark.slow
def test_metrics_records(finished: tuple[Path, Any]) -> None:
    run, _ = finished
    assert_complete(run, ITERATIONS)
    for record in records(run):
        assert set(record) == RECORD_FIELDS, set(record) ^ RECORD_FIELDS
        assert record["epoch"] == 0
        for side in ("generator", "discriminator"):
            assert set(record[side]) == SIDE_FIELDS
            assert all(isinstance(v, float) for v in record[side].values())
        assert set(record["losses_used"]) <= {"minimax", "mse"}
        assert sum(record["losses_used"].values()) == 2
        assert isinstance(record["score"], float) and record["score"] >= 0
        assert sum(record["mixture"].values()) == pytest.approx(1.0)
        assert set(record["mixture"]) == {cell_key(record), *record["neighbours"]}
        assert len(record["neighbours"]) == 2  # von Neumann on 2×2: two distinct neighbours
        assert set(record["seconds"]) == {"wait", "train", "communicate"}
        assert all(isinstance(v, float) and v >= 0 for v in record["seconds"].values())


@pytest.mark.slow
def test_samples_and_checkpoints(finished: tuple[Path, Any]) -> None:
    run, _ = finished
    for cell in CELLS:
        pictures = sorted(p.name for p in (run / "samples" / cell).glob("*.png"))
        assert pictures == ["iter-2.png", "iter-4.png"]  # sample_every=2
        assert (run / "samples" / cell / "iter-4.png").read_bytes().startswith(PNG)
        assert checkpoint_iterations(run, cell) == [3, 4]  # checkpoint_every=1, last 2 kept
        for i in (3, 4):
            assert (run / "checkpoints" / cell / f"iter-{i}.safetensors").is_file()
            sidecar = json.loads((run / "checkpoints" / cell / f"iter-{i}.json").read_text())
            assert sidecar["iteration"] == i and sidecar["meta"]["iteration"] == i


@pytest.mark.slow
def test_result(finished: tuple[Path, Any]) -> None:
    run, _ = finished
    assert_finished(run)
    mixture = json.loads((run / "result" / "mixture.json").read_text())
    assert sum(mixture["weights"]) == pytest.approx(1.0) and all(w >= 0 for w in mixture["weights"])
    # The result is the whole grid's ensemble: every cell a component, weights optimised on held-out data.
    assert mixture["cell"] == "grid" and sorted(mixture["components"]) == CELLS
    assert len(mixture["weights"]) == len(CELLS)
    ensemble = mixture["ensemble"]
    assert ensemble["cells"] == mixture["components"] and ensemble["weights"] == pytest.approx(mixture["weights"])
    assert ensemble["held_out_score"] >= 0 and mixture["score"] == ensemble["held_out_score"]
    ranking = json.loads((run / "result" / "ranking.json").read_text())
    assert ranking["ensemble"] == ensemble
    # Each cell's own neighbourhood mixture is still ranked, for the record.
    neighbourhoods = ranking["ranking"]
    assert sorted(r["cell"] for r in neighbourhoods) == CELLS
    scores = [r["score"] for r in neighbourhoods]
    assert scores == sorted(scores)
    for entry in neighbourhoods:
        assert len(entry["components"]) == 3 and entry["components"][0] == entry["cell"]
    assert (run / "result" / "samples.png").read_bytes().startswith(PNG)


@pytest.mark.slow
def test_sample_npy(finished: tuple[Path, Any], tmp_path: Path) -> None:
    run, _ = finished
    out = tmp_path / "x.npy"
    result = palomino("sample", run, "--n", "100", "--out", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert last_line(result.stdout) == str(out)
    samples = np.load(out, allow_pickle=False)
    assert samples.dtype == np.float32 and samples.shape == (100, 2)
    assert np.isfinite(samples).all()
    # Seeded: the same command gives the same samples.
    again = tmp_path / "y.npy"
    assert palomino("sample", run, "--n", "100", "--out", again, cwd=tmp_path).returncode == 0
    assert np.array_equal(np.load(again), samples)


@pytest.mark.slow
def test_sample_png_through_the_console_script(finished: tuple[Path, Any], tmp_path: Path) -> None:
    import subprocess

    from conftest import cli_env

    run, _ = finished
    script = Path(sys.executable).with_name("palomino")
    if not script.exists():
        pytest.skip("the console script is not installed next to this interpreter")
    out = tmp_path / "x.png"
    result = subprocess.run(
        [str(script), "sample", str(run), "--n", "100", "--out", str(out)],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert out.read_bytes().startswith(PNG)
    from PIL import Image

    with Image.open(out) as picture:
        assert picture.format == "PNG" and picture.width > 0


@pytest.mark.slow
def test_sample_errors(finished: tuple[Path, Any], tmp_path: Path) -> None:
    run, _ = finished
    bad_suffix = palomino("sample", run, "--n", "5", "--out", tmp_path / "x.csv", cwd=tmp_path)
    assert bad_suffix.returncode == 2 and ".npy or .png" in bad_suffix.stderr
    (tmp_path / "empty").mkdir()
    not_a_run = palomino("sample", tmp_path / "empty", "--n", "5", "--out", tmp_path / "x.npy", cwd=tmp_path)
    assert not_a_run.returncode == 2 and "not a run directory" in not_a_run.stderr  # as `score` says it
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.yaml").write_bytes((run / "config.yaml").read_bytes())
    unfinished = palomino("sample", tmp_path / "unfinished", "--n", "5", "--out", tmp_path / "x.npy", cwd=tmp_path)
    assert unfinished.returncode == 1 and "did the run finish" in unfinished.stderr
    assert "Traceback" not in unfinished.stderr + bad_suffix.stderr + not_a_run.stderr


# --- reproducibility ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_synchronous_runs_are_reproducible(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", tiny(training={"iterations": 3, "sample_every": 0, "checkpoint_every": 0}))
    runs = []
    for _ in range(2):
        result = palomino(
            "train", config, "--out", tmp_path / "runs", "--set", "training.synchronous=true", cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(tmp_path / "runs" / Path(last_line(result.stdout)).name)
    assert runs[0] != runs[1]

    def without_timings(run: Path) -> dict:
        out = {}
        for record in records(run):
            record.pop("seconds")
            out[(cell_key(record), record["iteration"])] = record
        return out

    first, second = without_timings(runs[0]), without_timings(runs[1])
    assert len(first) == 12
    assert first == second
    rankings = [json.loads((run / "result" / "ranking.json").read_text()) for run in runs]
    assert rankings[0] == rankings[1]


# --- killed, corrupted and interrupted runs -----------------------------------------------------------


def start_long_run(tmp_path: Path, iterations: int, **training: Any) -> tuple[Any, Path]:
    raw = tiny(training={"iterations": iterations, "sample_every": 0, **training})
    config = write_yaml(tmp_path / "c.yaml", raw)
    proc = start_palomino("train", config, "--out", tmp_path / "runs", cwd=tmp_path)
    out = tmp_path / "runs"
    wait_until(lambda: out.is_dir() and any(out.iterdir()), proc)
    (run,) = list(out.iterdir())
    return proc, run


def resume(run: Path, cwd: Path) -> Any:
    result = palomino("train", "--resume", run, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    assert Path(last_line(result.stdout)).resolve() == run.resolve()
    return result


@pytest.mark.slow
def test_resume_after_kill(tmp_path: Path) -> None:
    iterations = 30
    proc, run = start_long_run(tmp_path, iterations, checkpoint_every=2)
    wait_until(lambda: all(checkpoint_iterations(run, c) for c in CELLS), proc)
    proc.send_signal(signal.SIGSTOP)  # paused, its lock held: it cannot finish while a second trainer starts
    (listed,) = list_runs(run.parent)
    assert (listed.state, listed.grid, listed.iterations) == ("running", "2×2", iterations)
    twice = palomino("train", "--resume", run, cwd=tmp_path)  # one trainer a run
    assert twice.returncode == 1 and f"is being trained by pid {proc.pid}" in " ".join(twice.stderr.split())
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "result").exists(), "the run finished before it could be killed"
    done_before = len(records(run))
    assert done_before < len(CELLS) * iterations
    (listed,) = list_runs(run.parent)
    assert (listed.state, listed.resumable) == ("killed", True)
    assert 0 < listed.iterations_done < iterations and listed.best_score is not None

    result = resume(run, tmp_path)
    assert "starts again from iteration 0" not in result.stderr  # every cell resumed from its checkpoint
    assert "skipping corrupt checkpoint" not in result.stderr
    assert_complete(run, iterations)
    assert_finished(run)
    assert all(checkpoint_iterations(run, c)[-1] == iterations for c in CELLS)
    shown = palomino("runs", run.parent, "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    (listed,) = [json.loads(line) for line in shown.stdout.splitlines()]
    assert listed["state"] == "finished" and listed["iterations_done"] == iterations
    assert listed["best_score"] is not None and listed["path"] == str(run)


def test_cells_stopped_at_different_iterations_resume_each_from_its_own_checkpoint(tmp_path: Path) -> None:
    """As a distributed run's workers leave it (scancel, a node lost): one cell's newest checkpoint
    is older than every one the others kept. A tile would move them in lockstep from the oldest,
    which the others have pruned, and start them again from 0; `tiles: auto` resumes them untiled."""
    raw = tiny(training={"iterations": 4, "sample_every": 0, "checkpoint_every": 1, "checkpoint_keep": 2})
    assert raw.get("tiles", "auto") == "auto"
    config = write_yaml(tmp_path / "c.yaml", raw)
    done = palomino("train", config, "--out", tmp_path / "runs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = Path(last_line(done.stdout))
    behind = tmp_path / "0-0"
    shutil.copytree(run / "checkpoints" / "0-0", behind)  # iterations 3 and 4
    more = palomino("train", "--resume", run, "--set", "training.iterations=6", cwd=tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    shutil.rmtree(run / "checkpoints" / "0-0")
    shutil.copytree(behind, run / "checkpoints" / "0-0")  # the others kept 5 and 6 only
    shutil.rmtree(run / "result")

    result = palomino("train", "--resume", run, "--set", "training.iterations=8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "starts again from iteration 0" not in result.stderr
    assert "untiled, each from its own checkpoint" in " ".join(result.stderr.split())
    assert_complete(run, 8)
    assert_finished(run)


@pytest.mark.slow
def test_resume_with_a_corrupt_newest_checkpoint(tmp_path: Path) -> None:
    iterations = 30
    proc, run = start_long_run(tmp_path, iterations, checkpoint_every=1, checkpoint_keep=3)
    wait_until(lambda: all(len(checkpoint_iterations(run, c)) >= 2 for c in CELLS), proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (run / "result").exists(), "the run finished before it could be killed"

    newest = checkpoint_iterations(run, "0-0")[-1]
    tensors = run / "checkpoints" / "0-0" / f"iter-{newest}.safetensors"
    data = bytearray(tensors.read_bytes())
    for position in range(len(data) // 2, len(data) // 2 + 16):
        data[position] ^= 0xFF
    tensors.write_bytes(bytes(data))

    result = resume(run, tmp_path)
    squeezed = "".join(result.stderr.split())  # rich may wrap a long log line
    assert "skippingcorruptcheckpoint" in squeezed, result.stderr[-3000:]
    assert f"0-0/iter-{newest}.json" in squeezed
    assert_complete(run, iterations)
    assert_finished(run)


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    iterations = 40
    # checkpoint_every=0: the only checkpoints before the end are the ones Ctrl-C writes.
    proc, run = start_long_run(tmp_path, iterations, checkpoint_every=0)
    wait_until(lambda: line_count(run / "metrics.jsonl") >= 4, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert Path(last_line(stdout)).resolve() == run.resolve()
    assert "Traceback" not in stderr
    assert "--resume" in stderr
    assert not (run / "result").exists()
    done = Counter(cell_key(r) for r in records(run))
    for cell in CELLS:
        # Each cell stopped after finishing its iteration, and checkpointed exactly there.
        assert checkpoint_iterations(run, cell) == [done[cell]], (cell, done)
        assert 0 < done[cell] < iterations

    resume(run, tmp_path)
    assert_complete(run, iterations)
    assert_finished(run)


# --- stopping a synchronous run in-process ------------------------------------------------------------


def test_stop_reaches_a_cell_waiting_for_a_stopped_neighbour() -> None:
    from palomino.coevolution import Cell
    from palomino.config import parse_config
    from palomino.data import load_dataset
    from palomino.engine.loop import Alone, LoopSettings, run_group
    from palomino.grid import Coord, Topology
    from palomino.transport import InMemoryLiveness, InMemorySnapshotBus

    cfg = parse_config(tiny(grid={"rows": 1, "cols": 2}, training={"synchronous": True}))
    dataset = load_dataset(cfg.data, cfg.seed)
    topology = Topology(1, 2)
    slow, fast = Coord(0, 0), Coord(0, 1)
    cells = {c: Cell(c, topology, cfg, dataset, experiment="t") for c in (slow, fast)}

    class Recorder:
        """Records everything; the slow cell's first checkpoint takes until `release` (a slow disk)."""

        def __init__(self) -> None:
            self.metrics_seen: list[tuple[Coord, int]] = []
            self.checkpoints: list[tuple[Coord, int]] = []
            self.release = asyncio.Event()

        async def metrics(self, record: dict) -> None:
            self.metrics_seen.append((Coord(*record["cell"]), record["iteration"]))

        async def samples(self, coord, iteration, samples) -> None:
            pass

        async def checkpoint(self, coord, iteration, tensors, meta) -> None:
            if coord == slow and not self.checkpoints.count((slow, 1)):
                self.checkpoints.append((coord, iteration))
                await self.release.wait()
                return
            self.checkpoints.append((coord, iteration))

    async def scenario() -> Recorder:
        bus, liveness, recorder, stop = InMemorySnapshotBus(), InMemoryLiveness(), Recorder(), asyncio.Event()
        settings = {c: LoopSettings(iterations=50, synchronous=True, worker=str(c), checkpoint_every=1) for c in cells}
        runs = [
            asyncio.create_task(run_group(Alone(cells[c]), bus, liveness, recorder, settings[c], stop)) for c in cells
        ]
        # The fast cell finishes iteration 1 (it needs the slow cell's iteration 0, published before
        # the slow checkpoint) and then waits for the slow cell's iteration 1.
        while (fast, 1) not in recorder.metrics_seen:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        stop.set()  # Ctrl-C
        recorder.release.set()  # the slow checkpoint completes; the slow cell sees `stop` and ends
        try:
            await asyncio.wait_for(asyncio.gather(*runs), timeout=5)
        finally:
            for task in runs:
                task.cancel()
        return recorder

    recorder = asyncio.run(scenario())
    assert cells[slow].iteration == 1
    assert cells[fast].iteration == 2
    assert (fast, 2) in recorder.checkpoints  # the waiting cell ended with its checkpoint


@pytest.mark.parametrize("text", ["grid: [unclosed", "- just\n- a list\n", "grid: {rows: -3}\n"])
def test_resume_with_a_malformed_config_exits_2_naming_it(tmp_path: Path, text: str) -> None:
    run = tmp_path / "runs" / "broken"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(text)
    result = palomino("train", "--resume", run, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and ("config" in result.stderr or "grid.rows" in result.stderr), (
        result.stderr
    )


def test_the_cli_takes_verbose_after_the_command_and_refuses_what_is_not_a_choice(tmp_path: Path) -> None:
    late = palomino("sample", tmp_path, "--n", "1", "--out", tmp_path / "x.npy", "-v", cwd=tmp_path)
    assert late.returncode == 2 and "not a run directory" in late.stderr and "No such option" not in late.stderr
    for args, what in (
        (("score", tmp_path, "--extractor", "vgg"), "'vgg' is not one of"),
        (("score", tmp_path, "--device", "gpu"), "use cpu, cuda or cuda:N"),
        (("classifier", "train", "--data", "gaussian_ring", "--out", tmp_path / "c.safetensors"), "is not one of"),
    ):
        done = palomino(*args, cwd=tmp_path)
        assert done.returncode == 2 and what in done.stderr, done.stderr
