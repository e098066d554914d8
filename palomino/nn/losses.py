"""GAN losses on raw discriminator logits: minimax and non-saturating BCE, least squares, WGAN-GP.

Names say what the generator optimises. Lipizzaner's "BCE" is the non-saturating form
(`nonsaturating`); Goodfellow's original saturating game is `minimax`.

Networks output logits; the sigmoid lives here (softplus forms are the numerically stable
BCE: −log σ(x) = softplus(−x), −log(1 − σ(x)) = softplus(x)). Every loss is minimised.
Losses average over the last axis: logits (B,) give a scalar, a tile's stacked logits
(members, B) one loss per member.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from palomino.config.models import RENAMED_LOSSES, renamed_loss
from palomino.errors import ConfigError


class GanLoss:
    """A generator loss and a discriminator loss; stateless, so one instance serves every cell."""

    name: str
    gp_weight: float = 0.0  # weight of a gradient penalty on D; 0 = none

    def generator(self, d_fake: Tensor) -> Tensor:
        """Generator's loss from D's logits on its samples (B,) → scalar."""
        raise NotImplementedError

    def discriminator_from_logits(self, d_real: Tensor, d_fake: Tensor) -> Tensor:
        """Discriminator's loss from precomputed logits, without any penalty (fitness reuses it)."""
        raise NotImplementedError

    def discriminator(
        self,
        D: nn.Module,
        real: Tensor,
        fake: Tensor,
        *,
        penalty: bool = True,
        generator: torch.Generator | None = None,
        labels: Tensor | None = None,
        eps: Tensor | None = None,
    ) -> Tensor:
        """Discriminator's loss on a batch. `fake` is detached: this loss trains D only.

        `penalty=False` skips any gradient penalty (cheap fitness evaluation); `generator`
        seeds the penalty's randomness (WGAN-GP's interpolation), for deterministic runs, unless
        `eps` gives the interpolation itself (drawn ahead, as a cell's iteration plan does).
        `labels`: a conditional D's labels, shared by `real` and `fake` (fakes are generated
        with the real batch's labels, so a penalty's interpolated pairs have one label).
        """
        fake = fake.detach()
        if labels is None:
            loss = self.discriminator_from_logits(D(real), D(fake))
        else:
            loss = self.discriminator_from_logits(D(real, labels), D(fake, labels))
        if penalty and self.gp_weight:
            critic = D if labels is None else (lambda x: D(x, labels[: len(x)]))
            loss = loss + self.gp_weight * gradient_penalty(critic, real, fake, generator=generator, eps=eps)
        return loss


class MinimaxLoss(GanLoss):
    """Goodfellow's minimax game: G minimises E[log(1 − D(G(z)))], which saturates early on."""

    name = "minimax"

    def generator(self, d_fake: Tensor) -> Tensor:
        return -F.softplus(d_fake).mean(-1)

    def discriminator_from_logits(self, d_real: Tensor, d_fake: Tensor) -> Tensor:
        return F.softplus(-d_real).mean(-1) + F.softplus(d_fake).mean(-1)


class NonSaturatingLoss(MinimaxLoss):
    """Non-saturating: G maximises log D(G(z)) instead, i.e. BCE against the 'real' label
    (what Lipizzaner and Mustangs call BCE)."""

    name = "nonsaturating"

    def generator(self, d_fake: Tensor) -> Tensor:
        return F.softplus(-d_fake).mean(-1)


class MSELoss(GanLoss):
    """Least squares on sigmoid outputs, as Lipizzaner/Mustangs do (D ends in Sigmoid + MSELoss)."""

    name = "mse"

    def generator(self, d_fake: Tensor) -> Tensor:
        return (torch.sigmoid(d_fake) - 1).square().mean(-1)

    def discriminator_from_logits(self, d_real: Tensor, d_fake: Tensor) -> Tensor:
        return (torch.sigmoid(d_real) - 1).square().mean(-1) + torch.sigmoid(d_fake).square().mean(-1)


class WGANGPLoss(GanLoss):
    """Wasserstein critic with gradient penalty (Gulrajani et al. 2017); logits are critic scores."""

    name = "wgan_gp"
    gp_weight = 10.0

    def generator(self, d_fake: Tensor) -> Tensor:
        return -d_fake.mean(-1)

    def discriminator_from_logits(self, d_real: Tensor, d_fake: Tensor) -> Tensor:
        return d_fake.mean(-1) - d_real.mean(-1)


def gradient_penalty(
    D: nn.Module | Callable[[Tensor], Tensor],
    real: Tensor,
    fake: Tensor,
    *,
    generator: torch.Generator | None = None,
    eps: Tensor | None = None,
) -> Tensor:
    """E[(‖∇D(x̂)‖₂ − 1)²] on x̂ drawn uniformly on the segments between paired real and fake samples."""
    n = min(len(real), len(fake))  # pair what we have: fitness batches may differ in size
    real, fake = real[:n].detach(), fake[:n].detach()
    # Draw on the generator's device (a CPU generator cannot fill a CUDA tensor), then move.
    if eps is None:
        device = generator.device if generator is not None else real.device
        eps = torch.rand((n,) + (1,) * (real.dim() - 1), generator=generator, device=device)
    eps = eps[:n].to(real)
    x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
    # create_graph: the penalty itself is differentiated when D takes its step.
    (grad,) = torch.autograd.grad(D(x_hat).sum(), x_hat, create_graph=True)
    return (grad.flatten(1).norm(2, dim=1) - 1).square().mean(-1)


_LOSSES: dict[str, GanLoss] = {
    loss.name: loss for loss in (MinimaxLoss(), NonSaturatingLoss(), MSELoss(), WGANGPLoss())
}
LOSS_NAMES: tuple[str, ...] = tuple(_LOSSES)


def get_loss(name: str) -> GanLoss:
    """The loss called `name`, one of LOSS_NAMES."""
    try:
        return _LOSSES[name]
    except KeyError:
        if name in RENAMED_LOSSES:
            raise ConfigError(renamed_loss(name)) from None
        raise ConfigError(f"unknown loss {name!r}; choose one of {', '.join(LOSS_NAMES)}") from None
