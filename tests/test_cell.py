"""One cell's iteration: reports, state()/restore(), snapshots between cells, and the config variants."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
from conftest import tiny

from palomino.coevolution import Cell, IterationReport, cell_state
from palomino.coevolution.fitness import fitness_tables, generate
from palomino.coevolution.individual import Individual, make_adam
from palomino.config import ExperimentConfig, parse_config
from palomino.data import Dataset, load_dataset
from palomino.grid import Coord, Topology
from palomino.nn import build_discriminator, build_generator, get_loss
from palomino.wire import Snapshot, decode_snapshot, encode_snapshot

REPORT_FIELDS = {
    "iteration",
    "cell",
    "epoch",
    "generator",
    "discriminator",
    "losses_used",
    "score",
    "mixture",
    "neighbours",
    "steps",
}


def config(**changes: Any) -> ExperimentConfig:
    return parse_config(tiny(**changes))


@pytest.fixture(scope="module")
def ring() -> Dataset:
    return load_dataset(config().data, 0)


def make_cell(cfg: ExperimentConfig, dataset: Dataset, coord: tuple[int, int] = (0, 0)) -> Cell:
    topology = Topology(cfg.grid.rows, cfg.grid.cols, cfg.grid.neighbourhood)
    return Cell(Coord(*coord), topology, cfg, dataset, experiment="test")


def copy_of(snapshot: Snapshot) -> Snapshot:
    """A private copy, as a neighbour in another process would receive it."""
    return decode_snapshot(encode_snapshot(snapshot))


def check_report(report: IterationReport, cfg: ExperimentConfig, iteration: int, coord: Coord) -> dict:
    record = report.to_json()
    assert set(record) == REPORT_FIELDS
    assert record["iteration"] == iteration and record["cell"] == list(coord) and record["epoch"] == 0
    for role in ("generator", "discriminator"):
        assert set(record[role]) == {"loss", "fitness", "learning_rate"}
        assert all(math.isfinite(v) for v in record[role].values()), record[role]
        assert record[role]["learning_rate"] >= 0
    assert set(record["losses_used"]) <= set(cfg.training.losses)
    assert sum(record["losses_used"].values()) == cfg.training.batches_per_iteration
    assert math.isfinite(record["score"]) and record["score"] >= 0
    assert str(coord) in record["mixture"]
    assert sum(record["mixture"].values()) == pytest.approx(1.0)
    assert all(w >= 0 for w in record["mixture"].values())
    return record


def same_report(a: IterationReport, b: IterationReport) -> bool:
    return a.to_json() == b.to_json()


# --- a lone cell ---------------------------------------------------------------------------------


def test_single_cell_iterates(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 1}, training={"losses": ["minimax", "mse"]})
    cell = make_cell(cfg, ring)
    assert cell.iteration == 0 and cell.snapshot().iteration == -1
    for i in range(3):
        record = check_report(cell.iterate({}), cfg, i, Coord(0, 0))
        assert record["mixture"] == {"0-0": 1.0}
        assert record["neighbours"] == {}
    assert cell.iteration == 3
    assert cell.snapshot().iteration == 2
    samples = cell.samples(10)
    assert samples.shape == (10, 2) and torch.isfinite(samples).all()


def test_training_changes_the_networks(ring: Dataset) -> None:
    cell = make_cell(config(grid={"rows": 1, "cols": 1}), ring)
    before = cell.snapshot().tensors
    cell.iterate({})
    after = cell.snapshot().tensors
    for role in ("generator", "discriminator"):
        key = f"{role}.net.net.0.weight"
        assert not torch.equal(before[key], after[key]), role
    assert any(k.startswith("generator.opt.") for k in after)  # Adam moments travel with the weights


def test_same_seed_same_cell_same_reports(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 1})
    a, b = make_cell(cfg, ring), make_cell(cfg, ring)
    for _ in range(2):
        assert same_report(a.iterate({}), b.iterate({}))
    c = make_cell(config(grid={"rows": 1, "cols": 1}, seed=8), ring)
    assert not same_report(make_cell(cfg, ring).iterate({}), c.iterate({}))


# --- state and restore -----------------------------------------------------------------------------


def test_state_restore_round_trip_continues_identically(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 1}, training={"population_size": 2, "losses": ["minimax", "nonsaturating"]})
    original = make_cell(cfg, ring)
    original.iterate({})
    original.iterate({})
    restored = make_cell(cfg, ring)
    restored.restore(*original.state())
    assert restored.iteration == original.iteration == 2
    for _ in range(3):
        assert same_report(original.iterate({}), restored.iterate({}))


def test_state_survives_a_checkpoint_file(ring: Dataset, tmp_path) -> None:
    from palomino.runs.checkpoints import newest_valid, write_checkpoint

    cfg = config(grid={"rows": 1, "cols": 1})
    original = make_cell(cfg, ring)
    original.iterate({})
    write_checkpoint(tmp_path, original.iteration, *original.state(), keep=2)
    checkpoint = newest_valid(tmp_path)
    restored = make_cell(cfg, ring)
    restored.restore(checkpoint.tensors, checkpoint.meta)
    assert same_report(original.iterate({}), restored.iterate({}))


def test_adopting_a_published_snapshot_takes_over_individuals_and_progress(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 1}, training={"population_size": 2})
    original = make_cell(cfg, ring)
    original.iterate({})
    original.iterate({})
    published = copy_of(original.snapshot())
    newcomer = make_cell(cfg, ring)
    newcomer.adopt(published)
    assert newcomer.iteration == 2 and newcomer.mixture_weights == original.mixture_weights
    for role in ("generator", "discriminator"):
        best = getattr(original, role + "s").best
        for ind in getattr(newcomer, role + "s"):
            assert ind.learning_rate == best.learning_rate and ind.optimizer.param_groups[0]["lr"] == best.learning_rate
            for name, value in best.network.state_dict().items():
                assert torch.equal(ind.network.state_dict()[name], value), name
    report = newcomer.iterate({})  # and it trains on from there
    assert report.iteration == 2


def test_restore_refuses_another_architecture(ring: Dataset) -> None:
    small = make_cell(config(grid={"rows": 1, "cols": 1}), ring)
    big = make_cell(config(grid={"rows": 1, "cols": 1}, network={"hidden": 24}), ring)
    with pytest.raises(ValueError, match="shape"):
        big.restore(*small.state())


def test_state_restore_with_neighbours_continues_identically(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 2})
    original, neighbour = make_cell(cfg, ring, (0, 0)), make_cell(cfg, ring, (0, 1))
    original.iterate({Coord(0, 1): copy_of(neighbour.snapshot())})
    neighbour.iterate({Coord(0, 0): copy_of(original.snapshot())})
    body = encode_snapshot(neighbour.snapshot())
    restored = make_cell(cfg, ring, (0, 0))
    restored.restore(*original.state())
    for _ in range(2):  # each cell gets its own copy of the neighbour's snapshot
        a = original.iterate({Coord(0, 1): decode_snapshot(body)})
        b = restored.iterate({Coord(0, 1): decode_snapshot(body)})
        assert same_report(a, b)


# --- neighbours -----------------------------------------------------------------------------------


def test_snapshot_feeds_a_neighbour(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 2})
    a, b = make_cell(cfg, ring, (0, 0)), make_cell(cfg, ring, (0, 1))
    ra = check_report(a.iterate({Coord(0, 1): copy_of(b.snapshot())}), cfg, 0, Coord(0, 0))
    assert ra["neighbours"] == {"0-1": -1}
    assert set(ra["mixture"]) == {"0-0", "0-1"}
    snapshot = copy_of(a.snapshot())  # through the wire codec, as the broker carries it
    assert snapshot.header.cell == (0, 0) and snapshot.iteration == 0
    assert snapshot.header.mixture == ra["mixture"]
    rb = check_report(b.iterate({Coord(0, 0): snapshot}), cfg, 0, Coord(0, 1))
    assert rb["neighbours"] == {"0-0": 0}
    # The neighbour's generator is a mixture component exactly as published.
    parts = b.neighbourhood_mixture({Coord(0, 0): snapshot})
    assert [key for key, _, _ in parts] == ["0-1", "0-0"]
    published = {k[len("generator.net.") :]: v for k, v in snapshot.tensors.items() if k.startswith("generator.net.")}
    for name, value in parts[1][2].network.state_dict().items():
        assert torch.equal(value, published[name]), name


def test_missing_neighbours_are_left_out(ring: Dataset) -> None:
    cfg = config()
    cell = make_cell(cfg, ring, (0, 0))
    other = make_cell(cfg, ring, (0, 1))
    not_a_neighbour = make_cell(config(grid={"rows": 3, "cols": 3}), ring, (2, 2))
    record = cell.iterate(
        {Coord(0, 1): copy_of(other.snapshot()), Coord(2, 2): copy_of(not_a_neighbour.snapshot())}
    ).to_json()
    assert record["neighbours"] == {"0-1": -1}
    assert set(record["mixture"]) == {"0-0", "0-1"}


def test_iterating_does_not_modify_a_neighbours_snapshot(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 2}, training={"population_size": 2, "tournament_size": 1, "replacements": 1})
    cell, neighbour = make_cell(cfg, ring, (0, 0)), make_cell(cfg, ring, (0, 1))
    neighbour.iterate({Coord(0, 0): copy_of(cell.snapshot())})
    snapshot = neighbour.snapshot()  # shared, as the in-memory bus shares it with every neighbour
    before = {k: v.clone() for k, v in snapshot.tensors.items()}
    for _ in range(3):
        cell.iterate({Coord(0, 1): snapshot})
    changed = [k for k, v in snapshot.tensors.items() if not torch.equal(v, before[k])]
    assert changed == []


def test_clone_is_independent_of_the_original() -> None:
    torch.manual_seed(0)
    network = torch.nn.Linear(3, 2)
    original = Individual("generator", network, make_adam(network, 0.01, (0.5, 0.999)), 0.01)
    network(torch.randn(5, 3)).sum().backward()
    original.optimizer.step()
    before = {k: v.clone() for k, v in original.tensors("g").items()}
    clone = clone_and_step(original)
    after = original.tensors("g")
    assert {k for k in before if not torch.equal(before[k], after[k])} == set()
    assert not torch.equal(clone.network.weight, original.network.weight)


def clone_and_step(original: Individual) -> Individual:
    clone = original.clone()
    clone.optimizer.zero_grad()
    clone.network(torch.randn(5, 3)).sum().backward()
    clone.optimizer.step()
    return clone


def test_clone_has_its_own_weights() -> None:
    torch.manual_seed(1)
    network = torch.nn.Linear(3, 2)
    original = Individual("generator", network, make_adam(network, 0.01, (0.5, 0.999)), 0.01, fitness=1.5, loss="mse")
    weights = network.weight.detach().clone()
    clone = clone_and_step(original)
    assert torch.equal(network.weight, weights)
    assert (clone.fitness, clone.loss, clone.learning_rate) == (1.5, "mse", 0.01)


# --- variants ---------------------------------------------------------------------------------------


def run_grid(cfg: ExperimentConfig, dataset: Dataset, iterations: int = 2) -> dict[Coord, list[dict]]:
    """Every cell of the grid, synchronously, each iteration against the others' previous snapshots."""
    topology = Topology(cfg.grid.rows, cfg.grid.cols, cfg.grid.neighbourhood)
    cells = {coord: make_cell(cfg, dataset, coord) for coord in topology.cells()}
    records: dict[Coord, list[dict]] = {coord: [] for coord in cells}
    for i in range(iterations):
        bodies = {coord: encode_snapshot(cell.snapshot()) for coord, cell in cells.items()}
        for coord, cell in cells.items():
            neighbours = {n: decode_snapshot(bodies[n]) for n in topology.neighbours(coord)}
            report = cell.iterate(neighbours)
            record = check_report(report, cfg, i, coord)
            assert record["neighbours"] == {str(n): i - 1 for n in topology.neighbours(coord)}
            assert set(record["mixture"]) == {str(c) for c in topology.neighbourhood(coord)}
            records[coord].append(record)
    return records


@pytest.mark.parametrize("replacements", [1, 2])
def test_population_of_two(ring: Dataset, replacements: int) -> None:
    cfg = config(grid={"rows": 1, "cols": 2}, training={"population_size": 2, "replacements": replacements})
    run_grid(cfg, ring)
    cell = make_cell(cfg, ring)
    cell.iterate({})
    assert len(cell.generators) == 2 and len(cell.discriminators) == 2
    _tensors, meta = cell.state()
    assert set(meta["individuals"]) == {"generator.0", "generator.1", "discriminator.0", "discriminator.1"}
    assert cell.generators.best.fitness == min(g.fitness for g in cell.generators)


def test_wgan_gp(ring: Dataset) -> None:
    cfg = config(
        grid={"rows": 1, "cols": 2}, training={"losses": ["wgan_gp"], "n_critic": 2, "batches_per_iteration": 4}
    )
    records = run_grid(cfg, ring)
    assert all(r["losses_used"] == {"wgan_gp": 4} for rs in records.values() for r in rs)


def test_mixed_losses(ring: Dataset) -> None:
    losses = ["minimax", "mse", "nonsaturating", "wgan_gp"]
    cfg = config(grid={"rows": 1, "cols": 2}, training={"losses": losses, "batches_per_iteration": 6})
    records = run_grid(cfg, ring, iterations=3)
    used = set()
    for rs in records.values():
        for r in rs:
            used |= set(r["losses_used"])
    assert len(used) >= 3  # 36 random draws from 4 losses
    snapshot = make_cell(cfg, ring).snapshot()
    assert snapshot.header.generator.loss == ""  # untrained: no loss yet


def test_moore_neighbourhood(ring: Dataset) -> None:
    cfg = config(grid={"rows": 3, "cols": 3, "neighbourhood": "moore"}, training={"batches_per_iteration": 1})
    records = run_grid(cfg, ring, iterations=1)
    for _coord, rs in records.items():
        assert len(rs[0]["mixture"]) == 9 and len(rs[0]["neighbours"]) == 8


def test_fitness_modes(ring: Dataset) -> None:
    """An individual's fitness is its loss against each opponent in the neighbourhood, taken as
    training.fitness.mode says: best the lowest, worst the highest, average their mean."""

    def fitness_after_selection(mode: str) -> tuple[float, float]:
        cfg = config(grid={"rows": 1, "cols": 2}, training={"fitness": {"mode": mode, "sample_size": 32}})
        neighbour = make_cell(cfg, ring, (0, 1)).snapshot()
        cell = make_cell(cfg, ring)  # the same seed in every mode: the same networks, draws and losses
        cell.select({Coord(0, 1): copy_of(neighbour)})
        return cell.generators.best.fitness, cell.discriminators.best.fitness

    by_mode = {mode: fitness_after_selection(mode) for mode in ("best", "worst", "average")}
    for role in (0, 1):  # the generator (against 2 discriminators), the discriminator (against 2 generators)
        best, worst, average = (by_mode[mode][role] for mode in ("best", "worst", "average"))
        assert math.isfinite(best) and best < worst, by_mode  # its own opponent's loss and the neighbour's differ
        assert average == pytest.approx((best + worst) / 2, rel=1e-5), by_mode  # two losses: the mean is halfway
    # And a grid trains in each mode.
    for mode in ("best", "worst"):
        run_grid(config(grid={"rows": 1, "cols": 2}, training={"fitness": {"mode": mode, "sample_size": 32}}), ring, 1)


@pytest.mark.parametrize("network", ["mlp", "dcgan"])
def test_fitness_tables_in_part_are_the_whole_tables_rows_and_columns(network: str) -> None:
    """A cell whose neighbours never enter selection evaluates only its own rows and columns."""
    spec = config(network={"name": network, "hidden": 16, "width": 4, "latent_dim": 8}).network
    shape, kind = ((2,), "points") if network == "mlp" else ((1, 28, 28), "image")
    torch.manual_seed(0)
    gens = [build_generator(spec, shape, kind) for _ in range(3)]
    crits = [build_discriminator(spec, shape, kind) for _ in range(4)]
    z, real, loss = torch.randn(16, 8), torch.randn(16, *shape), get_loss("nonsaturating")
    fakes = generate(gens, z)
    state = [copy.deepcopy(d.state_dict()) for d in crits]  # BatchNorm moves in training mode: rewind

    def tables(**part: int) -> tuple[torch.Tensor, torch.Tensor]:
        for d, saved in zip(crits, state):
            d.load_state_dict(saved)
        return fitness_tables(fakes, crits, real, loss, **part)

    whole_g, whole_d = tables()
    assert whole_g.shape == (3, 4) and whole_d.shape == (3, 4)
    own_g, own_d = tables(generators=1, critics=2)
    assert torch.allclose(own_g, whole_g[:1], rtol=1e-5) and torch.allclose(own_d, whole_d[:, :2], rtol=1e-5)
    only_g, none_d = tables(critics=0)
    assert torch.allclose(only_g, whole_g, rtol=1e-5) and none_d.shape == (3, 0)
    none_g, only_d = tables(generators=0)
    assert none_g.shape == (0, 4) and torch.allclose(only_d, whole_d, rtol=1e-5)


def test_without_migration_a_cell_evaluates_only_its_own_and_selects_as_with_the_whole_table(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 2}, training={"selection": {"migration": 0.0}})
    neighbour = make_cell(cfg, ring, (0, 1)).snapshot()
    cell, twin = make_cell(cfg, ring), make_cell(cfg, ring)
    chosen = cell.select({Coord(0, 1): copy_of(neighbour)})
    # The twin computes the whole table, as a cell with migration did before.
    draw = twin._fitness_draw()
    foreign = [twin._from_snapshot(copy_of(neighbour), role) for role in ("generator", "discriminator")]
    fakes = generate([twin.generators.best.network, foreign[0].network], draw.z)
    g_table, d_table = fitness_tables(
        fakes, [twin.discriminators.best.network, foreign[1].network], draw.real, cell.fitness_loss
    )
    assert cell.generators.best.fitness == pytest.approx(float(g_table[0].mean()), rel=1e-5)
    assert cell.discriminators.best.fitness == pytest.approx(float(d_table[:, 0].mean()), rel=1e-5)
    assert [ind.origin for ind in chosen.generators] == [cell.generators.best.origin]  # its own, cloned


def test_without_migration_neighbours_get_weights_only_and_train_as_with_the_moments(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 2}, training={"selection": {"migration": 0.0}})
    other = make_cell(cfg, ring, (0, 1))
    other.iterate({})
    weights_only = other.snapshot()
    assert weights_only.tensors and not any(".opt." in k for k in weights_only.tensors)
    full = cell_state.snapshot(other, moments=True)
    assert any(k.startswith("generator.opt.") for k in full.tensors)
    assert len(encode_snapshot(weights_only)) < len(encode_snapshot(full)) / 2  # Adam: two moments a weight
    # A cell without migration never uses a neighbour's moments: the same iterations either way.
    cell, twin = make_cell(cfg, ring), make_cell(cfg, ring)
    for _ in range(2):
        a = cell.iterate({Coord(0, 1): copy_of(weights_only)})
        b = twin.iterate({Coord(0, 1): copy_of(full)})
        assert same_report(a, b)
    for role in ("generator", "discriminator"):
        mine, its = getattr(cell, role + "s").best, getattr(twin, role + "s").best
        for name, value in mine.network.state_dict().items():
            assert torch.equal(value, its.network.state_dict()[name]), name


def test_adopting_a_snapshot_of_weights_only_takes_them_and_restarts_adam(ring: Dataset) -> None:
    cfg = config(grid={"rows": 1, "cols": 1}, training={"selection": {"migration": 0.0}})
    original = make_cell(cfg, ring)
    original.iterate({})
    newcomer = make_cell(cfg, ring)
    newcomer.adopt(copy_of(original.snapshot()))
    assert newcomer.iteration == 1
    best = original.generators.best
    for ind in newcomer.generators:
        assert not ind.optimizer.state  # no moments were published: Adam starts again
        for name, value in best.network.state_dict().items():
            assert torch.equal(ind.network.state_dict()[name], value), name
    assert newcomer.iterate({}).iteration == 1


def test_snapshot_fitness_is_finite_before_any_iteration(ring: Dataset) -> None:
    header = make_cell(config(), ring).snapshot().header
    assert np.isfinite(header.generator.fitness) and np.isfinite(header.discriminator.fitness)
    assert header.score is None
    encode_snapshot(make_cell(config(), ring).snapshot())  # JSON-safe
