"""Every example's short run, hashed: its records (timings aside) and each cell's final checkpoint
(tensors and metadata, by the SHA-256s its sidecar holds). tests/test_example_runs.py compares
them with tests/fixtures/example_runs.json, so a restructuring that means to change no number
proves it; a change that means to change numbers rewrites the file on purpose:

    PALOMINO_DATA_DIR=… python tests/example_runs.py --write

The hashes are of this project's CPU (float rounding may differ on another kind of processor).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FIXTURE = Path(__file__).parent / "fixtures" / "example_runs.json"

# Three iterations of every example as it is, only shorter: few batches and small fitness draws.
SHRINK = [
    "training.iterations=3",
    "training.batches_per_iteration=3",
    "training.fitness.sample_size=64",
    "training.mixture.score_samples=64",
    "training.checkpoint_every=0",
    "training.sample_every=0",
    "training.synchronous=true",  # lockstep: an asynchronous cell's neighbours depend on timing
    # The result, which the hash leaves out, without sampling through three iterations' critics
    # (they reject most samples: ring-3x3's result took 34 s of its 37).
    "training.ensemble.critic_quantile=0",
]


def shortened(example: Path) -> Any:
    """`example`'s config as its short run trains it."""
    from palomino.config import load_config

    mnist = load_config(example).data.name == "mnist"
    return load_config(example, [*SHRINK, *(["data.split=test"] if mnist else [])])


def same_run() -> dict[Path, Path]:
    """Each example → the first example whose short run is the same run (its own config but the
    name: ring-3x3 is quickstart with more iterations), which is the one trained."""
    first: dict[str, Path] = {}
    out = {}
    for example in EXAMPLES:
        key = json.dumps(shortened(example).model_dump(mode="json", exclude={"name"}), sort_keys=True)
        out[example] = first.setdefault(key, example)
    return out


def run_hash(example: Path, folder: Path) -> str:
    """The SHA-256 of `example`'s short run (trained in this process, into `folder`). Each example
    keeps its own `tiles`: on a CPU the 2-D ones train as tiles and the image ones cell by cell, so
    both kinds of kernels of the one iteration path (iteration.py) are covered."""
    from palomino.data import load_dataset
    from palomino.engine.embedded import train_embedded
    from palomino.runs import RunDirectory

    cfg = shortened(example)
    run = RunDirectory.create(folder, cfg)
    asyncio.run(train_embedded(cfg, run, load_dataset(cfg.data, cfg.seed)))
    digest = hashlib.sha256()
    records = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    for record in sorted(records, key=lambda r: (r["iteration"], r["cell"])):
        record.pop("seconds", None)
        digest.update(json.dumps(record, sort_keys=True).encode())
    for sidecar in sorted((run.path / "checkpoints").glob("*/iter-*.json")):
        written = json.loads(sidecar.read_text())
        digest.update(f"{sidecar.parent.name}/{sidecar.name} {written['sha256']} {written['meta_sha256']}".encode())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write the hashes to {FIXTURE.name}")
    args = parser.parse_args()
    hashes = {}
    for example in EXAMPLES:
        with tempfile.TemporaryDirectory() as folder:
            hashes[example.stem] = run_hash(example, Path(folder))
        print(example.stem, hashes[example.stem], flush=True)
    if args.write:
        FIXTURE.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
