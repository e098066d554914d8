"""Snapshot exchange over the local RabbitMQ: publish→receive latency and bytes, and the share of
an iteration that cells spend communicating or waiting in a `palomino up` run.

    python benchmarks/exchange.py                      # latency for mlp and dcgan snapshots
    python benchmarks/exchange.py --runs runs/a runs/b # + time shares from finished run directories
    python benchmarks/exchange.py --bytes              # bytes a cell publishes an iteration, and a 32×32 grid

Target (issue 3): p50 ≤ 20 ms for an mlp snapshot (Lipizzaner: ~0.5 s per exchange over HTTP),
communication + waiting ≤ 5 % of an iteration. Baseline in the same run: encoding + decoding
the same snapshot in memory, so the broker's own share is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import time
from pathlib import Path

import torch

from palomino.coevolution import Cell, cell_state
from palomino.config import ExperimentConfig
from palomino.data.dataset import Dataset
from palomino.grid import Coord, Topology
from palomino.transport.rabbitmq import RabbitSnapshotBus
from palomino.wire import decode_snapshot, encode_snapshot

BROKER = os.environ.get("PALOMINO_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/")


def snapshot_of(network: str):
    config = ExperimentConfig.model_validate({"network": {"name": network}, "grid": {"rows": 1, "cols": 2}})
    data = Dataset("bench", torch.rand(256, 1, 28, 28) * 2 - 1, None, "image")
    cell = Cell(Coord(0, 0), Topology(1, 2), config, data, experiment="bench")
    return cell.snapshot()


def published_bytes(network: str, migration: float) -> dict:
    """What one cell publishes an iteration after training (Adam state present), and what it
    published before issue 35 (weights and both moments, whatever the migration)."""
    config = ExperimentConfig.model_validate(
        {
            "network": {"name": network, "latent_dim": 64, **({"hidden": 256} if network == "mlp" else {})},
            "grid": {"rows": 1, "cols": 2},
            "training": {"batch_size": 16, "batches_per_iteration": 1, "selection": {"migration": migration}},
        }
    )
    # Bytes depend on the shapes only: random images of MNIST's shape will do.
    data = Dataset("bench", torch.rand(256, 1, 28, 28) * 2 - 1, None, "image")
    cell = Cell(Coord(0, 0), Topology(1, 2), config, data, experiment="bench")
    cell.iterate({})
    now, full = encode_snapshot(cell.snapshot()), encode_snapshot(cell_state.snapshot(cell, moments=True))
    parameters = sum(p.numel() for p in cell.generators.best.network.parameters())
    parameters += sum(p.numel() for p in cell.discriminators.best.network.parameters())
    return {"network": network, "migration": migration, "parameters": parameters, "now": len(now), "before": len(full)}


def print_bytes() -> None:
    # Each published snapshot is stored once by the broker and delivered to every neighbour's
    # queue and the coordinate's last-value queue: von Neumann 4 + 1 copies, Moore 8 + 1.
    print(f"{'network':<8} {'migration':>9} {'parameters':>10} {'before B':>11} {'now B':>11} {'now/before':>10} "
          f"{'32×32 vN GB':>12} {'32×32 Moore GB':>15}")  # fmt: skip
    for network in ("mlp", "dcgan"):
        for migration in (0.0, 0.5):
            row = published_bytes(network, migration)
            grid = [1024 * copies * row["now"] / 1e9 for copies in (5, 9)]
            print(
                f"{network:<8} {migration:>9} {row['parameters']:>10,} {row['before']:>11,} {row['now']:>11,} "
                f"{row['now'] / row['before']:>10.3f} {grid[0]:>12.2f} {grid[1]:>15.2f}"
            )
    print("target (issue 35): MNIST perceptron (mlp) ≤ 2.3 MB a cell-iteration without migration")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(network: str, count: int) -> dict:
    snapshot = snapshot_of(network)
    body = encode_snapshot(snapshot)
    start = time.perf_counter()
    for _ in range(count):
        decode_snapshot(encode_snapshot(snapshot))
    codec_ms = (time.perf_counter() - start) / count * 1000
    experiment = f"bench-{secrets.token_hex(3)}"
    snapshot.header.experiment = experiment
    async with RabbitSnapshotBus(BROKER, experiment) as sender, RabbitSnapshotBus(BROKER, experiment) as receiver:
        await receiver.bind([Coord(0, 0)], epoch=0)
        times = []
        for i in range(count):
            snapshot.header.iteration = i
            sent = time.perf_counter()
            await sender.publish(snapshot)
            await receiver.wait(Coord(0, 0), i, timeout=30)
            times.append((time.perf_counter() - sent) * 1000)
    return {
        "network": network,
        "bytes": len(body),
        "p50_ms": statistics.median(times),
        "p99_ms": percentile(times, 0.99),
        "codec_ms": codec_ms,
    }


def shares(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    total = sum(sum(r["seconds"].values()) for r in records)
    wait = sum(r["seconds"]["wait"] for r in records)
    comm = sum(r["seconds"]["communicate"] for r in records)
    return {
        "run": run_dir.name,
        "records": len(records),
        "wait_pct": 100 * wait / total,
        "communicate_pct": 100 * comm / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--network", nargs="+", default=["mlp", "dcgan"])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument(
        "--runs", nargs="*", type=Path, default=[], help="finished run directories to read time shares from"
    )
    parser.add_argument("--bytes", action="store_true", help="only the bytes a cell publishes an iteration")
    args = parser.parse_args()
    if args.bytes:
        print_bytes()
        return
    print(f"{'network':<8} {'bytes':>10} {'p50 ms':>8} {'p99 ms':>8} {'codec ms':>9} {'broker/codec':>13}")
    for network in args.network:
        row = asyncio.run(latency(network, args.count))
        ratio = row["p50_ms"] / row["codec_ms"]
        print(
            f"{row['network']:<8} {row['bytes']:>10} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['codec_ms']:>9.2f} {ratio:>13.1f}"
        )
    print("target: mlp p50 ≤ 20 ms")
    for run in args.runs:
        s = shares(run)
        print(
            f"{s['run']}: {s['records']} cell-iterations, waiting {s['wait_pct']:.1f} %, communicating {s['communicate_pct']:.1f} % (target: together ≤ 5 %)"
        )


if __name__ == "__main__":
    main()
