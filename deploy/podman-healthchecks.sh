#!/usr/bin/env bash
# podman runs a container's healthcheck from a systemd timer; where no systemd runs (a container,
# a CI runner, a minimal host) the checks never run, no container turns healthy, and compose waits
# forever on `condition: service_healthy`. Run this beside `docker compose up` there: it runs
# every running container's healthcheck (of one compose project, when named) every few seconds.
#
#   deploy/podman-healthchecks.sh [PROJECT]        # INTERVAL=5 (seconds)
set -uo pipefail
filter=()
[ -z "${1:-}" ] || filter=(--filter "label=com.docker.compose.project=$1")
while true; do
  for id in $(podman ps --quiet "${filter[@]}"); do
    podman healthcheck run "$id" >/dev/null 2>&1  # no healthcheck, or failing: podman records it
  done
  sleep "${INTERVAL:-5}"
done
