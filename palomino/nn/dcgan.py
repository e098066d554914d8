"""DCGAN generator and discriminator for 28×28, 32×32 and 64×64 images; SNGAN's discriminator.

One table drives all sizes. Each row gives the side of the smallest feature map and the
channel multipliers (× width) of the maps from smallest to largest; every step between
two maps is a stride-2 4×4 (transposed) convolution, which doubles (halves) the side.
  28: 7×7 (4w) → 14×14 (2w) → 28×28
  32: 4×4 (4w) → 8×8 (2w) → 16×16 (w) → 32×32
  64: 4×4 (8w) → 8×8 (4w) → 16×16 (2w) → 32×32 (w) → 64×64
"""

from __future__ import annotations

import itertools

from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm

SIZES: dict[int, tuple[int, tuple[int, ...]]] = {
    28: (7, (4, 2)),
    32: (4, (4, 2, 1)),
    64: (4, (8, 4, 2, 1)),
}


def dcgan_init_(module: nn.Module) -> None:
    """Radford et al.: weights N(0, 0.02), BatchNorm scale N(1, 0.02), biases 0."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


class DCGANGenerator(nn.Module):
    """z → linear → (m0·w, s, s) → [ConvT + BN + ReLU]* → ConvT → tanh, (B, C, H, W)."""

    def __init__(self, latent_dim: int, width: int, channels: int, size: int):
        super().__init__()
        side, mults = SIZES[size]
        chans = [m * width for m in mults]
        self.latent_dim = latent_dim
        self.sample_shape = (channels, size, size)
        self.first_shape = (chans[0], side, side)
        self.project = nn.Linear(latent_dim, chans[0] * side * side)
        layers: list[nn.Module] = [nn.BatchNorm2d(chans[0]), nn.ReLU()]
        for c_in, c_out in itertools.pairwise(chans):
            layers += [nn.ConvTranspose2d(c_in, c_out, 4, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
        layers += [nn.ConvTranspose2d(chans[-1], channels, 4, 2, 1), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        dcgan_init_(self)

    def forward(self, z: Tensor) -> Tensor:
        return self.net(self.project(z).view(z.shape[0], *self.first_shape))


class DCGANDiscriminator(nn.Module):
    """(B, C, H, W) → [Conv stride 2 (+ BN) + LeakyReLU(0.2)]* → linear → (B,) logits.

    `spectral=True` is SNGAN's discriminator (Miyato et al. 2018): no BatchNorm, and spectral
    normalisation on every conv and linear weight, which bounds D's Lipschitz constant.
    """

    def __init__(self, width: int, channels: int, size: int, *, spectral: bool = False):
        super().__init__()
        side, mults = SIZES[size]
        chans = [m * width for m in reversed(mults)]  # largest map first
        layers: list[nn.Module] = [nn.Conv2d(channels, chans[0], 4, 2, 1), nn.LeakyReLU(0.2)]
        for c_in, c_out in itertools.pairwise(chans):
            # No BN on the first layer (DCGAN), none at all under spectral norm (SNGAN).
            norm = nn.Identity() if spectral else nn.BatchNorm2d(c_out)
            layers += [nn.Conv2d(c_in, c_out, 4, 2, 1, bias=spectral), norm, nn.LeakyReLU(0.2)]
        self.net = nn.Sequential(*layers)
        self.head = nn.Linear(chans[-1] * side * side, 1)
        dcgan_init_(self)
        if spectral:  # after init: spectral_norm's power iteration starts from these weights
            for m in list(self.modules()):
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    spectral_norm(m)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.net(x).flatten(1)).squeeze(1)
