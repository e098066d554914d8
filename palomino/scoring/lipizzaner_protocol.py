"""Lipizzaner's MNIST CNN as a scorer, and Lipizzaner's own FID protocol.

The network and its bundled weights live in palomino.nn.lipizzaner_cnn (a cell's mixture score
can use them too). The protocol is how Lipizzaner's published MNIST FIDs were computed (its
training/mixture/fid_score.py): the CNN's 10 logits as features, 1,000 generated images against
the first 1,000 training images, both in batches of 64 with the last partial batch dropped, so
960 of each are used. The real images are training images the GAN saw: the protocol measures
fit, not generalisation; the project's held-out protocol (benchmarks/quality.py) stands beside it.
"""

from __future__ import annotations

import torch

from palomino.nn.lipizzaner_cnn import ARCH, BUNDLED, CLASSES, IMAGE_SHAPE, LipizzanerNet, lipizzaners_mnist_cnn

__all__ = [
    "ARCH",
    "BUNDLED",
    "CLASSES",
    "IMAGE_SHAPE",
    "PROTOCOL_BATCH",
    "PROTOCOL_SAMPLES",
    "LipizzanerNet",
    "lipizzaners_mnist_cnn",
    "protocol_fid",
]

PROTOCOL_SAMPLES = 1000  # generated images, and the first this many training images
PROTOCOL_BATCH = 64  # Lipizzaner's scoring batch: whole batches only (960 of 1,000)


@torch.no_grad()
def protocol_fid(net: torch.nn.Module, generated: torch.Tensor, real: torch.Tensor) -> float:
    """Lipizzaner's FID of `generated` against `real` (images in [0, 1], N × 1 × 28 × 28; pass the
    first 1,000 of each): logits of whole batches of 64 only, then the Fréchet distance."""
    from palomino.coevolution.ensemble_search import feature_fid

    def logits(images: torch.Tensor) -> torch.Tensor:
        used = len(images) // PROTOCOL_BATCH * PROTOCOL_BATCH
        if used < 2:
            raise ValueError(f"Lipizzaner's FID needs at least one batch of {PROTOCOL_BATCH} images, got {len(images)}")
        batches = images[:used].reshape(-1, *IMAGE_SHAPE).float().split(PROTOCOL_BATCH)
        return torch.cat([net(batch) for batch in batches])

    return feature_fid(logits(generated), logits(real))
