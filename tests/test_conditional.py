"""Conditional networks (network.conditional): the CGAN / DC-CGAN builders, labels through a
cell's training and fitness, conditional mixtures, and a conditional draw that a classifier
recognises after a short training on MNIST's test split (the `mnist_dir` fixture)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import merge, tiny
from helpers import mnist_classifier

from palomino.coevolution import Cell
from palomino.config import parse_config
from palomino.data import class_priors, load_dataset
from palomino.engine.embedded import train_embedded
from palomino.errors import ConfigError, PalominoError
from palomino.grid import Topology
from palomino.nn import apply, build_discriminator, build_generator, get_loss, is_conditional
from palomino.nn.conditional import ConditionalDCGANDiscriminator, ConditionalMLPDiscriminator
from palomino.nn.stacked import StackedMLP
from palomino.runs import Mixture, RunDirectory
from palomino.runs.mixture import draw_labels

SHAPES = [("mlp", (2,), "points"), ("mlp", (1, 28, 28), "image"), ("dcgan", (1, 28, 28), "image"),
          ("dcgan", (3, 32, 32), "image"), ("sngan", (3, 64, 64), "image")]  # fmt: skip


def spec(name: str, **more) -> SimpleNamespace:
    return SimpleNamespace(name=name, latent_dim=8, hidden=16, width=4, conditional=True, label_dim=5, **more)


@pytest.mark.parametrize("name,shape,kind", SHAPES)
def test_conditional_shapes_and_the_label_matters(name: str, shape: tuple[int, ...], kind: str) -> None:
    torch.manual_seed(0)
    G, D = build_generator(spec(name), shape, kind, 10), build_discriminator(spec(name), shape, kind, 10)
    assert is_conditional(G) and is_conditional(D)
    G.eval(), D.eval()  # BatchNorm on running statistics: each sample on its own
    z = torch.randn(4, 8)
    same_z = z[:1].expand(2, 8)
    x = G(z, torch.tensor([0, 1, 2, 9]))
    assert x.shape == (4, *shape)
    assert D(x, torch.tensor([0, 1, 2, 9])).shape == (4,)
    # One z, two labels: two different samples; one sample, two labels: two different logits.
    pair = G(same_z, torch.tensor([3, 4]))
    assert not torch.allclose(pair[0], pair[1])
    logits = D(x[:1].expand(2, *shape), torch.tensor([3, 4]))
    assert not torch.allclose(logits[0], logits[1])


def test_dcgan_discriminator_takes_the_label_as_an_input_channel() -> None:
    D = build_discriminator(spec("dcgan"), (3, 32, 32), "image", 10)
    assert isinstance(D, ConditionalDCGANDiscriminator)
    assert D.body.net[0].in_channels == 4  # RGB + the label's 32×32 plane
    assert D.embed.weight.shape == (10, 32 * 32)
    M = build_discriminator(spec("mlp"), (1, 28, 28), "image", 10)
    assert isinstance(M, ConditionalMLPDiscriminator)
    assert M.body.net[0].in_features == 28 * 28 + 5


def test_unconditional_networks_are_unchanged_and_apply_calls_both() -> None:
    plain = SimpleNamespace(name="mlp", latent_dim=8, hidden=16, width=4)  # no `conditional`: the old spec
    G = build_generator(plain, (2,), "points")
    assert not is_conditional(G)
    assert {k.split(".")[0] for k in G.state_dict()} == {"net"}  # checkpoints keep their tensor names
    z = torch.randn(3, 8)
    assert torch.equal(apply(G, z), G(z))
    C = build_generator(spec("mlp"), (2,), "points", 4)
    with pytest.raises(ValueError, match="needs the labels"):
        apply(C, z)
    assert torch.equal(apply(C, z, torch.tensor([0, 1, 3])), C(z, torch.tensor([0, 1, 3])))


def test_conditional_network_needs_labelled_data() -> None:
    with pytest.raises(ConfigError, match="labelled data"):
        build_generator(spec("mlp"), (2,), "points", None)


@pytest.mark.parametrize("loss_name", ["minimax", "nonsaturating", "mse", "wgan_gp"])
@pytest.mark.parametrize("name,shape,kind", [SHAPES[0], SHAPES[2]])
def test_conditional_losses_train_the_embeddings(loss_name: str, name: str, shape: tuple, kind: str) -> None:
    torch.manual_seed(1)
    G, D = build_generator(spec(name), shape, kind, 6), build_discriminator(spec(name), shape, kind, 6)
    loss, labels = get_loss(loss_name), torch.tensor([0, 5, 2, 2])
    real = torch.rand(4, *shape) * 2 - 1
    fake = G(torch.randn(4, 8), labels)
    d_loss = loss.discriminator(D, real, fake, labels=labels, generator=torch.Generator().manual_seed(0))
    d_loss.backward()
    assert D.embed.weight.grad is not None and D.embed.weight.grad[labels].abs().sum() > 0
    assert D.embed.weight.grad[1].abs().sum() == 0  # label 1 was not in the batch
    loss.generator(D(fake, labels)).backward()
    assert G.embed.weight.grad is not None and G.embed.weight.grad[labels].abs().sum() > 0


# --- labels through a cell --------------------------------------------------------------------


def conditional_cell(**changes) -> tuple[Cell, object]:
    config = parse_config(merge(tiny(network={"conditional": True}), changes))
    dataset = load_dataset(config.data, config.seed)
    return Cell((0, 0), Topology(1, 1), config, dataset, experiment="t"), dataset


def test_discriminator_sees_real_samples_with_their_own_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every real sample reaching D carries its true label; generated ones carry labels in the
    classes' proportions (the priors)."""
    cell, dataset = conditional_cell(data={"name": "gaussian_ring", "size": 400, "classes": [1, 2, 6]})
    truth = {tuple(x.tolist()): int(y) for x, y in zip(dataset.samples, dataset.labels)}
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = ConditionalMLPDiscriminator.forward

    def spy(self, x, labels):
        calls.append((x.detach().clone(), labels.clone()))
        return original(self, x, labels)

    stacked = StackedMLP.forward

    def stacked_spy(self, params, x, labels=None):  # the fitness tables evaluate D stacked
        if self.conditional and not self.generator:
            calls.extend(zip(x.detach().clone().unbind(), labels.clone().unbind()))
        return stacked(self, params, x, labels)

    monkeypatch.setattr(ConditionalMLPDiscriminator, "forward", spy)
    monkeypatch.setattr(StackedMLP, "forward", stacked_spy)
    for _ in range(3):
        cell.iterate({})
    real_seen, fake_labels = 0, Counter()
    for x, labels in calls:
        for point, label in zip(x, labels.tolist()):
            key = tuple(point.tolist())
            if key in truth:
                assert truth[key] == label
                real_seen += 1
            else:
                fake_labels[label] += 1
    assert real_seen > 300 and set(fake_labels) == {1, 2, 6}
    shares = np.array([fake_labels[c] for c in (1, 2, 6)]) / sum(fake_labels.values())
    assert np.abs(shares - 1 / 3).max() < 0.08


def test_conditional_cell_round_trips_its_state() -> None:
    a, _ = conditional_cell()
    a.iterate({})
    tensors, meta = a.state()
    b, _ = conditional_cell()
    b.restore(tensors, meta)
    ra, rb = a.iterate({}), b.iterate({})
    assert ra.generator == rb.generator and ra.discriminator == rb.discriminator and ra.score == rb.score


def test_conditional_progress_pictures_show_each_class() -> None:
    cell, _ = conditional_cell(data={"name": "gaussian_ring", "size": 400, "classes": [0, 4]})
    assert cell.picture_labels(6).tolist() == [0, 0, 0, 4, 4, 4]
    assert cell.samples(6).shape == (6, 2)


def test_conditional_wgan_gp_on_dcgan_iterates(mnist_dir: Path) -> None:
    cell, _ = conditional_cell(
        data={"name": "mnist", "dir": str(mnist_dir), "split": "test", "size": 128},
        network={"name": "dcgan", "width": 4, "latent_dim": 8},
        training={"losses": ["wgan_gp", "minimax"], "batches_per_iteration": 2, "batch_size": 16,
                  "fitness": {"sample_size": 16}, "mixture": {"score_samples": 16}},
    )  # fmt: skip
    report = cell.iterate({})
    assert np.isfinite(report.generator["loss"]) and np.isfinite(report.discriminator["loss"])


# --- conditional mixtures ---------------------------------------------------------------------


def test_draw_labels_follows_the_priors_exactly() -> None:
    labels = draw_labels({3: 0.5, 7: 0.3, 8: 0.2}, 1000, torch.Generator().manual_seed(0))
    assert Counter(labels.tolist()) == {3: 500, 7: 300, 8: 200}
    assert labels[:20].tolist() != sorted(labels[:20].tolist())  # shuffled


def test_conditional_mixture_saves_loads_and_samples_by_class(tmp_path: Path) -> None:
    cell, dataset = conditional_cell(data={"name": "gaussian_ring", "size": 500, "classes": [0, 2, 5]})
    cell.iterate({})
    priors = class_priors(dataset)
    mixture = Mixture([cell.generators.best.network], np.array([1.0]), ["0-0"], cell.config.network, (2,), "points",
                      {"cell": "0-0"}, priors=priors, label_count=8)  # fmt: skip
    mixture.save(tmp_path)
    loaded = Mixture.load(tmp_path)
    assert isinstance(loaded, Mixture) and loaded.classes == [0, 2, 5] and loaded.label_count == 8
    assert torch.equal(loaded.sample(50, seed=4, labels=[2] * 50), mixture.sample(50, seed=4, labels=[2] * 50))
    samples, labels = loaded.sample_labelled(300, seed=1)
    assert samples.shape == (300, 2)
    counts = Counter(labels.tolist())
    assert set(counts) == set(priors) and all(abs(counts[c] - 300 * p) < 1 for c, p in priors.items())
    with pytest.raises(PalominoError, match="class 3 was not trained.*\\[0, 2, 5\\]"):
        loaded.sample(5, labels=[3] * 5)
    with pytest.raises(PalominoError, match="one label per sample"):
        loaded.sample(5, labels=[2] * 4)


def test_unconditional_mixture_refuses_a_class() -> None:
    spec = parse_config({"network": {"latent_dim": 4, "hidden": 8}}).network
    mixture = Mixture([build_generator(spec, (2,), "points")], np.array([1.0]), ["0-0"], spec, (2,), "points", {})
    assert mixture.sample_labelled(10)[1] is None
    with pytest.raises(PalominoError, match="unconditional.*network.conditional"):
        mixture.sample(10, labels=[0] * 10)


# --- a conditional draw of class c looks like c ---------------------------------------------------


@pytest.mark.slow
def test_a_conditional_draw_is_classified_as_its_class(tmp_path: Path, mnist_dir: Path) -> None:
    whole = load_dataset(parse_config({"data": {"name": "mnist", "dir": str(mnist_dir), "split": "test"}}).data)
    classifier, accuracy = mnist_classifier(whole)
    assert accuracy > 0.85
    raw = {
        "name": "cgan", "seed": 1, "grid": {"rows": 1, "cols": 1},
        "training": {"iterations": 24, "batch_size": 64, "batches_per_iteration": 20, "losses": ["nonsaturating"],
                     "learning_rate": 0.0005, "fitness": {"sample_size": 64}, "mixture": {"score_samples": 64},
                     "checkpoint_every": 0, "sample_every": 0},
        "data": {"name": "mnist", "dir": str(mnist_dir), "split": "test", "classes": [0, 1, 4]},
        "network": {"name": "mlp", "hidden": 128, "latent_dim": 32, "conditional": True},
    }  # fmt: skip
    config = parse_config(raw)
    run = RunDirectory.create(tmp_path, config)
    outcome = asyncio.run(train_embedded(config, run, load_dataset(config.data, config.seed)))
    assert outcome.finished
    mixture = Mixture.load(run.path / "result")
    with torch.no_grad():
        for label in (0, 1, 4):
            drawn = mixture.sample(200, seed=3, labels=[label] * 200, data_space=False)
            hits = float((classifier(drawn.flatten(1)).argmax(1) == label).float().mean())
            assert hits > 0.6, (
                f"class {label}: {hits:.0%} of its draws classified as {label} (chance: 1/3 of these, 1/10 overall)"
            )
