"""TensorBoard logging (`palomino train --tensorboard DIR`), read back with TensorBoard's own reader.

The event files must say what the run directory says: each cell's losses, rates and mixture score
per iteration as in metrics.jsonl, the grid's best score the lowest cell score of each iteration,
each cell's sample pictures at the iterations the run drew them, the result's score as ranking.json.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import last_line, palomino, tiny, write_yaml

from palomino.errors import ConfigError
from palomino.runs.tensorboard_log import PENDING_ITERATIONS, TensorBoardLog, require_writer

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="the dev extras hold tensorboard"
)

ITERATIONS = 4


def read_events(folder: Path):
    accumulator = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    accumulator.Reload()
    return accumulator


def scalars(events, tag: str) -> dict[int, float]:
    return {event.step: event.value for event in events.Scalars(tag)}


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    home = tmp_path_factory.mktemp("tb")
    config = write_yaml(home / "c.yaml", tiny(training={"iterations": ITERATIONS, "sample_every": 2}))
    result = palomino("train", config, "--out", home / "runs", "--tensorboard", home / "tb", cwd=home)
    assert result.returncode == 0, result.stderr[-3000:]
    run = Path(last_line(result.stdout))
    return run, home / "tb" / run.name


def test_the_event_files_hold_each_cells_metrics_as_metrics_jsonl_does(logged: tuple[Path, Path]) -> None:
    run, board = logged
    events = read_events(board)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 4 * ITERATIONS
    best: dict[int, float] = defaultdict(lambda: float("inf"))
    for record in records:
        cell, step = "{}-{}".format(*record["cell"]), record["iteration"] + 1  # steps: iterations done
        for side in ("generator", "discriminator"):
            assert scalars(events, f"{side}_loss/{cell}")[step] == pytest.approx(record[side]["loss"], rel=1e-6)
            assert scalars(events, f"{side}_lr/{cell}")[step] == pytest.approx(record[side]["learning_rate"], rel=1e-6)
        assert scalars(events, f"mixture_score/{cell}")[step] == pytest.approx(record["score"], rel=1e-6)
        best[step] = min(best[step], record["score"])
    assert scalars(events, "grid/best_score") == pytest.approx(dict(best), rel=1e-6)


def test_the_event_files_hold_the_sample_pictures_and_the_result(logged: tuple[Path, Path]) -> None:
    run, board = logged
    events = read_events(board)
    for cell in ("0-0", "0-1", "1-0", "1-1"):
        drawn = sorted(int(p.stem.removeprefix("iter-")) for p in (run / "samples" / cell).glob("iter-*.png"))
        assert drawn == [2, 4]
        assert [image.step for image in events.Images(f"samples/{cell}")] == drawn
        assert events.Images(f"samples/{cell}")[0].encoded_image_string.startswith(b"\x89PNG")
    ranking = json.loads((run / "result" / "ranking.json").read_text())
    expected = ranking["ensemble"]["held_out_score"] if "ensemble" in ranking else ranking["ranking"][0]["score"]
    assert scalars(events, "result/score") == pytest.approx({ITERATIONS: expected}, rel=1e-6)
    assert [image.step for image in events.Images("result/samples")] == [ITERATIONS]


def test_a_resumed_run_drops_what_it_redoes(tmp_path: Path) -> None:
    """Iterations redone after a resume replace the first writer's (TensorBoard's purge step)."""
    record = {"cell": [0, 0], "generator": {"loss": 1.0}, "discriminator": {"loss": 2.0}, "score": 0.5}
    first = TensorBoardLog(tmp_path, cells=1)
    for iteration in range(5):
        first.metrics({**record, "iteration": iteration})
    first.close()
    second = TensorBoardLog(tmp_path, cells=1, purge_step=4)  # resumed after 3 iterations: redoes iteration 3 on
    for iteration in range(3, 6):
        second.metrics({**record, "iteration": iteration, "score": 0.25})
    second.close()
    assert scalars(read_events(tmp_path), "grid/best_score") == {1: 0.5, 2: 0.5, 3: 0.5, 4: 0.25, 5: 0.25, 6: 0.25}


def test_an_iteration_a_dead_cell_never_completes_is_written_with_what_arrived(tmp_path: Path) -> None:
    board = TensorBoardLog(tmp_path, cells=2)
    for iteration in range(PENDING_ITERATIONS + 12):  # cell 0-1 died after iteration 0
        for col in (0, 1) if iteration == 0 else (0,):
            board.metrics({"cell": [0, col], "iteration": iteration, "score": float(col + iteration)})
    board.metrics({"cell": [0, 1], "iteration": 1, "score": -5.0})  # late, after step 2 was summed up: not again
    for hostile in ("x", None, 10**400, True):  # malformed or absurd values: skipped, logging goes on
        board.metrics({"cell": [0, 0], "iteration": hostile, "score": 1.0})
        board.metrics({"cell": [0, 0], "iteration": 3, "score": hostile, "generator": {"loss": hostile}})
    board.close()
    assert scalars(read_events(tmp_path), "grid/best_score") == {
        i + 1: float(i) for i in range(PENDING_ITERATIONS + 12)
    }


def test_without_the_writer_installed_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'palomino\[tensorboard\]'"):
        require_writer()


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims `width`×`height` grey pixels and holds none (a picture from the wire)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + header
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))


@pytest.mark.parametrize("body", [b"not a picture", png_header(100_000, 100_000), b"GIF89a" + bytes(20)])
def test_a_sample_picture_that_is_not_one_is_skipped_and_logging_goes_on(
    tmp_path: Path, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    board = TensorBoardLog(tmp_path, cells=1)
    board.samples("0-0", 1, body)
    board.metrics({"cell": [0, 0], "iteration": 0, "score": 0.5})
    board.close()
    events = read_events(tmp_path)
    assert events.Tags()["images"] == [] and scalars(events, "grid/best_score") == {1: 0.5}
    assert "sample picture not logged" in caplog.text


def test_a_writer_whose_thread_died_is_given_up_not_waited_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """tensorboardX writes from a thread; if a full disk killed it, adding would block on its queue forever."""
    board = TensorBoardLog(tmp_path, cells=1)
    board.metrics({"cell": [0, 0], "iteration": 0, "score": 0.5})
    events_writer = board._writer.file_writer.event_writer
    alive = events_writer._worker
    events_writer._worker = type("Dead", (), {"is_alive": lambda self: False})()
    for iteration in range(1, 50):  # seen dead: nothing more is handed to it
        board.metrics({"cell": [0, 0], "iteration": iteration, "score": 0.25})
    board.close()
    assert "TensorBoard's writer stopped" in caplog.text
    events_writer._worker = alive  # (the real thread, to flush what it had and end)
    board._writer.close()
    assert scalars(read_events(tmp_path), "grid/best_score") == {1: 0.5}
