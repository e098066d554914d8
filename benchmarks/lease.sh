#!/usr/bin/env bash
# A job longer than one call of a lent GPU (10 minutes a call, 15 a lease): the machine stays warm
# 30 s after a call and a process in a session of its own outlives the call, so the job runs on
# across back-to-back calls of the same line:
#   WAIT=530 bash benchmarks/lease.sh bash benchmarks/gpu.sh lipizzaner     (call 1, 2, ... at once)
# The first call starts the command in its own session, with OUT=$LEASE_DIR/out; every call waits
# up to WAIT seconds (default 530) for it to end, then packs $LEASE_DIR (weights left out) into
# $OUT/lease.tgz and prints the log's tail and "running" or "finished rc=N". Exit status: 0 when
# the job finished well, 3 while it runs, else the job's own.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: WAIT=530 bash benchmarks/lease.sh COMMAND [ARG ...]" >&2; exit 2; }
dir=${LEASE_DIR:-${TMPDIR:-/tmp}/palomino-lease}
wait_s=${WAIT:-530}
mkdir -p "$dir/out"
if [ ! -f "$dir/started" ]; then
  printf '%q ' "$@" >"$dir/command"
  # Its own session (setsid): the call's end kills the processes it left, but not this one.
  OUT=$dir/out PYTHONUNBUFFERED=1 setsid bash -c '"$@" >"$0/job.log" 2>&1; echo $? >"$0/rc"' "$dir" "$@" \
    </dev/null >/dev/null 2>&1 &
  if command -v nvidia-smi >/dev/null; then  # the device's load while it runs, for the closing note
    setsid bash -c 'until [ -f "$0/rc" ]; do nvidia-smi --query-gpu=utilization.gpu,memory.used \
      --format=csv,noheader >>"$0/smi.log" 2>&1; sleep 20; done' "$dir" </dev/null >/dev/null 2>&1 &
  fi
  date -u +%FT%TZ >"$dir/started"
  echo "started: $(cat "$dir/command")"
fi
end=$((SECONDS + wait_s))
while [ ! -f "$dir/rc" ] && [ $SECONDS -lt $end ]; do sleep 2; done
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"  # tar may see files change under a running job: what it read still comes back
  tar czf "$OUT/lease.tgz" -C "$dir" --exclude='*.safetensors' . 2>/dev/null
  cp "$dir/job.log" "$OUT/" 2>/dev/null
fi
tail -n 20 "$dir/job.log" 2>/dev/null
[ -f "$dir/smi.log" ] && tail -n 2 "$dir/smi.log"
if [ -f "$dir/rc" ]; then
  rc=$(cat "$dir/rc")
  echo "finished rc=$rc (started $(cat "$dir/started"))"
  exit "$rc"
fi
echo "running (started $(cat "$dir/started")): call again within the machine's 30 s to wait on"
exit 3
