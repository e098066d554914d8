"""Tiles: many cells trained in lockstep with stacked weights compute what the cells compute one by one.

Equality is checked in float64, where the only differences are the order of float operations:
the stacked forward against each module, one tiled iteration against the cells' own
iterations (every loss, Mustangs' mixture, several rates per member, conditional networks),
resuming a tiled checkpoint untiled and back, and `palomino train` with tiles on and off.
"""

from __future__ import annotations

import copy
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import benchmark_module, float32_dataset, palomino, tiny, write_yaml
from tile_cases import (
    CASES,
    CONV_CASES,
    assert_same_cells,
    assert_same_reports,
    config,
    conv_config,
    images64,
    make_cells,
    neighbourhoods,
    ring64,
)

from palomino.coevolution import Cell
from palomino.coevolution.tile import CPU_TILE_PARAMETERS, Tile, use_tile
from palomino.config import parse_config
from palomino.data import Dataset, load_dataset
from palomino.nn import build_discriminator, build_generator
from palomino.nn.stack_layout import layout_of, tileable
from palomino.nn.stacked import StackedMLP, gather, stack, stack_buffers, stackable, unstack
from palomino.nn.stacked_adam import StackedAdam
from palomino.nn.stacked_buffers import BufferTurns, BufferUse, Turns, turn_tables
from palomino.nn.stacked_conv import StackedConv


def one_by_one(cells: list[Cell], iterations: int) -> list[dict]:
    reports = []
    for _ in range(iterations):
        seen = neighbourhoods(cells)
        reports += [cell.iterate(seen[cell.coord]).to_json() for cell in cells]
    return reports


def tiled(cells: list[Cell], iterations: int, batched: bool | None = None) -> list[dict]:
    tile, reports = Tile(cells, batched=batched), []
    for _ in range(iterations):
        reports += [report.to_json() for report in tile.iterate(neighbourhoods(cells))]
    return reports


# ---- the stacked networks ------------------------------------------------------------------------

NETWORKS = [
    pytest.param({}, id="mlp"),
    pytest.param({"activation": "tanh", "minibatch_std": True}, id="tanh-minibatch-std"),
    pytest.param({"activation": "relu", "conditional": True, "label_dim": 4}, id="relu-conditional"),
    pytest.param({"conditional": True, "minibatch_std": True}, id="conditional-minibatch-std"),
]


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("kind", ["points", "image"])
def test_stacked_forward_matches_each_member(float64: None, network: dict, kind: str) -> None:
    spec = config(network={"name": "mlp", "hidden": 16, "latent_dim": 8, **network}).network
    shape = (2,) if kind == "points" else (1, 6, 6)
    labels = 3 if spec.conditional else None
    for build in (build_generator, build_discriminator):
        members = []
        for seed in range(3):
            torch.manual_seed(seed)
            members.append(build(spec, shape, kind, labels))
        layout = StackedMLP.of(members[0])
        params = stack(members, layout.names)
        x = torch.randn(3, 5, 8) if build is build_generator else torch.randn(3, 5, *shape)
        y = torch.randint(0, 3, (3, 5)) if labels else None
        out = layout.forward(params, x, y)
        for m, module in enumerate(members):
            alone = module(x[m]) if y is None else module(x[m], y[m])
            assert torch.allclose(out[m], alone, rtol=1e-12, atol=1e-12), (build.__name__, m)


def test_unstack_writes_each_members_weights_back(float64: None) -> None:
    spec = config().network
    members = [build_generator(spec, (2,), "points") for _ in range(2)]
    layout = StackedMLP.of(members[0])
    params = stack(members, layout.names)
    with torch.no_grad():
        for value in params.values():
            value[1] += 1.0
    before = [p.clone() for p in members[0].parameters()]
    unstack(params, members)
    assert all(torch.equal(a, b) for a, b in zip(before, members[0].parameters()))
    assert torch.allclose(params["net.0.weight"][1], members[1].net[0].weight)


CONV_NETWORKS = [
    pytest.param({"name": "dcgan"}, (1, 28, 28), id="dcgan-28"),
    pytest.param({"name": "sngan"}, (1, 28, 28), id="sngan-28"),
    pytest.param({"name": "dcgan", "conditional": True, "label_dim": 4}, (3, 32, 32), id="conditional-dcgan-32"),
    pytest.param({"name": "sngan", "conditional": True, "label_dim": 4}, (1, 28, 28), id="conditional-sngan-28"),
]


@pytest.mark.parametrize("tables", [False, True], ids=["eager-rounds", "fixed-turns"])
@pytest.mark.parametrize(("network", "shape"), CONV_NETWORKS)
def test_stacked_convolutions_match_each_member_buffers_included(
    float64: None, network: dict, shape: tuple, tables: bool
) -> None:
    """Slots may repeat a member (two generators facing one critic) or be inactive: each active
    slot computes what its member's module computes at that point, and the members' running
    statistics and power iterations advance once per active slot, in slot order. Both forms of
    the bookkeeping: the eager rounds, and the compiled steps' tables of one shape (3 rounds
    for a member run twice: a spare round changes nothing)."""
    spec = config(network={"width": 4, "latent_dim": 8, **network}).network
    labels = 3 if spec.conditional else None
    for build in (build_generator, build_discriminator):
        members = []
        for seed in range(3):
            torch.manual_seed(seed)
            members.append(build(spec, shape, "image", labels))
        twins = copy.deepcopy(members)
        layout = layout_of(members[0])
        assert isinstance(layout, StackedConv) and tileable(members[0]) and not stackable(members[0])
        params, buffers = stack(members, layout.names), stack_buffers(members, layout.buffer_names)
        slots, active = [0, 2, 2, 1, 2], [True, True, True, False, True]
        x = torch.randn(len(slots), 5, 8) if build is build_generator else torch.randn(len(slots), 5, *shape)
        y = torch.randint(0, 3, (len(slots), 5)) if labels else None
        if tables:
            use = BufferTurns(buffers, Turns(*map(torch.from_numpy, turn_tables(slots, active, 3, rounds=3))))
        else:
            use = BufferUse(buffers, slots, active)
        out = layout.forward(gather(params, torch.tensor(slots)), x, y, use)
        for name, value in use.buffers.items():  # the tables' form replaces its own entries
            buffers[name].copy_(value)
        for slot, (member, on) in enumerate(zip(slots, active)):
            if on:  # the twins run in slot order, as cells do one by one
                twin = twins[member]
                alone = twin(x[slot]) if y is None else twin(x[slot], y[slot])
                assert torch.allclose(out[slot], alone, rtol=1e-10, atol=1e-12), (build.__name__, slot)
        unstack(params, members, buffers)
        for module, twin in zip(members, twins):
            state, expected = module.state_dict(), twin.state_dict()
            assert state.keys() == expected.keys()
            for key in state:
                assert torch.allclose(state[key].double(), expected[key].double(), atol=1e-12), (build.__name__, key)
        assert any("running_mean" in n or "_u" in n for n in layout.buffer_names)


def test_a_network_without_a_stacked_form_is_named() -> None:
    with pytest.raises(TypeError, match="Linear has no stacked form"):
        layout_of(torch.nn.Linear(2, 2))


def test_stacked_adam_matches_torch_adam_per_member(float64: None) -> None:
    """Members at different step counts (one fresh), each with its own rate, some inactive."""
    spec = config().network
    members = [build_discriminator(spec, (2,), "points") for _ in range(3)]
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-3, betas=(0.5, 0.999)) for m in members]
    for steps, (module, optimizer) in zip((2, 0, 5), zip(members, optimizers)):
        for _ in range(steps):
            optimizer.zero_grad()
            module(torch.randn(4, 2)).square().mean().backward()
            optimizer.step()
    reference = [(m, o) for m, o in zip(members, optimizers)]
    copies = []
    for module, optimizer in reference:
        twin = build_discriminator(spec, (2,), "points")
        twin.load_state_dict(module.state_dict())
        twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-3, betas=(0.5, 0.999))
        twin_opt.load_state_dict(optimizer.state_dict())
        copies.append((twin, twin_opt))
    layout = StackedMLP.of(members[0])
    params = stack([c[0] for c in copies], layout.names)
    adam = StackedAdam(params, [c[1] for c in copies], (0.5, 0.999))
    rates = [1e-3, 3e-2, 2e-4]
    active = [True, True, False]
    x = torch.randn(3, 4, 2)
    for step in range(3):
        mask = None if step == 0 else torch.tensor(active)
        values = layout.forward(params, x).square().mean(-1)
        grads = torch.autograd.grad(values.sum(), list(params.values()))
        adam.step(dict(zip(params, grads)), torch.tensor(rates, dtype=torch.float64), mask)
        for m, (module, optimizer) in enumerate(reference):
            if step > 0 and not active[m]:
                continue
            optimizer.param_groups[0]["lr"] = rates[m]
            optimizer.zero_grad()
            module(x[m]).square().mean().backward()
            optimizer.step()
    unstack(params, [c[0] for c in copies])
    states = adam.member_states([True, False, True], [3, 3, 1])  # the steps each took
    for (module, optimizer), twin, state in zip(reference, [c[0] for c in copies], states):
        for a, b, sb in zip(module.parameters(), twin.parameters(), state):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
            sa = optimizer.state[a]
            assert float(sa["step"]) == float(sb["step"])
            assert torch.allclose(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=1e-12, atol=1e-16)
    # Views of the stacks, one step count a parameter (torch's Adam increments each in place).
    assert states[0][0]["exp_avg"].data_ptr() == adam.exp_avg.data_ptr()
    assert states[0][0]["step"] is not states[0][1]["step"]


# ---- a tile against its cells one by one -------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True], ids=["fitness-per-cell", "fitness-batched"])
@pytest.mark.parametrize("changes", CASES)
def test_a_tile_iterates_as_its_cells_do_one_by_one(float64: None, changes: dict, batched: bool) -> None:
    merged: dict[str, Any] = {"training": {"iterations": 4, "batches_per_iteration": 3, "fitness": {"sample_size": 16}}}
    for section, values in changes.items():
        merged[section] = {**merged.get(section, {}), **values}
    cfg = parse_config(tiny(**merged))
    dataset = ring64()
    alone, together = make_cells(cfg, dataset), make_cells(cfg, dataset)
    expected = one_by_one(alone, 3)
    assert_same_reports(expected, tiled(together, 3, batched))  # batched: as a GPU runs it
    assert_same_cells(alone, together)
    rates = {ind.learning_rate for cell in together for ind in cell.generators}
    if ("mutated" in str(changes) or "population_size" in str(changes)) and "reaches_optimizer" not in str(changes):
        assert len(rates) > 1  # members really trained at different rates


@pytest.mark.parametrize("exact", [True, False], ids=["a-call-a-component", "fixed-size-calls"])
def test_a_tile_scores_lipizzaners_fid_mixtures_in_one_read_as_each_cell_would(
    float64: None, mnist_dir: Path, exact: bool
) -> None:
    """mixture.score fid (the faithful mode's): a batched tile runs every cell's mixture through
    Lipizzaner's CNN and reads the logits once (Cell.frechet_scores), and each cell ends where its
    own 1 + G reads take it (`exact=False`: in a GPU's fixed-size calls, to float rounding)."""
    digits = {"name": "mnist", "dir": str(mnist_dir), "split": "test", "size": 400}
    cfg = config(
        grid={"rows": 2, "cols": 2},
        data=digits,
        network={"name": "mlp", "hidden": 16, "latent_dim": 8},
        training={
            "iterations": 4,
            "batches_per_iteration": 2,
            "fitness": {"sample_size": 16},
            "mixture": {"score": "fid", "score_samples": 96},
            "selection": {"replacement": "if_fitter", "opponents": "per_batch"},
        },
    )
    dataset = float32_dataset(cfg.data)
    alone, together = make_cells(cfg, dataset), make_cells(cfg, dataset)
    expected, tile, reports = one_by_one(alone, 3), Tile(together, batched=True, exact=exact), []
    for _ in range(3):
        reports += [report.to_json() for report in tile.iterate(neighbourhoods(together))]
    assert_same_reports(expected, reports)
    assert_same_cells(alone, together)
    assert len({round(cell.score, 6) for cell in together}) == 4  # each cell's own mixture was scored


def test_a_tiles_members_hold_views_of_its_stacks_and_survivors_let_them_go() -> None:
    """A trained member's tensors are views of the iteration's stacks (no copy a member); a member
    that survives replacement takes storage of its own, or it would keep its whole stack alive."""
    cfg = config(grid={"rows": 3, "cols": 3}, training={"population_size": 2, "iterations": 8})
    cells = make_cells(cfg, ring64())
    tile = Tile(cells)

    def members() -> list:
        return [ind for cell in cells for ind in [*cell.generators, *cell.discriminators]]

    def tensors(ind: Any) -> list[torch.Tensor]:
        moments = [v for state in ind.optimizer.state.values() for v in state.values()]
        return [*ind.network.parameters(), *moments]

    for _ in range(6):
        tile.iterate(neighbourhoods(cells))
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for m in members() for t in tensors(m)}
        own = sum(t.numel() * t.element_size() for m in members() for t in tensors(m))
        assert sum(held.values()) <= 2 * own  # the last stacks at most, besides the members themselves

    def views(ind: Any) -> bool:
        return any(t.untyped_storage().nbytes() > t.numel() * t.element_size() for t in tensors(ind))

    assert [m for m in members() if views(m)]  # the trained ones
    before = [dict(cell.state()[0]) for cell in cells]
    for cell in cells:  # a released slot's cell keeps no stack alive, and its numbers
        cell.let_go()
    assert not [m for m in members() if views(m)]
    for cell, state in zip(cells, before):
        assert all(torch.equal(state[k], v) for k, v in cell.state()[0].items())


def test_a_tile_in_two_stacks_on_two_threads_is_the_same_tile(float64: None) -> None:
    cfg, dataset = config(grid={"rows": 3, "cols": 3}), ring64()
    one, two = make_cells(cfg, dataset), make_cells(cfg, dataset)
    single, pair = Tile(one), Tile(two, workers=2)
    for _ in range(2):
        expected = [r.to_json() for r in single.iterate(neighbourhoods(one))]
        assert_same_reports(expected, [r.to_json() for r in pair.iterate(neighbourhoods(two))])
    assert_same_cells(one, two, tolerance=1e-12)


def test_auto_tiles_small_perceptrons_on_a_cpu_and_never_a_dcgan() -> None:
    ring = load_dataset(config().data, 0)
    small = config(grid={"rows": 1, "cols": 2})
    assert use_tile(small, make_cells(small, ring))
    assert not use_tile(config(grid={"rows": 1, "cols": 2}, tiles="off"), make_cells(small, ring))
    wide = config(grid={"rows": 1, "cols": 2}, network={"hidden": 256, "latent_dim": 64})
    cells = make_cells(wide, ring)
    size = sum(
        p.numel() for ind in (cells[0].generators.best, cells[0].discriminators.best) for p in ind.network.parameters()
    )
    assert size > CPU_TILE_PARAMETERS and not use_tile(wide, cells)  # compute-bound on a CPU: one by one
    forced = config(grid={"rows": 1, "cols": 2}, network={"hidden": 256, "latent_dim": 64}, tiles="on")
    assert use_tile(forced, make_cells(forced, ring))


def test_a_tiled_checkpoint_resumes_untiled_and_back(float64: None) -> None:
    cfg, dataset = config(), ring64()
    reference = make_cells(cfg, dataset)
    tiled(reference, 4)

    first = make_cells(cfg, dataset)
    tiled(first, 2)
    second = make_cells(cfg, dataset)  # resumes the tile's checkpoint, one by one
    for cell, saved in zip(second, first):
        cell.restore(*saved.state())
    one_by_one(second, 1)
    third = make_cells(cfg, dataset)  # and back into a tile
    for cell, saved in zip(third, second):
        cell.restore(*saved.state())
    tiled(third, 1)
    assert_same_cells(reference, third)


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_a_checkpoint_from_before_tiles_resumes_and_goes_on_as_its_version_did(tmp_path: Path) -> None:
    """A run directory written at 18f502c (before tiles), resumed to 6 iterations by today's code,
    tiled and untiled: every cell starts from its checkpoint (no cell starts again) and its records
    are the ones 18f502c wrote resuming it, to float rounding (tests/fixtures/README.md says how
    both were made)."""
    expected = [json.loads(line) for line in (FIXTURES / "run-18f502c-resumed-to-6.jsonl").read_text().splitlines()]

    def key(record: dict) -> tuple:
        return tuple(record["cell"]), record["iteration"]

    def resume(tiles: str) -> list[dict]:
        out = tmp_path / tiles
        shutil.copytree(FIXTURES / "run-18f502c", out / "run")
        result = palomino(
            "train", "--resume", out / "run", "--set", "training.iterations=6", "--set", f"tiles={tiles}", cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "starts again" not in result.stderr and "corrupt" not in result.stderr, result.stderr[-3000:]
        assert (out / "run" / "result" / "mixture.json").exists()
        return sorted((r for r in metrics_of(out) if r["iteration"] >= 4), key=key)

    with ThreadPoolExecutor(2) as pool:  # two processes side by side: each is mostly start-up
        runs = dict(zip(("on", "off"), pool.map(resume, ("on", "off"))))
    expected = sorted(expected, key=key)
    for tiles, resumed in runs.items():
        assert [key(r) for r in resumed] == [key(r) for r in expected], tiles
        for ours, theirs in zip(resumed, expected):
            where = (tiles, key(ours))
            for field in ("epoch", "losses_used", "steps", "neighbours"):
                assert ours[field] == theirs[field], (where, field)
            for role in ("generator", "discriminator"):
                for value in ("loss", "fitness", "learning_rate"):
                    assert ours[role][value] == pytest.approx(theirs[role][value], rel=1e-5), (where, role, value)
            assert ours["score"] == pytest.approx(theirs["score"], rel=1e-5), where
            assert ours["mixture"] == pytest.approx(theirs["mixture"], rel=1e-5), where


def test_cells_on_different_batch_sizes_share_a_tile(float64: None) -> None:
    """A region smaller than a batch gives its cell smaller batches: it trains in its own stack."""
    cfg = config(training={"batch_size": 64, "batches_per_iteration": 2, "data_regions": True, "iterations": 3})
    ring = ring64()
    dataset = Dataset(ring.name, ring.samples[:150], ring.labels[:150], ring.kind, ring.modes)
    alone, together = make_cells(cfg, dataset), make_cells(cfg, dataset)
    assert len({min(64, len(c.data)) for c in alone}) > 1, "the regions should differ in batch size"
    assert_same_reports(one_by_one(alone, 2), tiled(together, 2))
    assert_same_cells(alone, together)


@pytest.mark.parametrize("changes", CONV_CASES)
def test_a_dcgan_tile_iterates_as_its_cells_do_one_by_one(float64: None, changes: dict) -> None:
    """BatchNorm's running statistics (which the mixture samples with) and spectral norm's u and v
    are part of each cell's state: the tile advances them as the cells do."""
    cfg = conv_config(changes)
    dataset = images64(labelled=cfg.network.conditional)
    alone, together = make_cells(cfg, dataset), make_cells(cfg, dataset)
    assert not use_tile(cfg, alone)  # auto: convolutions are compute-bound on a CPU, one by one there
    expected = one_by_one(alone, 2)
    assert_same_reports(expected, tiled(together, 2))
    assert_same_cells(alone, together)
    assert any("running_var" in key or "_v" in key for key in together[0].state()[0])


# ---- the command line --------------------------------------------------------------------------


def metrics_of(out: Any) -> list[dict]:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return sorted(records, key=lambda r: (r["iteration"], r["cell"]))


def test_train_tiled_is_reproducible_and_matches_untiled(tmp_path) -> None:
    raw = tiny(training={"iterations": 3, "synchronous": True})

    def train(name: str, tiles: str) -> list[dict]:
        cfg = write_yaml(tmp_path / f"{name}.yaml", {**raw, "tiles": tiles})
        result = palomino("train", cfg, "--out", tmp_path / name, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        return metrics_of(tmp_path / name)

    with ThreadPoolExecutor(3) as pool:  # three processes side by side: each is mostly start-up
        runs = dict(zip(("a", "b", "off"), pool.map(train, ("a", "b", "off"), ("on", "on", "off"))))
    strip = [{k: v for k, v in r.items() if k not in ("seconds", "tile")} for r in runs["a"]]
    assert strip == [{k: v for k, v in r.items() if k not in ("seconds", "tile")} for r in runs["b"]]
    assert {r["tile"] for r in runs["a"]} == {4}
    assert all("tile" not in r for r in runs["off"])
    for tiled_record, alone in zip(runs["a"], runs["off"]):  # float32: the same run to rounding
        assert tiled_record["losses_used"] == alone["losses_used"]
        assert tiled_record["generator"]["loss"] == pytest.approx(alone["generator"]["loss"], rel=1e-3, abs=1e-4)


def test_train_with_an_unknown_tiles_word_exits_2_naming_the_field(tmp_path) -> None:
    assert parse_config(tiny(network={"name": "dcgan"}, tiles="on")).tiles == "on"  # every network tiles
    cfg = write_yaml(tmp_path / "bad.yaml", tiny(tiles="sometimes"))
    result = palomino("train", cfg, "--out", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 2
    assert "tiles" in result.stderr


def test_the_parallel_benchmark_times_a_tile_in_one_thread_two_threads_and_two_processes(capsys) -> None:
    """benchmarks/tiles.py --parallel: the measure of what a second core gives a tile (docs/speed.md)."""
    tiles = benchmark_module("tiles")
    assert tiles.main(["--parallel", "--model", "ring", "--cells", "3", "--batches", "2", "--rounds", "1"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert row[0] == "3", row
    one, two, apart = float(row[1]), float(row[2]), float(row[4])
    assert min(one, two, apart) > 0, row
    # The two ratios are the columns' own quotients.
    assert float(row[3].rstrip("×")) == pytest.approx(one / two, abs=0.01)
    assert float(row[5].rstrip("×")) == pytest.approx(one / apart, abs=0.01)
