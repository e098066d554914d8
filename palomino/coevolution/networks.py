"""A cell's networks: new individuals from its seed, and neighbours' snapshots as individuals."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from palomino.coevolution.individual import Individual, Role, make_adam
from palomino.config import ExperimentConfig
from palomino.grid import Coord
from palomino.nn import build_discriminator, build_generator
from palomino.nn.host import upload
from palomino.wire import IndividualMeta, Snapshot


class Networks:
    """Builds the cell's networks, each seeded from the cell's random stream."""

    def __init__(
        self,
        config: ExperimentConfig,
        sample_shape: tuple[int, ...],
        kind: str,
        label_count: int | None,
        rng: np.random.Generator,
        device: torch.device,
    ) -> None:
        self.config, self.sample_shape, self.kind, self.label_count = config, sample_shape, kind, label_count
        self.rng, self.device = rng, device

    def build(self, role: Role, seed: int | None = None) -> nn.Module:
        build = build_generator if role == "generator" else build_discriminator
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.rng.integers(2**62)) if seed is None else seed)
            return build(self.config.network, self.sample_shape, self.kind, self.label_count).to(self.device)

    def individual(self, role: Role, origin: Coord) -> Individual:
        network = self.build(role)
        lr = self.config.training.learning_rate
        optimizer = make_adam(network, lr, self.config.training.adam_betas)
        return Individual(role, network, optimizer, lr, origin=str(origin))


class NeighbourSlots:
    """Neighbours' snapshots as individuals, in modules reused from one iteration to the next."""

    def __init__(self, networks: Networks) -> None:
        self.networks = networks
        self._slots: dict[tuple[Coord, Role], nn.Module] = {}

    def clear(self) -> None:
        self._slots.clear()

    def individual(self, snapshot: Snapshot, role: Role) -> Individual:
        coord = Coord(*snapshot.header.cell)
        meta: IndividualMeta = getattr(snapshot.header, role)
        key = (coord, role)
        if key not in self._slots:
            # Weights come from the snapshot next, so the seed is irrelevant: a fixed one keeps
            # the cell's random stream the same for a fresh and a restored cell.
            self._slots[key] = self.networks.build(role, seed=0)
        network = self._slots[key]
        betas = self.networks.config.training.adam_betas
        optimizer = make_adam(network, meta.learning_rate, betas)
        individual = Individual(role, network, optimizer, meta.learning_rate, meta.fitness, meta.loss, str(coord))
        individual.load_tensors(tensors_on(self.networks.device, snapshot.tensors, role + "."), role)
        return individual


def tensors_on(device: torch.device, tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix`, on `device` (not the whole snapshot once per role), uploaded
    without waiting. Adam's step counts stay on the host, where torch's Adam keeps them: on the
    device each would cost a sync to load and one more at every step (`.item()`)."""
    return {k: v if k.endswith(".step") else upload(v, device) for k, v in tensors.items() if k.startswith(prefix)}
