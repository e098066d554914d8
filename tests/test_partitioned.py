"""Class-partitioned training (data.partition: labels): the configuration, one sub-grid per
class, class-filtered data and priors, the class mixture, and a 3-class run end to end
through the real command line on MNIST's test split (the `mnist_dir` fixture)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import last_line, palomino, tiny, write_yaml
from helpers import mnist_classifier

from palomino.coevolution import Cell
from palomino.config import dump_config, load_config, parse_config
from palomino.config.models import LABEL_COUNTS
from palomino.data import class_counts, class_subset, label_count, load_dataset, select_classes
from palomino.errors import ConfigError, DatasetError, PalominoError
from palomino.grid import Coord, Topology, class_grid_at, class_rectangle, partition_grid
from palomino.nn.mlp import MLPDiscriminator
from palomino.runs import Mixture, RunDirectory
from palomino.runs.mixture import ClassMixture
from palomino.runs.result import CellResult, write_class_result, write_result


def partitioned(**changes) -> dict:
    raw = tiny(data={"name": "gaussian_ring", "size": 800, "partition": "labels", "classes": [0, 3, 5]}, **changes)
    raw.pop("grid")  # the grid of a partitioned run is classes × grid.per_class
    raw["grid"] = changes.get("grid", {"per_class": "1x2"})
    return raw


# --- configuration ------------------------------------------------------------------------------


def test_partitioned_grid_is_classes_times_per_class() -> None:
    config = parse_config(partitioned(grid={"per_class": "2×3", "neighbourhood": "moore"}))
    assert config.grid.per_class == "2x3" and config.grid.per_class_shape == (2, 3)
    assert (config.grid.rows, config.grid.cols, config.cells) == (6, 3, 18)
    assert config.cell_bounds == (18, 18)
    again = parse_config(__import__("yaml").safe_load(dump_config(config)))  # what --resume reads
    assert again == config
    every = parse_config({"data": {"name": "fashion_mnist", "partition": "labels"}})
    assert every.data.labels == tuple(range(10)) and every.cells == 10  # default 1×1 per class
    assert parse_config({}).grid.per_class == "1x1" and not parse_config({}).partitioned


@pytest.mark.parametrize(
    "raw,field",
    [
        ({"grid": {"per_class": "2by2"}}, "grid.per_class"),
        ({"grid": {"per_class": "0x2"}}, "grid.per_class"),
        ({"data": {"name": "mnist", "classes": [1, 10]}}, "data.classes: mnist has labels 0–9"),
        ({"data": {"classes": [1, 1]}}, "each label at most once"),
        ({"data": {"classes": []}}, "data.classes"),
        ({"data": {"name": "image_folder", "partition": "labels"}}, "needs the labels listed"),
        ({"data": {"partition": "classes"}}, "data.partition"),
        (
            {"data": {"name": "mnist", "partition": "labels"}, "grid": {"rows": 3}},
            "grid.rows: a partitioned run's grid is",
        ),
        ({"data": {"name": "mnist", "partition": "labels"}, "network": {"conditional": True}}, "network.conditional"),
    ],
)
def test_bad_partition_settings_name_the_field(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace("(", r"\(")):
        parse_config(raw)


def test_a_bad_partition_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "bad.yaml", partitioned(grid={"per_class": "2x"}))
    result = palomino("train", config, "--out", tmp_path, cwd=tmp_path)
    assert result.returncode == 2
    assert "grid.per_class" in result.stderr and "ROWSxCOLS" in result.stderr


@pytest.mark.parametrize("name", ["gaussian_ring", "gaussian_grid", "mnist", "fashion_mnist"])
def test_label_counts_match_the_datasets(name: str, request: pytest.FixtureRequest) -> None:
    """The torch-free table the orchestrator lays partitions out with agrees with the loaders."""
    directory = request.getfixturevalue(f"{name}_dir") if "mnist" in name else None
    split = "test" if directory else "train"
    dataset = load_dataset(parse_config({"data": {"name": name, "dir": directory, "split": split}}).data)
    assert label_count(dataset) == LABEL_COUNTS[name] == len(class_counts(dataset)), name


# --- sub-grids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("per_class", [(1, 1), (1, 3), (2, 2), (3, 4)])
@pytest.mark.parametrize("kind", ["von_neumann", "moore"])
def test_neighbourhoods_never_cross_classes(per_class: tuple[int, int], kind: str) -> None:
    labels = [9, 2, 4]
    partition = partition_grid(labels, per_class, kind)
    cells = list(partition.cells())
    assert len(cells) == len(set(cells)) == 3 * per_class[0] * per_class[1] == partition.size
    assert partition.labels == (2, 4, 9)  # ascending: class k owns rows k·R … k·R+R−1
    for coord in cells:
        grid = partition.grid_of(coord)
        assert coord[0] // per_class[0] == partition.labels.index(grid.label)
        local = grid.to_local(coord)
        # The same neighbours as a plain torus of the class's shape, moved into its band.
        plain = Topology(*per_class, kind).neighbours(local)
        assert grid.neighbours(coord) == [grid.to_global(c) for c in plain]
        assert all(partition.class_of(n) == grid.label for n in grid.neighbours(coord))
        # What a distributed cell rebuilds from its coordinate alone is the same sub-grid.
        assert class_grid_at(coord, labels, per_class, kind=kind) == grid


def test_class_grid_errors_and_shrinking() -> None:
    partition = partition_grid([0, 1], (2, 2))
    with pytest.raises(ValueError, match="no class's sub-grid"):
        partition.grid_of(Coord(4, 0))
    with pytest.raises(ValueError, match="outside class 0's 2×2 sub-grid"):
        partition.grid_for(0).neighbours(Coord(2, 0))
    with pytest.raises(ValueError, match="at most 2 rows"):
        class_grid_at(Coord(2, 0), [0, 1], (2, 2), shape=(3, 1))
    shrunk = class_grid_at(Coord(2, 2), [0, 1], (2, 2), shape=(1, 3), epoch=4)
    assert shrunk.label == 1 and shrunk.epoch == 4 and shrunk.neighbours(Coord(2, 2)) == [Coord(2, 1), Coord(2, 0)]
    # Survivors of a class re-laid out within its band of rows.
    assert [class_rectangle(n, 2) for n in (1, 2, 3, 4, 5, 7)] == [(1, 1), (1, 2), (1, 3), (2, 2), (1, 5), (1, 7)]
    assert class_rectangle(8, 3) == (2, 4) and class_rectangle(9, 3) == (3, 3)


# --- class-filtered data and priors ---------------------------------------------------------------


def test_classes_select_labels_and_size_counts_them(mnist_dir: Path) -> None:
    config = parse_config(
        {"data": {"name": "mnist", "dir": str(mnist_dir), "split": "test", "classes": [7, 1], "size": 500}}
    )
    dataset = load_dataset(config.data, seed=3)
    assert len(dataset) == 500 and set(class_counts(dataset)) == {1, 7}
    assert label_count(dataset) == 10  # labels keep their meaning: an embedding still has 10 rows
    whole = load_dataset(parse_config({"data": {"name": "mnist", "dir": str(mnist_dir), "split": "test"}}).data)
    assert class_counts(select_classes(whole, [1, 7])) == {1: 1135, 7: 1028}  # the t10k split's counts
    with pytest.raises(DatasetError, match="no label 12"):
        select_classes(whole, [12])
    with pytest.raises(DatasetError, match="label 3 has no samples"):
        select_classes(select_classes(whole, [1]), [1, 3])
    with pytest.raises(DatasetError, match="class 5 has no samples"):
        class_subset(select_classes(whole, [1]), 5)


def test_each_cell_trains_on_its_class_only(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config(partitioned())
    dataset = load_dataset(config.data, config.seed)
    partition = partition_grid(config.data.labels, config.grid.per_class_shape)
    counts = class_counts(dataset)
    seen: list[torch.Tensor] = []
    original = MLPDiscriminator.forward

    def spy(self, x):
        seen.append(x.detach().clone())
        return original(self, x)

    monkeypatch.setattr(MLPDiscriminator, "forward", spy)
    for coord in partition.cells():
        grid = partition.grid_of(coord)
        cell = Cell(coord, grid, config, dataset, experiment="t")
        assert cell.label == grid.label and len(cell.data) == counts[grid.label]
        seen.clear()
        report = cell.iterate({})
        assert report.to_json()["class"] == grid.label
        # Every real sample D judged lies on this class's mode (the ring's modes are 1.5 apart, σ = 0.02).
        mode = dataset.modes[grid.label]
        members = {tuple(x.tolist()) for x in dataset.samples[dataset.labels == grid.label]}
        others = {tuple(x.tolist()) for x in dataset.samples[dataset.labels != grid.label]}
        inputs = [tuple(x.tolist()) for batch in seen for x in batch]
        real = [x for x in inputs if x in members]
        assert len(real) >= 64 and not any(x in others for x in inputs)
        assert max(float(torch.tensor(x).sub(mode).norm()) for x in real) < 0.2


def test_a_partitioned_cell_needs_its_sub_grid() -> None:
    config = parse_config(partitioned())
    dataset = load_dataset(config.data, config.seed)
    with pytest.raises(ValueError, match="needs its class's sub-grid"):
        Cell(Coord(0, 0), Topology(3, 2), config, dataset, experiment="t")
    partition = partition_grid([0, 3, 5], (1, 2))
    cell = Cell(Coord(0, 0), partition.grid_for(0), config, dataset, experiment="t")
    with pytest.raises(ValueError, match="cannot move to class 3"):
        cell.relocate(Coord(1, 0), partition.grid_for(3))
    cell.relocate(Coord(0, 0), partition.grid_for(0).resized(1, 1, epoch=1))  # a shrink within the class
    assert cell.topology.epoch == 1 and cell.topology.neighbours(Coord(0, 0)) == []


# --- the class mixture ----------------------------------------------------------------------------


def constant_part(value: float) -> Mixture:
    """A one-component mixture whose generator always outputs (value, value): a generator with
    zero weights and bias `value`, so each sample shows which class's part drew it."""
    spec = parse_config({"network": {"latent_dim": 2, "hidden": 4}}).network
    from palomino.nn import build_generator

    generator = build_generator(spec, (2,), "points")
    with torch.no_grad():
        for p in generator.parameters():
            p.zero_()
        generator.net[4].bias.fill_(value)
    return Mixture([generator], np.array([1.0]), ["0-0"], spec, (2,), "points", {})


def test_class_mixture_draws_each_sample_from_its_class() -> None:
    mixture = ClassMixture(
        {2: constant_part(2.0), 5: constant_part(5.0), 9: constant_part(9.0)}, {2: 0.5, 5: 0.3, 9: 0.2}, {}
    )
    samples, labels = mixture.sample_labelled(1000, seed=1)
    assert torch.equal(samples[:, 0], labels.float())  # every sample from its label's part
    assert Counter(labels.tolist()) == {2: 500, 5: 300, 9: 200}  # the priors, exactly
    asked = torch.tensor([9, 2, 2, 5])
    assert mixture.sample(4, labels=asked)[:, 0].tolist() == [9.0, 2.0, 2.0, 5.0]
    assert torch.equal(mixture.sample(50, seed=3), mixture.sample(50, seed=3))
    with pytest.raises(PalominoError, match="class 4 was not trained.*\\[2, 5, 9\\]"):
        mixture.sample(3, labels=[4, 4, 4])


def fake_result(cell: str, label: int, count: int, score: float) -> CellResult:
    description = {"weights": [1.0], "components": [cell], "kind": "points", "sample_shape": [2], "network": {},
                   "class": label, "class_count": count, "data": "toy", "experiment": "e", "score_name": "mmd2"}  # fmt: skip
    return CellResult(cell, score, [cell], [1.0], f"tensors of {cell}".encode(), description)


def test_write_class_result_keeps_each_class_best_and_the_priors(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    results = [fake_result("0-0", 4, 300, 0.2), fake_result("0-1", 4, 300, 0.1), fake_result("1-0", 8, 100, 0.5)]
    best = write_result(run, results)  # dispatches on the mixtures' "class" (the orchestrator's call)
    assert best.cell == "0-1"
    description = json.loads((tmp_path / "result" / "mixture.json").read_text())
    assert description["type"] == "class_mixture"
    assert description["classes"]["4"] == {
        "path": "classes/4",
        "prior": 0.75,
        "count": 300,
        "cell": "0-1",
        "score": 0.1,
    }
    assert description["classes"]["8"]["prior"] == 0.25
    assert (tmp_path / "result" / "classes" / "4" / "mixture.safetensors").read_bytes() == b"tensors of 0-1"
    for cell in ("0-0", "0-1", "1-0"):
        assert (
            tmp_path / "result" / "cells" / cell / "mixture.safetensors"
        ).read_bytes() == f"tensors of {cell}".encode()
    ranking = json.loads((tmp_path / "result" / "ranking.json").read_text())["ranking"]
    assert [(r["cell"], r["class"]) for r in ranking] == [("0-1", 4), ("0-0", 4), ("1-0", 8)]
    with pytest.raises(ValueError, match="class 9 has no result"):
        write_class_result(run, results, labels=[4, 8, 9])


# --- end to end: 3 classes of MNIST through the command line ------------------------------------------


@pytest.mark.slow
def test_three_classes_end_to_end(tmp_path: Path, mnist_dir: Path) -> None:
    classes = [0, 1, 7]
    raw = {
        "name": "partitioned", "seed": 2,
        "grid": {"per_class": "1x2"},
        "training": {"iterations": 4, "batch_size": 64, "batches_per_iteration": 10, "losses": ["nonsaturating"],
                     "learning_rate": 0.0005, "fitness": {"sample_size": 64}, "mixture": {"score_samples": 64},
                     "checkpoint_every": 2, "sample_every": 2},
        "data": {"name": "mnist", "dir": str(mnist_dir), "split": "test", "partition": "labels", "classes": classes},
        "network": {"name": "mlp", "hidden": 64, "latent_dim": 16},
    }  # fmt: skip
    config = write_yaml(tmp_path / "partitioned.yaml", raw)
    first = palomino("train", config, "--out", tmp_path / "runs", "--set", "training.iterations=2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run = Path(last_line(first.stdout))
    # Continue to 4 iterations from the checkpoints at 2: a partitioned run resumes like any other.
    result = palomino("train", "--resume", run, "--set", "training.iterations=4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "class mixture of 3 classes" in result.stderr

    # Layout: class k's 1×2 sub-grid is row k; every record names its class; neighbours stay inside it.
    topology = json.loads((run / "topology.jsonl").read_text().splitlines()[0])
    assert (topology["rows"], topology["cols"]) == (3, 2)
    assert topology["classes"] == {str(c): {"rows": 1, "cols": 2, "row_offset": k} for k, c in enumerate(classes)}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert Counter((tuple(r["cell"]), r["iteration"]) for r in records) == {
        ((k, c), i): 1 for k in range(3) for c in range(2) for i in range(4)
    }
    for record in records:
        row = record["cell"][0]
        assert record["class"] == classes[row]
        assert all(key.startswith(f"{row}-") for key in [*record["neighbours"], *record["mixture"]])
    assert load_config(run / "config.yaml").cells == 6

    # The class mixture: priors are the classes' shares of the training data (from the IDX file itself).
    labels_file = next(
        mnist_dir / n for n in ("t10k-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte") if (mnist_dir / n).is_file()
    )
    body = labels_file.read_bytes()
    raw_labels = np.frombuffer(gzip.decompress(body) if labels_file.suffix == ".gz" else body, np.uint8, offset=8)
    counts = {c: int((raw_labels == c).sum()) for c in classes}
    description = json.loads((run / "result" / "mixture.json").read_text())
    for c in classes:
        entry = description["classes"][str(c)]
        assert entry["count"] == counts[c]
        assert entry["prior"] == pytest.approx(counts[c] / sum(counts.values()))
        assert entry["cell"].startswith(f"{classes.index(c)}-")
        assert (run / "result" / "classes" / str(c) / "mixture.safetensors").is_file()
    assert (run / "result" / "samples.png").read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in (run / "result" / "cells").iterdir()) == ["0-0", "0-1", "1-0", "1-1", "2-0", "2-1"]

    # Unconditioned sampling follows the priors.
    mixture = Mixture.load(run / "result")
    assert isinstance(mixture, ClassMixture)
    _, labels = mixture.sample_labelled(3000, seed=5)
    for c in classes:
        assert abs(int((labels == c).sum()) - 3000 * counts[c] / sum(counts.values())) < 1

    # A draw of class c is classified as c by a classifier trained on MNIST (`palomino sample --class 7`).
    whole = load_dataset(parse_config({"data": {"name": "mnist", "dir": str(mnist_dir), "split": "test"}}).data)
    classifier, _ = mnist_classifier(whole)
    out = tmp_path / "class-7.npy"
    drawn = palomino("sample", run, "--n", "200", "--class", "7", "--out", out, cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    by_class = {7: torch.from_numpy(np.load(out, allow_pickle=False))}
    by_class.update({c: mixture.sample(200, seed=c, labels=[c] * 200) for c in (0, 1)})
    for c, pixels in by_class.items():
        with torch.no_grad():  # data space [0, 1] → the classifier's [−1, 1]
            hits = float((classifier(pixels.mul(2).sub(1).flatten(1)).argmax(1) == c).float().mean())
        assert hits > 0.6, f"class {c}: {hits:.0%} of its draws classified as {c}"
    refused = palomino("sample", run, "--n", "4", "--class", "3", "--out", tmp_path / "x.npy", cwd=tmp_path)
    assert refused.returncode == 2
    assert "--class 3" in refused.stderr and "[0, 1, 7]" in refused.stderr


def test_a_partition_survives_its_json_round_trip() -> None:
    # What a restarted orchestrator rebuilds a partitioned experiment's layout from.
    from palomino.grid.partition import Partition

    partition = partition_grid([3, 5, 8], (2, 2), "moore")
    shrunk = Partition(
        (partition.grids[0], partition.grids[1].resized(1, 2, epoch=3), partition.grids[2]), partition.per_class
    )
    again = Partition.from_json(json.loads(json.dumps(shrunk.to_json())))
    assert again == shrunk and again.describe() == shrunk.describe() and list(again.cells()) == list(shrunk.cells())
