"""Every example's short run, hashed: its records (timings aside) and each cell's final checkpoint
(tensors and metadata, by the SHA-256s its sidecar holds). tests/test_example_runs.py compares
them with tests/fixtures/example_runs.json, so a restructuring that means to change no number
proves it; a change that means to change numbers rewrites the file on purpose:

    PALOMINO_DATA_DIR=… python tests/example_runs.py --write

Each run's numerics are pinned to one instruction set (`PINNED`): torch picks its kernels by the
processor's vector instructions, and so do MKL's matrix products and oneDNN's convolutions, so
every example's hash moved between two sessions' machines (the second an AVX-512 one, where the
AVX2 kernels, forced, gave other hashes again). Pinned to AVX2, which every x86-64 server of the last
decade has: ATen's AVX2 kernels, MKL's conditional-numerical-reproducibility mode for AVX2,
oneDNN capped at AVX2 (as fast as unpinned here; the portable kernels took twice as long), and
one thread (a 1×1 run hashed otherwise under pytest's conftest, which sets one, than alone). On
this AVX-512 machine the pinned hashes do not move when MKL is also told to use AVX2 only, and
numpy's own vector paths changed no hash (NPY_DISABLE_CPU_FEATURES). The environment must be
set before torch loads, so the runs are made in child processes (`hashes`: two, one a core). A
processor without AVX2 (or not x86) cannot run them so: the test skips there, saying why.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
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


PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    # One thread a stack, whatever the cores: a 1×1 run's products otherwise split by the core count.
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
PINNED_KERNELS = "AVX2"  # what torch.backends.cpu.get_cpu_capability() says under PINNED


def hashes(examples: list[Path], processes: int = 2) -> dict[str, str]:
    """Each example's short-run hash (stem → hash, or "error: …" where its run failed), trained
    with the numerics pinned in `processes` child processes side by side (each one thread: one a
    core); under "kernels", the ATen kernels they ran."""
    groups = [examples[start::processes] for start in range(processes)]
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--print-json", *[e.stem for e in group]],
            env={**os.environ, **PINNED},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for group in groups
        if group
    ]
    out: dict[str, str] = {}
    for child in children:
        stdout, stderr = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"the pinned example runs failed (exit {child.returncode}):\n{stderr[-3000:]}")
        found = json.loads(stdout.splitlines()[-1])
        if out.get("kernels", found["kernels"]) != found["kernels"]:
            raise RuntimeError(f"the children ran other kernels: {out['kernels']} and {found['kernels']}")
        out.update(found)
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
    parser.add_argument("--print-json", nargs="+", metavar="STEM", help=argparse.SUPPRESS)  # hashes()' child
    args = parser.parse_args()
    if args.print_json:
        import torch

        out = {"kernels": torch.backends.cpu.get_cpu_capability()}
        for stem in args.print_json:
            try:
                with tempfile.TemporaryDirectory() as folder:
                    out[stem] = run_hash(ROOT / "examples" / f"{stem}.yaml", Path(folder))
            except Exception as error:  # one example's failure is its result, not the others'
                out[stem] = f"error: {type(error).__name__}: {error}"
        print(json.dumps(out))
        return 0
    found = hashes(EXAMPLES)
    if found.pop("kernels") != PINNED_KERNELS:
        print(f"not hashed: this processor has no {PINNED_KERNELS} kernels for the pinned runs", file=sys.stderr)
        return 1
    for stem, value in found.items():
        print(stem, value, flush=True)
    if args.write:
        if any(value.startswith("error") for value in found.values()):
            print("not written: an example failed", file=sys.stderr)
            return 1
        FIXTURE.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
