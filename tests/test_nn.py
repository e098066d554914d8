"""palomino.nn: network shapes, config errors, loss values, gradients, safetensors round trip."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load, save
from torch import nn

from palomino.errors import ConfigError
from palomino.nn import LOSS_NAMES, build_discriminator, build_generator, get_loss

LN2 = math.log(2)


def spec(name: str, **overrides: int) -> SimpleNamespace:
    # Small widths keep the conv nets quick on CPU.
    return SimpleNamespace(**{"name": name, "latent_dim": 8, "hidden": 16, "width": 4, **overrides})


def build(name: str, shape: tuple[int, ...], kind: str = "image", seed: int = 0) -> tuple[nn.Module, nn.Module]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build_generator(spec(name), shape, kind), build_discriminator(spec(name), shape, kind)


CASES = [
    ("mlp", (2,), "points"),
    ("mlp", (1, 28, 28), "image"),
    *[(name, shape, "image") for name in ("dcgan", "sngan") for shape in [(1, 28, 28), (3, 32, 32), (3, 64, 64)]],
]


@pytest.mark.parametrize(("name", "shape", "kind"), CASES)
def test_shapes(name: str, shape: tuple[int, ...], kind: str) -> None:
    G, D = build(name, shape, kind)
    assert G.latent_dim == 8
    x = G(torch.randn(5, 8))
    assert x.shape == (5, *shape)
    assert D(x).shape == (5,)
    if kind == "image":  # tanh output
        assert x.abs().max() <= 1


def test_points_generator_is_linear_out() -> None:
    G, _ = build("mlp", (2,), "points")
    assert not isinstance(G.net[-1], nn.Tanh)
    G.net[-2].bias.data.fill_(5.0)  # a tanh output could never reach 5
    assert (G(torch.zeros(3, 8)) > 1).all()


def test_build_is_deterministic_under_seed() -> None:
    (g1, d1), (g2, d2) = build("sngan", (1, 28, 28)), build("sngan", (1, 28, 28))
    for a, b in [(g1, g2), (d1, d2)]:
        for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(v, w), k


def test_dcgan_init() -> None:
    G, D = build("dcgan", (3, 64, 64), seed=1)
    conv = [m for m in D.modules() if isinstance(m, nn.Conv2d)][1]
    bn = next(m for m in G.modules() if isinstance(m, nn.BatchNorm2d))
    assert abs(conv.weight.std().item() - 0.02) < 0.002
    assert abs(bn.weight.mean().item() - 1) < 0.01 and bn.weight.std().item() < 0.05


def test_sngan_discriminator_has_spectral_norm_and_no_batchnorm() -> None:
    _, D = build("sngan", (3, 32, 32))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in D.modules())
    layers = [m for m in D.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert layers and all(hasattr(m, "parametrizations") for m in layers)


@pytest.mark.parametrize("shape", [(1, 48, 48), (3, 32, 16), (1, 14, 14)])
@pytest.mark.parametrize("name", ["dcgan", "sngan"])
def test_unsupported_image_size(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError, match=r"28×28.*32×32.*64×64.*mlp.*image_size"):
        build_generator(spec(name), shape, "image")
    with pytest.raises(ConfigError):
        build_discriminator(spec(name), shape, "image")


@pytest.mark.parametrize("name", ["dcgan", "sngan"])
def test_conv_networks_refuse_points(name: str) -> None:
    with pytest.raises(ConfigError, match="mlp"):
        build_generator(spec(name), (2,), "points")


def test_unknown_network() -> None:
    with pytest.raises(ConfigError, match="mlp, dcgan, sngan"):
        build_discriminator(spec("resnet"), (1, 28, 28), "image")


# --- losses -----------------------------------------------------------------------------


def test_loss_registry() -> None:
    assert set(LOSS_NAMES) == {"minimax", "nonsaturating", "mse", "wgan_gp"}
    assert all(get_loss(n).name == n for n in LOSS_NAMES)
    with pytest.raises(ConfigError, match="minimax, nonsaturating, mse, wgan_gp"):
        get_loss("hinge")


ZERO = torch.zeros(4)


@pytest.mark.parametrize(
    ("name", "d_loss", "g_loss"),
    [("minimax", 2 * LN2, -LN2), ("nonsaturating", 2 * LN2, LN2), ("mse", 0.5, 0.25), ("wgan_gp", 0.0, 0.0)],
)
def test_losses_at_zero_logits(name: str, d_loss: float, g_loss: float) -> None:
    loss = get_loss(name)
    assert loss.discriminator_from_logits(ZERO, ZERO).item() == pytest.approx(d_loss)
    assert loss.generator(ZERO).item() == pytest.approx(g_loss)


def log1p_exp(x: float) -> float:  # softplus by hand
    return math.log1p(math.exp(x))


def test_losses_at_other_logits() -> None:
    r, f = torch.tensor([2.0, -1.0]), torch.tensor([0.5, 3.0])
    sig = torch.sigmoid
    bce_d = (log1p_exp(-2) + log1p_exp(1)) / 2 + (log1p_exp(0.5) + log1p_exp(3)) / 2
    assert get_loss("minimax").discriminator_from_logits(r, f).item() == pytest.approx(bce_d)
    assert get_loss("nonsaturating").discriminator_from_logits(r, f).item() == pytest.approx(bce_d)
    assert get_loss("minimax").generator(f).item() == pytest.approx(-(log1p_exp(0.5) + log1p_exp(3)) / 2)
    assert get_loss("nonsaturating").generator(f).item() == pytest.approx((log1p_exp(-0.5) + log1p_exp(-3)) / 2)
    mse_d = ((sig(r) - 1) ** 2).mean() + (sig(f) ** 2).mean()
    assert get_loss("mse").discriminator_from_logits(r, f).item() == pytest.approx(mse_d.item())
    assert get_loss("mse").generator(f).item() == pytest.approx(((sig(f) - 1) ** 2).mean().item())
    assert get_loss("wgan_gp").discriminator_from_logits(r, f).item() == pytest.approx(1.75 - 0.5)
    assert get_loss("wgan_gp").generator(f).item() == pytest.approx(-1.75)


def test_bce_is_stable_for_huge_logits() -> None:
    big = torch.tensor([1e4, -1e4])
    for name in LOSS_NAMES:
        loss = get_loss(name)
        assert torch.isfinite(loss.discriminator_from_logits(big, big)) and torch.isfinite(loss.generator(big))


class Linear(nn.Module):
    """A linear critic D(x) = w·x, whose input gradient has norm ‖w‖ everywhere."""

    def __init__(self, w: list[float]):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


@pytest.mark.parametrize(("w", "penalty"), [([0.6, 0.8], 0.0), ([0.0, 2.0], 10.0), ([3.0, 0.0], 40.0)])
def test_wgan_gradient_penalty_of_linear_critic(w: list[float], penalty: float) -> None:
    D, wgan = Linear(w), get_loss("wgan_gp")
    real, fake = torch.randn(16, 2), torch.randn(16, 2)
    plain = (D(fake).mean() - D(real).mean()).item()
    assert wgan.discriminator(D, real, fake, penalty=False).item() == pytest.approx(plain)
    assert wgan.discriminator(D, real, fake).item() == pytest.approx(plain + penalty, abs=1e-4)


def test_wgan_penalty_generator_makes_it_deterministic() -> None:
    _, D = build("mlp", (2,), "points")
    real, fake = torch.randn(8, 2), torch.randn(8, 2)
    wgan = get_loss("wgan_gp")
    a = wgan.discriminator(D, real, fake, generator=torch.Generator().manual_seed(3))
    b = wgan.discriminator(D, real, fake, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def grads(module: nn.Module) -> list[torch.Tensor | None]:
    return [p.grad for p in module.parameters()]


@pytest.mark.parametrize("loss_name", LOSS_NAMES)
@pytest.mark.parametrize(
    ("name", "shape", "kind"),
    [("mlp", (2,), "points"), ("dcgan", (1, 28, 28), "image"), ("sngan", (3, 32, 32), "image")],
)
def test_losses_backpropagate(loss_name: str, name: str, shape: tuple[int, ...], kind: str) -> None:
    G, D = build(name, shape, kind)
    loss = get_loss(loss_name)
    real = torch.rand(4, *shape) * 2 - 1

    # Discriminator step: gradients reach D and, since fake is detached, not G.
    loss.discriminator(D, real, G(torch.randn(4, 8))).backward()
    assert all(g is not None and torch.isfinite(g).all() for g in grads(D))
    assert all(g is None for g in grads(G))
    assert any(g.abs().sum() > 0 for g in grads(D))

    # Generator step: gradients reach G through D.
    D.zero_grad(set_to_none=True)
    loss.generator(D(G(torch.randn(4, 8)))).backward()
    assert all(g is not None and torch.isfinite(g).all() for g in grads(G))
    assert any(g.abs().sum() > 0 for g in grads(G))


# --- safetensors round trip -------------------------------------------------------------


@pytest.mark.parametrize(("name", "shape", "kind"), CASES)
def test_state_dict_safetensors_round_trip(name: str, shape: tuple[int, ...], kind: str) -> None:
    G, D = build(name, shape, kind, seed=1)
    # Train-mode forwards move BN running stats and spectral norm's u, v: those must travel too.
    D(G(torch.randn(4, 8)))
    G2, D2 = build(name, shape, kind, seed=2)
    for src, dst in [(G, G2), (D, D2)]:
        sd = src.state_dict()
        assert all(isinstance(v, torch.Tensor) for v in sd.values())
        dst.load_state_dict(load(save({k: v.contiguous() for k, v in sd.items()})))
        src.eval()
        dst.eval()
    z = torch.randn(3, 8)
    x = G(z)
    assert torch.equal(x, G2(z))
    assert torch.equal(D(x), D2(x))


def test_minibatch_std_lets_the_discriminator_see_a_batch_that_does_not_vary() -> None:
    torch.manual_seed(0)
    D = build_discriminator(spec("mlp", minibatch_std=True), (2,), "points")
    x = torch.randn(1, 2)
    spread_out, collapsed = torch.cat([x, torch.randn(63, 2) * 3]), x.repeat(64, 1)
    # The same sample is judged differently by the company it keeps; a lone sample has no spread.
    assert not torch.allclose(D(spread_out)[0], D(collapsed)[0])
    assert D(x).shape == (1,) and torch.isfinite(D(x)).all()
    # Off, a sample's logit is its own, and the layers keep the keys checkpoints were saved under.
    plain = build_discriminator(spec("mlp"), (2,), "points")
    assert torch.allclose(plain(spread_out)[0], plain(collapsed)[0])
    assert plain.state_dict().keys() == D.state_dict().keys()


def test_minibatch_std_is_refused_where_the_network_has_none() -> None:
    from pydantic import ValidationError

    from palomino.config import NetworkConfig

    with pytest.raises(ValidationError, match="minibatch_std is for the mlp discriminator only"):
        NetworkConfig(name="dcgan", minibatch_std=True)
