"""Every host–device transfer of the iteration goes through palomino.nn.host, and is counted.

On a GPU a read-back waits for every queued kernel; benchmarks/tiles.py --count-ops counts those
waits on a CPU through the helpers, so a transfer written any other way would go unseen.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from conftest import benchmark_module

from palomino.nn import host

ROOT = Path(__file__).resolve().parents[1]
# What an iteration runs: the cell, its tile, its networks and their stacked forms.
ITERATION_CODE = [
    *sorted((ROOT / "palomino" / "coevolution").glob("*.py")),
    *sorted((ROOT / "palomino" / "nn").glob("*.py")),
]
# (.numpy() of a device tensor fails loudly; torch.tensor(…, device=) copies from pageable memory and waits)
TRANSFER = re.compile(r"\.cpu\(\)|non_blocking|torch\.(as_)?tensor\(.*device=")


def test_the_iterations_code_moves_tensors_only_through_the_helpers() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in ITERATION_CODE
        if path.name != "host.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if TRANSFER.search(line) and not line.lstrip().startswith("#")
    ]
    assert not offenders, "transfers outside palomino.nn.host (route them through it):\n" + "\n".join(offenders)


def test_counting_tallies_reads_and_uploads_in_its_context_only() -> None:
    device = torch.device("cpu")
    host.to_host(torch.ones(3))  # outside: not counted, no error
    with host.counting() as traffic:
        host.to_host(torch.ones(3))
        assert host.values(torch.arange(3)) == [0, 1, 2]
        assert host.scalar(torch.tensor(2.5)) == 2.5
        on_device = host.upload([1, 2], device, torch.long)
    assert (traffic.reads, traffic.uploads) == (3, 1)
    assert on_device.dtype == torch.long and on_device.tolist() == [1, 2]
    with host.counting() as again:
        pass
    assert again.reads == 0


def test_count_ops_counts_each_phase_and_the_syncs_of_a_tile(tmp_path: Path) -> None:
    tiles = benchmark_module("tiles")
    out = tmp_path / "counts.json"
    assert (
        tiles.main(["--count-ops", "--model", "ring", "--cells", "1", "4", "--batches", "3", "--json", str(out)]) == 0
    )
    rows = {row["cells"]: row for row in json.loads(out.read_text())["rows"]}
    for row in rows.values():
        assert all(row["ops"][phase] > 0 for phase in ("select", "train", "complete")), row
        # A perceptron's snapshot is copied only where it is read: the tile reads its neighbours in place.
        assert row["ops"]["exchange"] == 0, row
        assert row["ops_total"] == sum(row["ops"].values())
        # A tile reads its fitness, re-evaluation, mixtures, losses and step counts back a few
        # times an iteration, however many cells it holds.
        assert row["syncs_total"] <= 10, row
    assert rows[4]["syncs"] == rows[1]["syncs"]
    # A tile's selection copies nothing a cell (its stack is the copy): with clones it was ~300 ops a cell.
    assert rows[4]["ops"]["select"] / 4 < 60, rows[4]["ops"]
    # Four cells dispatch more than one, and the training's per-batch work is counted per batch.
    assert rows[4]["ops"]["train"] > rows[1]["ops"]["train"]
