"""Lipizzaner's MNIST CNN, and the trained weights Lipizzaner scored its MNIST FIDs with.

conv 1→10 (5×5), max-pool 2, ReLU; conv 10→20 (5×5), dropout2d while training, max-pool 2, ReLU;
flatten to 320; fc 320→50, ReLU, dropout while training; fc 50→10. The 10 logits are its features
(FID on 10 dimensions, as Lipizzaner computes it) and its class predictions (TVD). It sees images in
[−1, 1], as Lipizzaner normalises MNIST and as Palomino's generators make them.

Its parameters carry Lipizzaner's names (conv1, conv2, fc1, fc2), so the state dict of Lipizzaner's
own classifier, converted to safetensors, loads as it is (`palomino classifier import`). The bundled
file (weights/lipizzaner-mnist-cnn.safetensors, MIT, © 2018 ALFA: weights/NOTICE.md) is that
conversion of Lipizzaner's output/networks/mnist_cnn.pkl; it classifies 99.27 % of MNIST's test
digits. Here, in nn, because a cell's mixture score can use it (training.mixture.score: fid) and
the scorers do.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

ARCH = "lipizzaner"
IMAGE_SHAPE = (1, 28, 28)
CLASSES = 10
BUNDLED = Path(__file__).parent / "weights" / "lipizzaner-mnist-cnn.safetensors"


class LipizzanerNet(nn.Module):
    """Input: images in [0, 1], (N, 1, 28, 28) (`adapt_images` resizes others); features = logits."""

    def __init__(self, channels: int = 1, classes: int = CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()  # no parameters: only active in training, as in Lipizzaner's
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, classes)
        self.num_features = classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images * 2 - 1  # [0, 1] → [−1, 1], the range Lipizzaner's classifier was trained on
        x = F.relu(F.max_pool2d(self.conv1(x), 2))  # 28 → 24 → 12
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))  # 12 → 8 → 4: 20 × 4 × 4 = 320
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(F.dropout(x, training=self.training))

    def features_and_logits(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(images)
        return logits, logits


def lipizzaners_mnist_cnn(device: str | torch.device = "cpu") -> LipizzanerNet:
    """The network with Lipizzaner's own trained weights (the bundled file), in eval mode."""
    net = LipizzanerNet()
    net.load_state_dict(load_file(BUNDLED))
    return net.to(device).eval()
