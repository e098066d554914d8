"""Does the dashboard keep up with a 12×12 grid publishing every cell's metrics once a second?

    python benchmarks/dashboard_load.py                   # 12×12, 20 s idle baseline, 60 s of load
    python benchmarks/dashboard_load.py --feed runs       # the records appended to metrics.jsonl instead

A real `palomino dashboard` process and Debian's headless Chromium (Playwright) show one
experiment's page with a cell's charts open. First a baseline with no events (the same page, the
same open charts), then the load: every cell publishes one metrics record per second — through
the orchestrator's own publisher on `palomino.events` (`--feed broker`), or appended to the run's
metrics.jsonl as `palomino train` does (`--feed runs`).

Printed: events the page received against those sent, how far the heat map lags behind the
newest iteration sent (sampled once a second), the dashboard's and the browser's CPU (% of one
core, from /proc) and the renderer's busy time (Chrome's Performance metrics), each with its
ratio to the idle baseline. Target: lag ≤ 2 iterations (2 s) and both processes well under one
core (≤ 25 %).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from palomino.config import parse_config
from palomino.grid import Topology
from palomino.runs.directory import RunDirectory
from palomino.services.local import free_port
from palomino.transport.control_channel import ControlChannel

BROKER = os.environ.get("PALOMINO_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/")
TICK = os.sysconf("SC_CLK_TCK")


# ---- CPU from /proc -----------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu(root: int, only: str | None = None) -> float:
    """CPU seconds of `root` and its descendants (those whose executable's path contains `only`)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := proc_stat(int(entry))) is not None:
            parents[int(entry)], cpu[int(entry)] = found
    total = 0.0
    for pid in cpu:
        ancestor = pid
        while ancestor not in (root, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor != root:
            continue
        if only is not None:
            try:
                if only not in os.readlink(f"/proc/{pid}/exe"):
                    continue
            except OSError:
                continue
        total += cpu[pid]
    return total


# ---- the load ----------------------------------------------------------------------------------


def record(row: int, col: int, iteration: int, rows: int, cols: int, rng: random.Random) -> dict:
    """A metrics.jsonl line as a cell writes it (the same fields and sizes)."""
    neighbours = [
        f"{(row - 1) % rows}-{col}",
        f"{(row + 1) % rows}-{col}",
        f"{row}-{(col - 1) % cols}",
        f"{row}-{(col + 1) % cols}",
    ]
    weights = [rng.random() for _ in range(5)]
    return {
        "iteration": iteration, "cell": [row, col], "epoch": 0,
        "generator": {"loss": rng.uniform(0.5, 2), "fitness": rng.uniform(-1, 1), "learning_rate": 2e-4 * rng.uniform(0.9, 1.1)},
        "discriminator": {"loss": rng.uniform(0.5, 2), "fitness": rng.uniform(-1, 1), "learning_rate": 2e-4 * rng.uniform(0.9, 1.1)},
        "losses_used": {rng.choice(["minimax", "mse", "nonsaturating"]): 20},
        "score": rng.uniform(0, 0.5),
        "mixture": dict(zip([f"{row}-{col}", *neighbours], (w / sum(weights) for w in weights))),
        "neighbours": {n: max(0, iteration - rng.randint(0, 1)) for n in neighbours},
        "seconds": {"wait": rng.uniform(0, 0.01), "train": rng.uniform(0.5, 0.9), "communicate": rng.uniform(0, 0.01)},
    }  # fmt: skip


async def publish_load(run: RunDirectory, feed: str, rows: int, cols: int, seconds: float, sent: list[int]) -> None:
    """Every cell once a second, spread over the second; sent[0] = the newest iteration fully sent."""
    rng = random.Random(0)
    channel = (
        await ControlChannel(BROKER, f"cell.dashboard-bench-{os.getpid()}").connect() if feed == "broker" else None
    )
    start = time.monotonic()
    try:
        iteration = 0
        while time.monotonic() - start < seconds:
            second = start + iteration
            cells = [(r, c) for r in range(rows) for c in range(cols)]
            for k, (r, c) in enumerate(cells):
                await asyncio.sleep(max(0.0, second + k / len(cells) - time.monotonic()))
                line = record(r, c, iteration, rows, cols, rng)
                if channel is not None:
                    await channel.event(run.experiment, "metrics", {"record": line})
                else:
                    run.append_metrics(line)
            sent[0] = iteration
            iteration += 1
    finally:
        if channel is not None:
            await channel.close()


# ---- one measurement ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--cols", type=int, default=12)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle baseline")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--feed", choices=["broker", "runs"], default="broker")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="palomino-dashboard-load-"))
    config = parse_config(
        {"name": "load", "grid": {"rows": args.rows, "cols": args.cols}, "training": {"iterations": 10_000}}
    )
    run = RunDirectory.create(folder, config)
    run.append_topology(
        Topology(args.rows, args.cols), {f"{r}-{c}": f"w{r}-{c}" for r in range(args.rows) for c in range(args.cols)}
    )
    port = free_port()
    command = [sys.executable, "-m", "palomino", "dashboard", "--runs", str(folder), "--port", str(port)]
    if args.feed == "broker":
        command += ["--broker", BROKER]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    dashboard = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=open(folder / "dashboard.log", "wb")
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if dashboard.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the dashboard did not start:\n{(folder / 'dashboard.log').read_text()}")
            time.sleep(0.3)

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            page.goto(f"{url}/#/exp/{run.experiment}/cell/{args.rows // 2}-{args.cols // 2}")
            tiles = args.rows * args.cols
            page.wait_for_function(
                f"() => document.querySelectorAll('#heatmap .tile').length === {tiles}", timeout=60_000
            )

            def busy() -> float:
                metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
                return metrics["TaskDuration"]

            def measure(seconds: float, during=None) -> dict:
                cpu0 = (tree_cpu(dashboard.pid), tree_cpu(os.getpid(), only="chrom"), busy())
                began = time.monotonic()
                samples = during(began) if during else time.sleep(seconds)
                elapsed = time.monotonic() - began
                cpu1 = (tree_cpu(dashboard.pid), tree_cpu(os.getpid(), only="chrom"), busy())
                return {
                    "seconds": elapsed,
                    "server": 100 * (cpu1[0] - cpu0[0]) / elapsed,
                    "browser": 100 * (cpu1[1] - cpu0[1]) / elapsed,
                    "renderer": 100 * (cpu1[2] - cpu0[2]) / elapsed,
                    "samples": samples or [],
                }

            idle = measure(args.idle)

            sent = [-1]
            loop = asyncio.new_event_loop()
            import threading

            publisher = threading.Thread(
                target=lambda: loop.run_until_complete(
                    publish_load(run, args.feed, args.rows, args.cols, args.seconds, sent)
                )
            )

            def under_load(began: float) -> list[tuple[int, int, int]]:
                publisher.start()
                samples = []
                while publisher.is_alive():
                    time.sleep(1.0)
                    shown = page.eval_on_selector_all(
                        "#heatmap .tile", "ts => ts.map(t => t.dataset.iteration === '' ? -1 : +t.dataset.iteration)"
                    )
                    samples.append((sent[0], min(shown), page.evaluate("window.palomino.events")))
                publisher.join()
                return samples

            loaded = measure(args.seconds, under_load)
            time.sleep(2.0)
            received = page.evaluate("window.palomino.events")
            frames = page.evaluate("window.palomino.frames")
            shown = page.eval_on_selector_all("#heatmap .tile", "ts => ts.map(t => +t.dataset.iteration)")
            browser.close()
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=15)

    lags = [max(0, s - m) for s, m, _ in loaded["samples"][2:] if s >= 0]  # skip the first seconds (warm-up)
    total = (sent[0] + 1) * args.rows * args.cols
    print(
        f"grid {args.rows}×{args.cols}, feed {args.feed}: {total} records sent in {loaded['seconds']:.0f} s "
        f"({total / loaded['seconds']:.0f}/s); the page received {received} events ({frames} frames drawn)"
    )
    print(f"after the load every tile shows iteration {min(shown)}–{max(shown)} (newest sent: {sent[0]})")
    if lags:
        print(
            f"heat map lag behind the newest iteration sent (1 s each): median {statistics.median(lags):.0f}, max {max(lags)} "
            f"(over {len(lags)} samples)   target ≤ 2"
        )
    print(f"{'':12}{'idle %core':>12}{'load %core':>12}{'load/idle':>11}")
    for key, label in (("server", "dashboard"), ("browser", "chromium"), ("renderer", "renderer*")):
        ratio = loaded[key] / idle[key] if idle[key] > 0.05 else float("inf")
        print(f"{label:12}{idle[key]:12.1f}{loaded[key]:12.1f}{ratio:11.1f}")
    print("* renderer: Chrome's TaskDuration (the page's main thread busy time), as % of wall time")
    print(f"(run directory and dashboard log: {folder})")
    json.dump(
        {
            "idle": idle,
            "loaded": {k: v for k, v in loaded.items() if k != "samples"},
            "lags": lags,
            "received": received,
            "sent": total,
        },
        open(folder / "result.json", "w"),
        indent=2,
    )


if __name__ == "__main__":
    main()
