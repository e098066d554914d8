"""The referee's plain baselines (palomino/baselines): N independent GANs trained as one stack
are, GAN by GAN, the GANs trained alone (float64, where only the order of float operations differs)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import float32_dataset, tiny

from palomino.baselines import Budget, train_independent
from palomino.config import ExperimentConfig, parse_config
from palomino.data import Dataset


def config(**changes: Any) -> ExperimentConfig:
    return parse_config(tiny(**changes))


def regions(cfg: ExperimentConfig, sizes: list[int]) -> list[Dataset]:
    """Parts of the ring of `sizes` points (one smaller than a batch), in the default dtype."""
    ring = float32_dataset(cfg.data)
    parts, start = [], 0
    for size in sizes:
        part = Dataset(ring.name, ring.samples[start : start + size], None, ring.kind, ring.modes, ring.mode_std)
        object.__setattr__(part, "samples", part.samples.to(torch.get_default_dtype()))  # past the float32 contract
        parts.append(part)
        start += size
    return parts


def weights(gans: list[tuple[torch.nn.Module, torch.nn.Module]]) -> list[dict[str, torch.Tensor]]:
    return [
        {**{f"G.{k}": v for k, v in g.state_dict().items()}, **{f"D.{k}": v for k, v in d.state_dict().items()}}
        for g, d in gans
    ]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"training": {"losses": ["wgan_gp"], "decay": {"start": 0.3, "final": 0.1}}},
        {"training": {"losses": ["mse"]}, "network": {"minibatch_std": True, "activation": "leaky_relu"}},
    ],
    ids=["nonsaturating", "wgan_gp+decay", "mse+mbstd"],
)
def test_a_stack_of_gans_is_each_gan_trained_alone(float64: None, changes: dict) -> None:
    cfg = config(**changes)
    data = regions(cfg, [150, 100, 20, 150])  # 20 < the batch of 32: a stack of its own
    budget, seeds = Budget(generator=6, discriminator=9), [5, 6, 7, 8]
    together = weights(train_independent(cfg, data, budget, seeds))
    alone = weights(train_independent(cfg, data, budget, seeds, stacked=False))
    initial = weights(train_independent(cfg, data, Budget(1, 0), seeds, stacked=False))
    for t, a, i in zip(together, alone, initial):
        assert t.keys() == a.keys()
        for name in t:
            torch.testing.assert_close(t[name], a[name], rtol=1e-9, atol=1e-11, msg=name)
        assert any(not torch.equal(t[n], i[n]) for n in t if n.startswith("D.")), "the discriminators trained"


def test_gans_of_a_stack_take_their_own_learning_rates(float64: None) -> None:
    cfg = config()
    data = regions(cfg, [150, 150])
    rates, budget = [1e-4, 1e-3], Budget(5, 5)
    together = weights(train_independent(cfg, data, budget, [3, 3], learning_rates=rates))
    for index, rate in enumerate(rates):
        alone = weights(
            train_independent(cfg, data[index : index + 1], budget, [3], stacked=False, learning_rates=[rate])
        )[0]
        for name, value in alone.items():
            torch.testing.assert_close(together[index][name], value, rtol=1e-9, atol=1e-11)
    assert not torch.equal(together[0]["G.net.0.weight"], together[1]["G.net.0.weight"])
    with pytest.raises(ValueError, match="1 learning rates for 2 GANs"):
        train_independent(cfg, data, budget, [3, 3], learning_rates=[1e-4])


def test_a_gans_result_does_not_depend_on_the_others(float64: None) -> None:
    cfg = config()
    data = regions(cfg, [150, 150, 150])
    budget = Budget(4, 4)
    three = weights(train_independent(cfg, data, budget, [1, 2, 3]))
    second_alone = weights(train_independent(cfg, data[1:2], budget, [2]))[0]
    for name, value in second_alone.items():
        torch.testing.assert_close(three[1][name], value, rtol=1e-9, atol=1e-11)
    assert not torch.equal(three[0]["G.net.0.weight"], three[1]["G.net.0.weight"]), "seeds differ, so do GANs"


def test_discriminator_steps_are_spread_evenly_between_generator_steps() -> None:
    budget = Budget(generator=4, discriminator=10)
    after = [budget.discriminator_steps_after(step) for step in range(4)]
    assert sum(after) == 10 and max(after) - min(after) <= 1
    assert [Budget(3, 3).discriminator_steps_after(s) for s in range(3)] == [1, 1, 1]
    assert sum(Budget(5, 2).discriminator_steps_after(s) for s in range(5)) == 2


def test_wrong_inputs_are_refused_with_what_to_change() -> None:
    cfg = config()
    data = regions(cfg, [100])
    with pytest.raises(ValueError, match="dataset 1 is empty"):
        train_independent(cfg, [data[0], regions(cfg, [0])[0]], Budget(1, 1), [1, 2])
    with pytest.raises(ValueError, match="1 datasets but 2 seeds"):
        train_independent(cfg, data, Budget(1, 1), [1, 2])
    conditional = config(network={"conditional": True})
    with pytest.raises(ValueError, match="network.conditional: false"):
        train_independent(conditional, data, Budget(1, 1), [1])


def test_networks_without_a_stacked_form_train_one_by_one() -> None:
    cfg = parse_config(tiny(data={"name": "gaussian_grid", "size": 64}))
    cfg = cfg.model_copy(update={"network": cfg.network.model_copy(update={"name": "dcgan"})})
    images = Dataset("noise", torch.rand(64, 1, 28, 28) * 2 - 1, None, "image")
    before = weights(train_independent(cfg, [images], Budget(1, 0), [0], stacked=False))[0]
    after = weights(train_independent(cfg, [images, images], Budget(2, 2), [0, 1]))
    assert set(after[0]) == set(before) and any(not torch.equal(after[0][k], before[k]) for k in before)
