"""Helpers that several test modules share and that need torch (conftest.py stays torch-free at
import). Test modules import from here, never from one another."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from palomino.config.models import ExperimentConfig
from palomino.grid import Coord, Topology
from palomino.runs.directory import RunDirectory
from palomino.services.common.service_settings import ServiceSettings
from palomino.services.orchestrator.experiment import Experiment, Worker
from palomino.services.orchestrator.orchestrator import Orchestrator
from palomino.wire.control_messages import Done


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


# ---- an orchestrator with a running 2×2 experiment, its control channel a recorder ---------------


class RecordingControl:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []
        self.events: list[tuple[str, dict]] = []

    async def send(self, address: str, message: object, payload: bytes = b"") -> None:
        self.sent.append((address, message))

    async def event(self, experiment: str, kind: str, body: dict) -> None:
        self.events.append((kind, body))


def orchestrator_without_broker(runs: Path) -> Orchestrator:
    """An orchestrator over `runs` whose control channel is a recorder and that has no last-value queues."""
    orchestrator = Orchestrator(ServiceSettings(), runs)
    orchestrator.control = RecordingControl()

    async def no_queue(experiment: Experiment, coord: Coord) -> None:
        pass

    orchestrator.placement.forget_published = no_queue  # no last-value queues without a broker
    return orchestrator


def running_2x2(tmp_path: Path) -> tuple[Orchestrator, Experiment]:
    orchestrator = orchestrator_without_broker(tmp_path)
    config = ExperimentConfig.model_validate(
        {"name": "race", "grid": {"rows": 2, "cols": 2}, "distributed": {"min_cells": 2}, "scoring": {"final": False}}
    )
    experiment = Experiment("race-1", config, RunDirectory.create(tmp_path, config), state="running")
    experiment.topology = Topology(2, 2, config.grid.neighbourhood, epoch=0)
    experiment.cells = {Coord(0, 0): "w0", Coord(0, 1): "w1", Coord(1, 0): "w2", Coord(1, 1): "w3"}
    for coord, worker in experiment.cells.items():
        orchestrator.workers[worker] = Worker(worker, experiment=experiment.id, coord=coord, idle=False)
    orchestrator.experiments[experiment.id] = experiment
    return orchestrator, experiment


def done(worker: str, coord: tuple[int, int]) -> Done:
    return Done(
        experiment="race-1", worker=worker, coord=coord, iteration=9, score=0.1, components=[], weights=[], mixture={}
    )


# ---- raw broker traffic, as an attacker or an older sender would publish it -----------------------


async def publish_raw(broker: str, exchange: str, key: str, body: bytes, headers: dict | None = None) -> None:
    """One message published as is (no signing of ours): forged, unsigned or a captured copy."""
    import aio_pika

    connection = await aio_pika.connect(broker)
    async with connection:
        channel = await connection.channel()
        target = await channel.get_exchange(exchange)
        await target.publish(aio_pika.Message(body, headers=headers), routing_key=key)


def tiny_snapshot(experiment: str, iteration: int):
    """A snapshot of cell 0-1 with one small tensor (its values: the iteration)."""
    from palomino.wire import IndividualMeta, Snapshot, SnapshotHeader

    meta = IndividualMeta(learning_rate=0.001, fitness=0.5, loss="minimax")
    header = SnapshotHeader(experiment=experiment, cell=(0, 1), iteration=iteration, generator=meta, discriminator=meta)
    return Snapshot(header, {"generator.net.w": torch.zeros(4) + iteration})
