"""Helpers that several test modules share and that need torch (conftest.py stays torch-free at
import). Test modules import from here, never from one another."""

from __future__ import annotations

import torch
from torch import nn


def mnist_classifier(dataset, seed: int = 0) -> tuple[nn.Module, float]:
    """A small perceptron trained on all but the last 2,000 images of `dataset` (MNIST's t10k split:
    8,000), tested on those 2,000; returns it and its test accuracy."""
    torch.manual_seed(seed)
    x, y = dataset.samples.flatten(1), dataset.labels
    net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(net.parameters(), 1e-3)
    train = len(x) - 2000
    for _ in range(3):
        order = torch.randperm(train)
        for start in range(0, train, 100):
            index = order[start : start + 100]
            loss = nn.functional.cross_entropy(net(x[index]), y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = float((net(x[train:]).argmax(1) == y[train:]).float().mean())
    return net.eval(), accuracy
