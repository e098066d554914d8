"""The orchestrator's layout bookkeeping when a shrink and a cell's Done cross on the wire.

The control channel here is a recorder: these tests are about the orchestrator's decisions, not
the broker (tests/test_distributed.py runs the same paths with real processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import done, running_2x2

from palomino.errors import TransportError
from palomino.grid import Coord
from palomino.services.common.service_settings import ServiceSettings
from palomino.services.orchestrator.experiment import Experiment
from palomino.services.orchestrator.orchestrator import Orchestrator
from palomino.wire.control_messages import Done, Metrics, Resize


def test_a_done_sent_just_before_a_shrink_moved_its_worker_counts_where_it_went(tmp_path: Path) -> None:
    orchestrator, experiment = running_2x2(tmp_path)
    # w0 dies; 3 survivors lay out as 1×3: w2 moves from 1-0 and w3 from 1-1 …
    asyncio.run(orchestrator.recovery.shrink(experiment, {Coord(0, 0): "w0"}))
    moved = {m.worker: m.coord for _, m in orchestrator.control.sent if isinstance(m, Resize)}
    assert moved == {"w1": (0, 1), "w2": (0, 0), "w3": (0, 2)}
    # … but w2 had finished at 1-0 and its Done crossed the Resize: it stands for 0-0.
    asyncio.run(orchestrator.results.on_done(experiment, done("w2", (1, 0)), b""))
    assert set(experiment.done) == {Coord(0, 0)} and experiment.done[Coord(0, 0)].cell == "0-0"
    assert experiment.done[Coord(0, 0)].trained_at == "1-0"  # its own generator's name in its mixture
    assert experiment.state == "running"


def test_a_done_from_a_replaced_worker_is_still_dropped(tmp_path: Path) -> None:
    orchestrator, experiment = running_2x2(tmp_path)
    asyncio.run(orchestrator.recovery.shrink(experiment, {Coord(0, 0): "w0"}))
    asyncio.run(orchestrator.results.on_done(experiment, done("w0", (0, 0)), b""))  # the dead one, late
    asyncio.run(orchestrator.results.on_done(experiment, done("w1", (1, 1)), b""))  # never held 1-1
    assert experiment.done == {}


def test_every_done_is_acknowledged_and_taken_once(tmp_path: Path, monkeypatch) -> None:
    from palomino.services.orchestrator import results
    from palomino.wire.control_messages import DoneAck

    orchestrator, experiment = running_2x2(tmp_path)
    written: list[str] = []
    real_write = results.write_collected
    monkeypatch.setattr(results, "write_collected", lambda path, result: written.append(result.cell) or real_write(path, result))  # fmt: skip

    async def go() -> None:
        await orchestrator.on_control(done("w1", (0, 1)), b"")
        await orchestrator.on_control(done("w1", (0, 1)), b"")  # re-sent before the ack arrived
        await orchestrator.on_control(done("intruder", (1, 1)), b"")  # holds nothing: dropped, acked
        late = Done(experiment="gone-1", worker="w9", coord=(0, 0), iteration=9, score=0, components=[], weights=[], mixture={})  # fmt: skip
        await orchestrator.on_control(late, b"")  # an experiment this orchestrator does not know

    asyncio.run(go())
    assert written == ["0-1"] and set(experiment.done) == {Coord(0, 1)}
    acks = [(address, m.experiment, m.coord, m.iteration) for address, m in orchestrator.control.sent if isinstance(m, DoneAck)]  # fmt: skip
    assert acks == [
        ("cell.w1", "race-1", (0, 1), 9),
        ("cell.w1", "race-1", (0, 1), 9),
        ("cell.intruder", "race-1", (1, 1), 9),
        ("cell.w9", "gone-1", (0, 0), 9),
    ]


def metrics(worker: str, cell: tuple[int, int], iteration: int) -> Metrics:
    return Metrics(experiment="race-1", worker=worker, record={"cell": list(cell), "iteration": iteration})


def test_records_arriving_together_are_written_and_shown_together(tmp_path: Path) -> None:
    orchestrator, experiment = running_2x2(tmp_path)
    sent = [metrics(f"w{i}", cell, it) for it in range(3) for i, cell in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)])]

    async def go() -> None:
        await asyncio.gather(*(orchestrator.on_control(m, b"") for m in sent))  # as the consumer runs them
        await orchestrator.on_control(sent[5], b"")  # redelivered: taken once

    asyncio.run(go())
    lines = [(tuple(r["cell"]), r["iteration"]) for r in experiment.run.metrics()]
    assert lines == [(tuple(m.record["cell"]), m.record["iteration"]) for m in sent]
    events = [body["records"] for kind, body in orchestrator.control.events if kind == "metrics"]
    # The first is written alone; the eleven that arrived meanwhile go as one write and one event.
    assert [len(e) for e in events] == [1, 11]
    assert orchestrator.counters["metrics_records"] == 12


def test_a_rewrite_drops_records_taken_but_not_yet_written(tmp_path: Path) -> None:
    orchestrator, experiment = running_2x2(tmp_path)

    async def go() -> None:
        for it in range(4):
            await orchestrator.on_control(metrics("w0", (0, 0), it), b"")
        async with experiment.metrics_lock:  # a group being written: what arrives now waits
            forget = asyncio.create_task(orchestrator.records.forget(experiment, {"0-0": 2, "0-1": 0}))  # → the rewrite
            await asyncio.sleep(0)  # the rewrite is next in line
            late = [asyncio.create_task(orchestrator.on_control(m, b"")) for m in (metrics("w0", (0, 0), 4), metrics("w1", (0, 1), 0))]  # fmt: skip
            await asyncio.sleep(0)
        await (await forget)
        await asyncio.gather(*late)

    asyncio.run(go())
    # 0-0 redoes iterations 2 and on, 0-1 all of them: the records taken meanwhile went with the rewrite.
    assert [(r["cell"], r["iteration"]) for r in experiment.run.metrics()] == [([0, 0], 0), ([0, 0], 1)]
    assert experiment.recorded == {("0-0", 0), ("0-0", 1)}


def test_a_missing_cells_state_is_looked_up_while_its_death_is_still_undecided(tmp_path: Path) -> None:
    import time

    from palomino.services.orchestrator.experiment import Worker
    from palomino.wire.control_messages import Assign

    orchestrator, experiment = running_2x2(tmp_path)
    shared = orchestrator.shared
    shared.liveness_since = time.monotonic() - 60  # Redis has answered for long
    shared.workers["s"] = Worker("s")  # a registered spare
    shared.alive = {"w1", "w2", "w3", "s"}  # w0's heartbeat has expired: missing
    lookups: list[Coord] = []

    async def newest_published(experiment: Experiment, coord: Coord) -> tuple[bytes, int] | None:
        lookups.append(coord)
        return None

    orchestrator.placement.newest_published = newest_published

    async def go() -> None:
        await orchestrator.recovery.check_cells(experiment)  # missing for less than GATHER: not dead yet
        await asyncio.sleep(0.1)
        assert lookups == [Coord(0, 0)] and experiment.cells[Coord(0, 0)] == "w0"
        shared.workers["w0"].last_seen -= 3  # gone for longer than GATHER: dead
        await orchestrator.recovery.check_cells(experiment)

    asyncio.run(go())
    assert experiment.cells[Coord(0, 0)] == "s"
    assert [m.worker for _, m in shared.control.sent if isinstance(m, Assign)] == ["s"]
    assert lookups == [Coord(0, 0)]  # the replacement used the lookup made while w0 was missing


def test_a_lookup_for_a_cell_that_came_back_is_dropped(tmp_path: Path) -> None:
    orchestrator, experiment = running_2x2(tmp_path)

    async def slow(experiment: Experiment, coord: Coord) -> None:
        await asyncio.sleep(60)

    orchestrator.placement.newest_published = slow

    async def go() -> list[bool]:
        orchestrator.placement.prefetch(experiment, [Coord(0, 0), Coord(1, 1)])
        tasks = [task for _, task in orchestrator.placement._prefetched.values()]
        orchestrator.placement.prefetch(experiment, [Coord(1, 1)])  # 0-0's heartbeat is back
        await asyncio.sleep(0.1)
        kept = list(orchestrator.placement._prefetched)
        await orchestrator.placement.end(experiment, "stopped")  # and nothing is left behind
        await asyncio.sleep(0)
        return [kept == [("race-1", Coord(1, 1))], *[task.cancelled() for task in tasks]]

    assert asyncio.run(go()) == [True, True, True]
    assert orchestrator.placement._prefetched == {}


def test_supervision_backs_off_while_redis_refuses(tmp_path: Path) -> None:
    # The `continue` used to skip the sleep: 340,000 liveness queries a second against a dead Redis.
    from palomino.transport.redis_liveness import RedisLiveness

    orchestrator = Orchestrator(ServiceSettings(), tmp_path)
    orchestrator.liveness = RedisLiveness("redis://127.0.0.1:1/0")  # nothing listens there
    calls = 0
    real_alive = orchestrator.liveness.alive

    async def counted() -> set[str]:
        nonlocal calls
        calls += 1
        return await real_alive()

    orchestrator.liveness.alive = counted

    async def supervise_for(seconds: float) -> None:
        task = asyncio.create_task(orchestrator.supervisor.run())
        await asyncio.sleep(seconds)
        task.cancel()
        await orchestrator.liveness.close()

    asyncio.run(supervise_for(3.0))
    assert 1 <= calls <= 5, calls  # 0.5 s, then 1, 2, 4 … between queries


def test_metrics_pages_are_read_incrementally_and_survive_a_rewrite(tmp_path: Path) -> None:
    import json

    from palomino.services.common.runfiles import RunFiles

    def page(since: int, limit: int) -> tuple[list[dict], int, int]:  # what the API's metrics page holds
        got = files.metrics_page(since, limit)
        assert got["since"] == since
        return got["records"], got["next"], got["total"]

    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"cell": [0, 0], "iteration": i}) + "\n" for i in range(5)) + '{"cell": [0, 0], "iter'
    )
    files = RunFiles(tmp_path)  # the orchestrator keeps one per experiment (Experiment.files)
    records, following, total = page(0, 2)
    assert [r["iteration"] for r in records] == [0, 1] and (following, total) == (2, 5)  # the torn line waits
    with open(path, "a") as handle:
        handle.write('ation": 5}\n')
    records, following, total = page(4, 100)
    assert [r["iteration"] for r in records] == [4, 5] and (following, total) == (6, 6)
    assert page(6, 10) == ([], 6, 6)
    # A resume rewrites the file (atomically: a new inode) with fewer records: the index starts again.
    from palomino.io import atomic_write

    atomic_write(path, b'{"cell": [0, 0], "iteration": 0}\n')
    assert page(0, 10) == ([{"cell": [0, 0], "iteration": 0}], 1, 1)


def test_a_result_moved_by_a_shrink_still_gives_its_own_generator_to_the_grid_ensemble() -> None:
    import numpy as np
    from safetensors.numpy import load, save

    from palomino.runs.result import CellResult, grid_components

    def result(cell: str, trained_at: str, value: float) -> CellResult:
        # A neighbourhood mixture: its own generator (named by where it trained) and a neighbour's.
        components = [trained_at, "0-1"]
        payload = save({f"component.{i}.w": np.full(2, value + i, dtype=np.float32) for i in range(2)})
        return CellResult(cell, 0.1, components, [0.5, 0.5], payload, {"network": {}}, trained_at=trained_at)

    payload, description = grid_components([result("0-0", "1-0", 10.0), result("0-2", "0-2", 20.0)], "x")
    tensors = load(payload)
    assert description["components"] == ["0-0", "0-2"]
    assert tensors["component.0.w"].tolist() == [10.0, 10.0] and tensors["component.1.w"].tolist() == [20.0, 20.0]


def test_a_checkpoint_that_does_not_load_falls_back_to_the_previous_then_to_scratch(tmp_path: Path) -> None:
    # It failed the whole experiment: a forged or wrong-architecture checkpoint (valid checksum).
    from palomino.runs.checkpoints import write_checkpoint_bytes
    from palomino.wire.control_messages import Assign, Failed

    orchestrator, experiment = running_2x2(tmp_path)

    async def nothing_published(experiment: Experiment, coord: Coord) -> None:
        return None

    orchestrator.placement.newest_published = nothing_published
    folder = experiment.run.checkpoint_dir(Coord(0, 1))
    for iteration in (2, 4):
        write_checkpoint_bytes(folder, iteration, b"state at %d" % iteration, {"iteration": iteration, "epoch": 0}, 3)

    def last_assign() -> Assign:
        return [m for _, m in orchestrator.control.sent if isinstance(m, Assign)][-1]

    async def go() -> list[int | None]:
        restored = []
        await orchestrator.placement.assign(experiment, Coord(0, 1), "w1", restore=True)
        restored.append((last_assign().restore_meta or {}).get("iteration"))
        for _ in range(2):
            failed = Failed(experiment="race-1", worker="w1", reason="w1: does not load", restore_failed=True)
            await orchestrator.on_control(failed, b"")
            restored.append((last_assign().restore_meta or {}).get("iteration"))
        assert experiment.state == "running"
        await orchestrator.on_control(
            Failed(experiment="race-1", worker="w1", reason="w1: from scratch too", restore_failed=True), b""
        )
        return restored

    assert asyncio.run(go()) == [4, 2, None]  # newest, the previous, then scratch …
    assert experiment.state == "failed"  # … and only when nothing loads does the experiment fail


def test_a_snapshot_ahead_of_the_cells_records_is_not_restored_from(tmp_path: Path) -> None:
    # Found by benchmarks/control_plane.py: a cell killed between publishing iteration 16's snapshot
    # and sending its record was resumed at 17, and iteration 16 was never recorded.
    from palomino.runs.checkpoints import write_checkpoint_bytes
    from palomino.wire.control_messages import Assign

    orchestrator, experiment = running_2x2(tmp_path)

    async def published(experiment: Experiment, coord: Coord) -> tuple[bytes, int]:
        return b"snapshot", 17  # iteration 16 done: it resumes at 17

    orchestrator.placement.newest_published = published
    write_checkpoint_bytes(experiment.run.checkpoint_dir(Coord(0, 1)), 10, b"state", {"iteration": 10, "epoch": 0}, 3)
    experiment.recorded = {("0-1", i) for i in range(16)}  # 0 … 15: 16's record was lost with the cell

    async def restored() -> dict:
        await orchestrator.placement.assign(experiment, Coord(0, 1), "w1", restore=True)
        return [m for _, m in orchestrator.control.sent if isinstance(m, Assign)][-1].restore_meta

    assert asyncio.run(restored())["iteration"] == 10  # the checkpoint: 10 … 16 trained and recorded again
    assert experiment.recorded == {("0-1", i) for i in range(10)}
    experiment.recorded = {("0-1", i) for i in range(17)}  # with 16 recorded the snapshot is used
    assert asyncio.run(restored()) == {"from": "snapshot", "iteration": 17}


def test_messages_that_do_not_fit_the_layout_are_dropped_and_counted(tmp_path: Path) -> None:
    from palomino.wire.control_messages import Checkpoint, Metrics, Samples

    orchestrator, experiment = running_2x2(tmp_path)
    forged = [
        Metrics(experiment="race-1", worker="w0", record={"cell": [-1, -1], "iteration": 0}),
        Metrics(experiment="race-1", worker="w0", record={"cell": [0, 0], "iteration": 10**9}),
        Metrics(experiment="race-1", worker="w0", record={"iteration": 0}),
        Samples(experiment="race-1", worker="w0", coord=(5000, 5000), iteration=1),
        Samples(experiment="race-1", worker="intruder", coord=(0, 0), iteration=0, real=True),
        Checkpoint(experiment="race-1", worker="w0", coord=(-1, -1), iteration=1, meta={}),
        Checkpoint(experiment="race-1", worker="w1", coord=(0, 0), iteration=1, meta={}),  # w1 does not hold 0-0
    ]

    async def go() -> None:
        for message in forged:
            await orchestrator.on_control(message, b"\x89PNG")
        await orchestrator.on_control(
            Metrics(experiment="race-1", worker="w0", record={"cell": [0, 0], "iteration": 0}), b""
        )

    asyncio.run(go())
    assert orchestrator.counters["untrusted_messages"] == len(forged)
    assert [r["cell"] for r in experiment.run.metrics()] == [[0, 0]]
    assert not (experiment.run.path / "checkpoints").exists() and not experiment.run.real_samples_path.exists()


def test_an_experiment_is_reloaded_from_what_it_saved(tmp_path: Path) -> None:
    import json

    from palomino.grid.partition import partition_grid
    from palomino.runs.result import CellResult
    from palomino.services.orchestrator.experiment_store import read_states, write_collected

    _orchestrator, experiment = running_2x2(tmp_path)
    experiment.partition = partition_grid([0, 1], (1, 2))
    experiment.failures.append({"worker": "w9", "cell": "1-1", "action": "replace", "by": "w3", "at": 1.0})
    experiment.history_since[Coord(1, 1)] = 1
    experiment.done[Coord(0, 1)] = CellResult(
        "0-1", 0.25, ["0-1", "0-0"], [0.5, 0.5], b"mixture", {"cell": "0-1"}, b"png", trained_at="0-1"
    )
    write_collected(experiment.run.path, experiment.done[Coord(0, 1)])
    experiment.run.append_metrics({"cell": [0, 1], "iteration": 0})
    experiment.persist()

    [(run_dir, saved)] = list(read_states(tmp_path))
    again = Experiment.from_saved(run_dir, json.loads(json.dumps(saved)))
    assert (again.id, again.state, again.cells, again.failures) == (
        run_dir.name,
        "running",
        experiment.cells,
        experiment.failures,
    )
    assert again.topology == experiment.topology and again.partition == experiment.partition
    assert again.history_since == {Coord(1, 1): 1} and again.recorded == {("0-1", 0)}
    done = again.done[Coord(0, 1)]
    assert (done.score, done.payload, done.samples_png, done.trained_at) == (0.25, b"mixture", b"png", "0-1")


def test_one_register_announces_every_idle_slot_of_a_process(tmp_path: Path) -> None:
    from palomino.wire.control_messages import Register

    orchestrator, _ = running_2x2(tmp_path)
    register = Register(worker="n/0", slots=["n/1", "n/2", "n/0"], host="h", pid=7, block="n")
    asyncio.run(orchestrator.on_control(register, b""))
    slots = {w: orchestrator.workers[w] for w in ("n/0", "n/1", "n/2")}
    assert all(w.idle and w.block == "n" and w.host == "h" for w in slots.values())
    assert len(orchestrator.workers) == 4 + 3  # the layout's four, and each slot once


def test_an_ended_experiment_keeps_which_cells_finished_but_not_their_bytes(tmp_path: Path) -> None:
    """A finished experiment stays listed for the retention (a week): its cells' mixtures and
    pictures are on disk by then, and the orchestrator must not hold them too — nor read them
    back when it restarts."""
    import json

    from palomino.services.orchestrator.experiment_store import read_states

    orchestrator, experiment = running_2x2(tmp_path)
    mixtures = {coord: f"mixture of {coord}".encode() * 1000 for coord in experiment.cells}

    async def finish() -> None:
        for coord, worker in list(experiment.cells.items()):
            await orchestrator.results.on_done(experiment, done(worker, tuple(coord)), mixtures[coord])

    asyncio.run(finish())
    assert experiment.state == "finished" and set(experiment.done) == set(experiment.cells)
    assert all(r.payload == b"" and r.samples_png == b"" for r in experiment.done.values())
    for coord, mixture in mixtures.items():  # on disk, as they arrived
        assert (experiment.run.path / "collected" / str(coord) / "mixture.safetensors").read_bytes() == mixture
    assert (experiment.run.result_dir / "mixture.safetensors").read_bytes() in mixtures.values()

    [(run_dir, saved)] = list(read_states(tmp_path))
    again = Experiment.from_saved(run_dir, json.loads(json.dumps(saved)))
    assert again.state == "finished" and set(again.done) == set(experiment.cells)
    assert all(r.payload == b"" and r.score == 0.1 for r in again.done.values())

    # A running one keeps them: a relayout or a restart may still need them to write result/.
    orchestrator, running = running_2x2(tmp_path / "running")
    asyncio.run(orchestrator.results.on_done(running, done("w0", (0, 0)), b"mixture"))
    assert running.done[Coord(0, 0)].payload == b"mixture"


def test_a_stopped_experiment_lets_go_of_its_results_bytes(tmp_path: Path) -> None:
    orchestrator, experiment = running_2x2(tmp_path)
    asyncio.run(orchestrator.results.on_done(experiment, done("w0", (0, 0)), b"mixture"))
    asyncio.run(orchestrator.placement.end(experiment, "stopped", "deleted by its owner"))
    assert experiment.done[Coord(0, 0)].payload == b""


def test_a_worker_that_cannot_reach_the_broker_is_replaced_not_the_experiment_failed(tmp_path: Path) -> None:
    """Issue 52: a cell whose snapshot bus cannot connect (a connect storm) says so (Failed,
    transient): handled as that worker's death, replaced by a spare, or the grid shrunk."""
    from palomino.services.orchestrator.experiment import Worker
    from palomino.wire.control_messages import Assign, Failed

    orchestrator, experiment = running_2x2(tmp_path)

    async def nothing_published(experiment: Experiment, coord: Coord) -> None:
        return None  # no snapshot to hand over without a broker: from scratch

    orchestrator.placement.newest_published = nothing_published
    orchestrator.workers["w9"] = Worker("w9")
    orchestrator.shared.alive = {"w0", "w1", "w2", "w3", "w9"}
    cut_off = Failed(experiment=experiment.id, worker="w1", reason="w1: cannot connect to RabbitMQ", transient=True)
    asyncio.run(orchestrator.on_control(cut_off, b""))
    assert experiment.state == "running" and experiment.cells[Coord(0, 1)] == "w9"
    assert experiment.failures[-1]["action"] == "replace" and experiment.failures[-1]["worker"] == "w1"
    assert any(address == "cell.w9" and isinstance(m, Assign) for address, m in orchestrator.control.sent)

    no_spare = Failed(experiment=experiment.id, worker="w2", reason="w2: cannot connect to RabbitMQ", transient=True)
    asyncio.run(orchestrator.on_control(no_spare, b""))
    assert experiment.state == "running" and "w2" not in experiment.cells.values()  # shrunk

    fatal = Failed(experiment=experiment.id, worker="w0", reason="w0: the data is missing")
    asyncio.run(orchestrator.on_control(fatal, b""))
    assert experiment.state == "failed" and "the data is missing" in experiment.reason


def test_a_stale_owner_writing_for_cells_handed_over_is_told_to_stop_once(tmp_path: Path) -> None:
    """Issue 50: w1 froze past its TTL and a spare took its cell; awake again, it sends metrics for
    the cell. They are refused (not its cell) and it is told, once, to stop that experiment; a
    holder's out-of-range record is refused without a Stop."""
    from palomino.services.orchestrator.experiment import Worker
    from palomino.wire.control_messages import Metrics, Stop

    orchestrator, experiment = running_2x2(tmp_path)

    async def nothing_published(experiment: Experiment, coord: Coord) -> None:
        return None

    orchestrator.placement.newest_published = nothing_published
    orchestrator.workers["w9"] = Worker("w9")
    orchestrator.shared.alive = {"w0", "w2", "w3", "w9"}
    asyncio.run(orchestrator.recovery.handle_dead(experiment, {Coord(0, 1): "w1"}, "heartbeat expired"))
    assert experiment.cells[Coord(0, 1)] == "w9"

    def stops() -> list[str]:
        return [address for address, m in orchestrator.control.sent if isinstance(m, Stop)]

    for iteration in (3, 4):  # the zombie's next two iterations
        record = {"cell": [0, 1], "iteration": iteration, "epoch": 0}
        asyncio.run(orchestrator.on_control(Metrics(experiment=experiment.id, worker="w1", record=record), b""))
    assert stops() == ["cell.w1"] and orchestrator.counters["stale_owners_stopped"] == 1
    late = {"cell": [0, 0], "iteration": 10_000, "epoch": 1}
    asyncio.run(orchestrator.on_control(Metrics(experiment=experiment.id, worker="w0", record=late), b""))
    assert stops() == ["cell.w1"] and orchestrator.counters["untrusted_messages"] == 3


def test_bounded_calls_all_run_to_their_end_when_one_fails() -> None:
    """A failed send among many (a Stop to one worker) once left the others never started, and the
    experiment's end half done."""
    from palomino.services.orchestrator.placement import bounded

    finished: list[int] = []

    async def call(i: int) -> int:
        await asyncio.sleep(0.01 * (i % 3))
        if i == 2:
            raise TransportError("the broker refused it")
        finished.append(i)
        return i

    with pytest.raises(TransportError, match="refused"):
        asyncio.run(bounded((call(i) for i in range(40)), limit=4))
    assert sorted(finished) == [i for i in range(40) if i != 2]
