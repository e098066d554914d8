#!/usr/bin/env bash
# The GPU figures (issues 22, 34) in one call on a lent GPU host (its python has torch and nothing else of
# ours): the tile's steps for K = 1, 9, 36, 144 MNIST perceptron cells eager, compiled and compiled with
# CUDA graphs (issue 48), a 12×12 grid's whole iterations by phase (eager, compiled, compiled with TF32
# products, and with CUDA graphs too), the tile's steps
# for K = 1, 9, 36 MNIST DCGANs (width 64), the referee's baselines stacked, the one-cell loop for
# reference, the ops and launches counted, and a real `palomino train` of a 12×12 MNIST grid (compiled:
# `compile: auto` on a GPU).
# Tables go to stdout and to $OUT (or ./gpu-out).
#
# Before the call, on the development machine: `bash benchmarks/gpu.sh prepare` puts wheels of what
# the host lacks (pydantic, ...; Python 3.12, x86-64, the versions of .venv) in .whl/ and a copy of
# $PALOMINO_DATA_DIR/mnist in .data/mnist; both folders are git-ignored, so carry them along.
# Then, on the host: bash benchmarks/gpu.sh   (DEVICE=cpu QUICK=1 bash benchmarks/gpu.sh: a CPU try)
# `bash benchmarks/gpu.sh lipizzaner` instead runs the seeds' 12×12 row (issue 47: Lipizzaner's full
# experiment at 200 passes, both scorers, benchmarks/lipizzaner.py; SIZES="12 6", SEEDS="0 1" and ARMS
# choose; JSON rows in $OUT/lipizzaner/rows, the table in $OUT/lipizzaner/table.json). Longer than a
# device call? `WAIT=530 bash benchmarks/lease.sh bash benchmarks/gpu.sh lipizzaner`, sent again at once.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = prepare ]; then
  [ -x .venv/bin/pip ] || { echo "run make first: no .venv here" >&2; exit 1; }
  mkdir -p .whl
  for p in pydantic pydantic-core annotated-types typing-inspection typing-extensions pydantic-settings \
    python-dotenv platformdirs fastapi starlette uvicorn aio-pika aiormq pamqp redis sse-starlette \
    typer click rich markdown-it-py mdurl pygments shellingham pyyaml pillow safetensors; do
    v=$(.venv/bin/pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}')
    [ -n "$v" ] || { echo "not in .venv, skipped: $p" >&2; continue; }
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "$p==$v" || echo "no wheel found: $p==$v" >&2
  done
  if [ -d "${PALOMINO_DATA_DIR:-}/mnist" ]; then
    if [ "$(realpath "$PALOMINO_DATA_DIR/mnist")" != "$(realpath -m .data/mnist)" ]; then  # -L: a link would not travel
      rm -rf .data/mnist && mkdir -p .data && cp -rL "$PALOMINO_DATA_DIR/mnist" .data/ && chmod -R u+w .data
    fi
    # The seeds' table's referee, trained here once (CPU, seeded; its weights and their checksum): the
    # host reuses it rather than spend its device time on a CPU job, and every row is scored by it.
    PALOMINO_DATA_DIR=$PWD/.data .venv/bin/python benchmarks/lipizzaner.py --referee-only --out .data/lipizzaner
  else
    echo "no \$PALOMINO_DATA_DIR/mnist: the host measures on random images of MNIST's shape" >&2
  fi
  ls .whl .data 2>/dev/null
  exit 0
fi
DEVICE=${DEVICE:-cuda}
out=${OUT:-gpu-out}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import pydantic_settings" 2>/dev/null; then
  W=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$W" .whl/*.whl
  export PYTHONPATH="$W:$PWD"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PALOMINO_DATA_DIR=${PALOMINO_DATA_DIR:-$PWD/.data}
if [ -n "${QUICK:-}" ]; then  # a smoke test of this script (tests/test_gpu_script.py), not a measurement
  cells=(1 2 4) batches=2 grid=2 iterations=1 rounds=1 width=8
else
  cells=(1 9 36 144 576) batches=100 grid=12 iterations=3 rounds=3 width=64
fi
python3 - <<'PY' | tee "$out/device.txt"
import torch
print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")
PY
run() {  # name, then the command: its output to the screen and to $out/<name>.txt
  local name=$1; shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$out/$name.txt"
}
if [ "${1:-}" = lipizzaner ]; then  # quick: 3×3 and 2×2 grids of 2 short iterations, the script's own check
  # The sizes side by side, one process each (SIZES="12 6": a 12×12 tile is bound by its arithmetic, a
  # 6×6 one by its launches, so they overlap on one GPU); each size's log in $out/lipizzaner-NxN.txt,
  # the table after. ARMS="full no-selection" adds the NeurIPS 2018 configs' arm to each size's run.
  if [ -n "${QUICK:-}" ]; then sizes=${SIZES:-3 2} quick=--quick; else sizes=${SIZES:-12} quick=; fi
  mkdir -p "$out/lipizzaner"
  referee=${REFEREE:-.data/lipizzaner}  # where `prepare` left the referee's classifier
  if [ -f "$referee/classifier-mnist.json" ]; then
    cp "$referee/classifier-mnist.safetensors" "$referee/classifier-mnist.json" "$out/lipizzaner/"
  else  # once, before the runs side by side would each train it into the same files
    echo "no referee in $referee (bash benchmarks/gpu.sh prepare makes it): trained here, on the CPU" >&2
    python3 benchmarks/lipizzaner.py --referee-only --out "$out/lipizzaner"
  fi
  pids=()
  for size in $sizes; do
    echo "== lipizzaner ${size}x${size}: log in $out/lipizzaner-${size}x${size}.txt"
    python3 benchmarks/lipizzaner.py --arms ${ARMS:-full} --sizes "$size" --seeds ${SEEDS:-0} --device "$DEVICE" \
      --out "$out/lipizzaner" $quick >"$out/lipizzaner-${size}x${size}.txt" 2>&1 &
    pids+=($!)
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || tail -n 20 "$out"/lipizzaner-*.txt
  run lipizzaner-table python3 benchmarks/lipizzaner.py --table-only --out "$out/lipizzaner"
  exit $failed
fi
# Each K's batch eager and compiled (config `compile`: its ms a batch, × eager, the seconds compiling took).
run tiles-steps python3 benchmarks/tiles.py --cells "${cells[@]:0:4}" --batches "$batches" --rounds "$rounds" --device "$DEVICE" --compile
if [ "$DEVICE" != cpu ]; then  # `compile: graphs` (CUDA graphs, never timed yet): a failure here is a finding, not the end
  run tiles-steps-graphs python3 benchmarks/tiles.py --cells "${cells[@]:0:4}" --batches "$batches" --rounds "$rounds" \
    --device "$DEVICE" --compile --graphs || echo "== tiles-steps-graphs failed: see $out/tiles-steps-graphs.txt"
fi
run tiles-grid python3 benchmarks/tiles.py --cells --grid "$grid" --batches $((batches * 6)) --iterations "$iterations" --device "$DEVICE"
# The same grid with TF32 products (float32 matmuls on tensor cores, inputs rounded to 10 mantissa bits): how far
# cheaper products take the 12×12 run towards its 15 minutes, before the referee weighs the change.
run tiles-grid-tf32 python3 benchmarks/tiles.py --cells --grid "$grid" --batches $((batches * 6)) --iterations "$iterations" --device "$DEVICE" --matmul-precision high
# The grid's whole iterations with its batches compiled, in float32 and with TF32 products.
run tiles-grid-compiled python3 benchmarks/tiles.py --cells --grid "$grid" --batches $((batches * 6)) --iterations "$iterations" --device "$DEVICE" --compile
if [ "$DEVICE" != cpu ]; then  # TF32 is a mode of CUDA's tensor cores
  run tiles-grid-compiled-tf32 python3 benchmarks/tiles.py --cells --grid "$grid" --batches $((batches * 6)) --iterations "$iterations" --device "$DEVICE" --compile --matmul-precision high
  run tiles-grid-graphs-tf32 python3 benchmarks/tiles.py --cells --grid "$grid" --batches $((batches * 6)) --iterations "$iterations" \
    --device "$DEVICE" --compile --graphs --matmul-precision high || echo "== tiles-grid-graphs-tf32 failed: see its .txt"
fi
# Lipizzaner's faithful grid (the seeds' 12×12 row, issue 47), 80 batches an iteration (a pass of its data):
# its seconds an iteration by phase, projected to its 16,000 batches a cell: does the row fit a call?
run tiles-grid-lipizzaner python3 benchmarks/tiles.py --model lipizzaner --cells --grid "$grid" --batches $((batches * 4 / 5)) \
  --iterations "$iterations" --project 16000 --device "$DEVICE"
run tiles-grid-lipizzaner-compiled python3 benchmarks/tiles.py --model lipizzaner --cells --grid "$grid" --batches $((batches * 4 / 5)) \
  --iterations "$iterations" --project 16000 --device "$DEVICE" --compile
run tiles-dcgan python3 benchmarks/tiles.py --model dcgan --width "$width" --cells "${cells[@]:0:3}" --batches "$batches" --rounds "$rounds" --device "$DEVICE"
if [ "$DEVICE" != cpu ]; then  # DCGAN batches compiled (compile: on; auto leaves them eager until this is timed)
  run tiles-dcgan-compiled python3 benchmarks/tiles.py --model dcgan --width "$width" --cells "${cells[@]:0:2}" --batches "$batches" \
    --rounds "$rounds" --device "$DEVICE" --compile || echo "== tiles-dcgan-compiled failed: see its .txt"
fi
run baselines python3 benchmarks/tiles.py --model ring --cells --baselines "${cells[@]:0:4}" --batches $((batches * 2)) --rounds "$rounds" --device "$DEVICE"
run step-throughput python3 benchmarks/step_throughput.py --device "$DEVICE" --batches "$batches" --rounds "$rounds" --network mlp
# Ops and host syncs of one whole iteration (the same on any device: counted, not timed).
run tiles-count python3 benchmarks/tiles.py --count-ops --cells "${cells[@]:0:3}" --batches "$batches" --device "$DEVICE" --json "$out/tiles-count.json"
# What a batch launches, eager against compiled (the profiler's leaf events that compute).
run tiles-launches python3 benchmarks/tiles.py --count-ops --compile --cells "${cells[@]:0:2}" --batches "$batches" --device "$DEVICE"
# A real `palomino train` of the grid (MNIST's test split; the quick form: the ring toy), its seconds an
# iteration read from its metrics.jsonl and projected to 120,000 batches a cell.
train_sets=(--set "grid.rows=$grid" --set "grid.cols=$grid" --set "device=$DEVICE" --set "training.iterations=$((iterations + 1))"
  --set "training.batches_per_iteration=$((batches * 6))" --set training.ensemble.scope=neighbourhood
  --set training.checkpoint_every=1000 --set training.sample_every=1000)
if [ -n "${QUICK:-}" ]; then
  run train-grid python3 -m palomino.cli train examples/ring-3x3.yaml --out "$out/runs" "${train_sets[@]}"
elif [ -d "$PALOMINO_DATA_DIR/mnist" ]; then
  run train-grid python3 -m palomino.cli train examples/mnist-mlp-3x3.yaml --out "$out/runs" "${train_sets[@]}" \
    --set data.split=test --set "data.dir=$PALOMINO_DATA_DIR/mnist"
else
  echo "== train-grid skipped: no \$PALOMINO_DATA_DIR/mnist (bash benchmarks/gpu.sh prepare copies it to .data)"
fi
if [ -d "$out/runs" ]; then
  python3 - "$out/runs" "$((batches * 6))" <<'PY' | tee "$out/train-grid-speed.txt"
import json, statistics, sys
from pathlib import Path
metrics = sorted(Path(sys.argv[1]).glob("*/metrics.jsonl"))[-1]
records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
per = {}
for r in records:  # a tile's cells share one iteration's seconds
    per[r["iteration"]] = r["seconds"]["train"] + r["seconds"]["communicate"]
timed = [s for i, s in sorted(per.items())][1:] or list(per.values())  # the first iteration warms up
batches = int(sys.argv[2])
seconds = statistics.median(timed)
print(f"train-grid: {len({tuple(r['cell']) for r in records})} cells, {batches} batches an iteration, "
      f"{seconds:.2f} s/iteration (median of {len(timed)}); projected to 120,000 batches a cell: "
      f"{seconds * 120_000 / batches / 60:.1f} min")
PY
fi
echo "== tables in $out"
