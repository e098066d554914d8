"""A tile's batch compiled (config `compile`, palomino/coevolution/tile_compiled.py): the same
numbers as the eager tile to float rounding (float64 here), one compilation a function for the
run — no graph break (fullgraph), no recompilation after the first iteration — and the
`compile` and `precision` settings checked at the boundary.

Compiling costs seconds a function on this machine's two cores, so the cases are the ones that
take different compiled paths: one loss, WGAN-GP (its penalty's input gradient by torch.func),
the Mustangs' mixture (weight tables, WGAN-GP's among them), population 2 with masks, skipped steps and gathered opponents, and a
conditional perceptron with minibatch std.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import merge, palomino, tiny, write_yaml
from tile_cases import CASES as TILE_CASES
from tile_cases import (
    CONV_CASES,
    assert_same_cells,
    assert_same_reports,
    conv_config,
    images64,
    make_cells,
    neighbourhoods,
    ring64,
)

from palomino.coevolution.tile import Tile, use_compile
from palomino.coevolution.tile_data import TileData
from palomino.config import load_config, parse_config

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.yaml"))

# The tile's cases (tests/tile_cases.py) that take different compiled paths.
COMPILED_PATHS = {
    "minimax-default",
    "wgan-gp",
    "mustangs-mixture",
    "population-2-mutated-rates-skip",
    "conditional-minibatch-std",
}
CASES = [case for case in TILE_CASES if case.id in COMPILED_PATHS]
assert len(CASES) == len(COMPILED_PATHS), "a case was renamed in tile_cases.py"


def settings(compiled: str, changes: dict[str, Any]) -> Any:
    base = {
        "compile": compiled,
        "training": {"iterations": 6, "batches_per_iteration": 3, "fitness": {"sample_size": 16}},
    }
    return parse_config(tiny(**merge(base, changes)))


def iterate(tile: Tile, iterations: int, after_first: Any = None) -> list[dict]:
    reports = []
    for iteration in range(iterations):
        reports += [report.to_json() for report in tile.iterate(neighbourhoods(tile.cells))]
        if iteration == 0 and after_first is not None:
            after_first()
    return reports


@pytest.mark.slow
@pytest.mark.parametrize("changes", CASES)
def test_a_compiled_tile_trains_as_the_eager_tile_and_compiles_once(float64: None, changes: dict) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    dataset = ring64()
    eager = make_cells(settings("off", changes), dataset)
    compiled = make_cells(settings("on", changes), dataset)
    expected = iterate(Tile(eager), 4)
    tile, first = Tile(compiled), {}
    # Every function compiles in the first iteration (fullgraph: a graph break raises), none after.
    got = iterate(tile, 4, lambda: first.update(counters["stats"]))
    assert tile.data[0]._batches, "the tile trained through its compiled steps"
    assert first["unique_graphs"] == 4  # G, D, Adam a role
    assert counters["stats"] == first, "recompiled after the first iteration"
    assert not counters["graph_break"]
    assert_same_reports(expected, got)
    assert_same_cells(eager, compiled)


@pytest.mark.slow
@pytest.mark.parametrize("changes", CONV_CASES)
def test_a_compiled_convolutional_tile_trains_as_the_eager_tile_buffers_included(float64: None, changes: dict) -> None:
    """DCGAN's BatchNorm and SNGAN's power iterations advance from fixed-shape tables in a
    compiled step (stacked_buffers.BufferTurns): the same numbers as the eager tile, running
    statistics and u, v included, and no recompilation after the first iteration."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager_cfg, compiled_cfg = conv_config(changes, compile="off"), conv_config(changes, compile="on")
    dataset = images64(labelled=eager_cfg.network.conditional)
    eager, compiled = make_cells(eager_cfg, dataset), make_cells(compiled_cfg, dataset)
    expected = iterate(Tile(eager), 3)
    tile, first = Tile(compiled), {}
    got = iterate(tile, 3, lambda: first.update(counters["stats"]))
    assert tile.data[0]._batches, "the tile trained through its compiled steps"
    assert counters["stats"] == first, "recompiled after the first iteration"
    assert not counters["graph_break"]
    assert_same_reports(expected, got)
    assert_same_cells(eager, compiled)
    assert any("running_var" in key or "_v" in key for key in compiled[0].state()[0])


def test_compile_auto_leaves_convolutional_stacks_eager() -> None:
    """auto compiles the perceptrons' stacks on a GPU; convolutional ones only when asked (on, graphs)."""
    from palomino.coevolution.tile_compiled import compilable
    from palomino.nn import build_discriminator, build_generator
    from palomino.nn.stack_layout import layout_of

    def layouts(spec: Any, shape: tuple[int, ...], kind: str) -> tuple[Any, Any]:
        return layout_of(build_generator(spec, shape, kind)), layout_of(build_discriminator(spec, shape, kind))

    dcgan = layouts(conv_config({"network": {"name": "dcgan"}}).network, (1, 28, 28), "image")
    assert not compilable(*dcgan, asked=False) and compilable(*dcgan, asked=True)
    assert compilable(*layouts(parse_config(tiny()).network, (2,), "points"), asked=False)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_compiles_in_its_first_iteration_only(
    example: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each example as `palomino train` runs it, tiled and compiled, 20 short iterations: every
    compilation happens in the first (on this CPU a tile is two stacks, each compiled), none after.
    The convolutional examples' networks are narrowed (width 8): what compiles is the same."""
    from torch._dynamo.utils import counters

    from palomino.data import load_dataset
    from palomino.engine.embedded import train_embedded
    from palomino.runs import RunDirectory

    cfg = load_config(example)
    if cfg.data.name == "mnist":
        request.getfixturevalue("mnist_dir")  # skips without MNIST (fails under CI)
    if cfg.data.name == "fashion_mnist":
        request.getfixturevalue("fashion_mnist_dir")
    shrink = [
        "tiles=on",
        "compile=on",
        "training.iterations=21",  # stopped after 20: the run's final ensemble is not what this checks
        "training.batches_per_iteration=2",
        "training.fitness.sample_size=64",
        "training.mixture.score_samples=64",
        "training.checkpoint_every=0",
        "training.sample_every=0",
        *(["data.split=test"] if cfg.data.name == "mnist" else []),
        *(["network.width=8"] if cfg.network.name != "mlp" else []),
    ]
    cfg = load_config(example, shrink)
    torch._dynamo.reset()
    counters.clear()
    first: dict[str, int] = {}
    stop, reported = asyncio.Event(), set()

    def on_metrics(record: dict) -> None:
        if not first:  # the first record: the first iteration is done
            first.update(counters["stats"])
        if record["iteration"] >= 20:
            reported.add(str(record["cell"]))
            if len(reported) == cfg.cells:
                stop.set()

    run = RunDirectory.create(tmp_path, cfg)
    dataset = load_dataset(cfg.data, cfg.seed)
    asyncio.run(train_embedded(cfg, run, dataset, stop=stop, on_metrics=on_metrics))
    assert len(reported) == cfg.cells, "every cell trained 20 iterations"
    assert first["unique_graphs"] >= 3, first
    assert counters["stats"] == first, "recompiled after the first iteration"
    assert not counters["graph_break"]


def test_compile_auto_is_on_a_gpu_only_and_on_off_are_obeyed() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not use_compile(parse_config(tiny()), cpu)
    assert use_compile(parse_config(tiny()), cuda)
    assert use_compile(parse_config(tiny(compile="on")), cpu)
    assert not use_compile(parse_config(tiny(compile="off")), cuda)
    assert parse_config(tiny(compile=True)).compile == "on"  # YAML 1.1's bare on


def test_compile_auto_trains_eager_where_compiling_fails_and_on_stops(caplog: pytest.LogCaptureFixture) -> None:
    from palomino.coevolution.tile_compiled import _compiler

    def breaks(x: torch.Tensor) -> torch.Tensor:  # a graph break: fullgraph cannot compile it
        torch._dynamo.graph_break()
        return x + 1

    torch._dynamo.reset()
    with caplog.at_level("WARNING"):
        assert _compiler(strict=False)(breaks)(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert "could not compile breaks, which trains eager" in caplog.text
    with pytest.raises(Exception, match="graph_break|graph break"):
        _compiler(strict=True)(breaks)(torch.zeros(2))


@pytest.mark.slow
def test_compile_graphs_marks_each_step_and_keeps_copies_of_its_losses(
    float64: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`compile: graphs`' own path (torch.compile's reduce-overhead mode, a new CUDA graph step
    marked each batch, the kept losses copied). On this CPU torch records no graph, so this checks
    the path's numbers and bookkeeping; the graphs themselves are benchmarks/gpu.sh's to time."""
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    torch._dynamo.reset()
    dataset, changes = ring64(), {"training": {"population_size": 2}}
    eager = make_cells(settings("off", changes), dataset)
    graphed = make_cells(settings("on", changes), dataset)
    expected = iterate(Tile(eager), 2)
    tile = Tile(graphed)
    tile.data = [TileData(compiled=True, strict=True, graphs=True)]
    got = iterate(tile, 2)
    assert all(batch.graphs for batch in tile.data[0]._batches.values())
    assert len(marks) == 2 * 3, "one mark a batch, three batches an iteration"
    assert_same_reports(expected, got)
    assert_same_cells(eager, graphed)
    assert not use_compile(parse_config(tiny(compile="off")), torch.device("cuda"))
    assert use_compile(parse_config(tiny(compile="graphs", device="cuda")), torch.device("cuda"))


def test_an_eager_tile_builds_nothing_compiled() -> None:
    cells = make_cells(settings("off", {}), ring64())
    tile = Tile(cells)
    iterate(tile, 1)
    assert all(not data.compiled and not data._batches for data in tile.data)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"compile": "sometimes"}, "compile"),
        ({"precision": "fp8"}, "precision"),
        ({"precision": "tf32"}, "precision"),  # on device cpu
        ({"compile": "graphs"}, "compile"),  # CUDA graphs, on device cpu
    ],
)
def test_train_with_a_bad_compile_or_precision_exits_2_naming_it(tmp_path, changes: dict, field: str) -> None:
    result = palomino("train", str(write_yaml(tmp_path / "bad.yaml", tiny(**changes))), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert field in result.stderr


def test_bf16_trains_a_tile_and_a_cell_under_autocast_with_float32_weights() -> None:
    for tiles in ("on", "off"):
        trained = {}
        for precision in ("float32", "bf16"):
            cfg = parse_config(
                tiny(precision=precision, tiles=tiles, training={"iterations": 2, "batches_per_iteration": 2})
            )
            cells = make_cells(cfg, ring64())
            if tiles == "on":
                Tile(cells).iterate(neighbourhoods(cells))
            else:
                cells[0].iterate(neighbourhoods(cells)[cells[0].coord])
            trained[precision] = dict(cells[0].generators.best.network.named_parameters())
        weights = trained["bf16"]
        assert all(w.dtype == torch.float32 and torch.isfinite(w).all() for w in weights.values())
        # The same seed and draws: only the products' rounding differs, and it shows.
        assert any(not torch.equal(w, trained["float32"][name]) for name, w in weights.items()), tiles
