#!/usr/bin/env bash
# Install what the tests drive, from Debian's packages where missing: the programs rabbitmq-server
# and redis-server (the integration tests start throwaway servers of their own on free ports,
# tests/servers.py; nothing here starts or touches a server), chromium (dashboard browser test),
# the deployment files' checkers shellcheck and docker-compose, a container engine and Slurm for the
# real-engine tests, and Fashion-MNIST (dataset-fashion-mnist). Used by `make test`.
set -euo pipefail

install() {  # package
  if ! command -v apt-get >/dev/null; then
    echo "ensure-services: $1 is missing and there is no apt-get; install it yourself" >&2
    return 1
  fi
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$1" >/dev/null
}

# The servers' programs (Debian puts rabbitmq-server in /usr/sbin): the integration tests need them.
PATH="$PATH:/usr/sbin:/usr/local/sbin"
command -v redis-server >/dev/null || install redis-server
command -v rabbitmq-server >/dev/null || install rabbitmq-server

# Test tools: installed once, when missing (apt-get only; elsewhere the tests that need them say so).
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v shellcheck >/dev/null || missing+=(shellcheck)
command -v docker-compose >/dev/null || missing+=(docker-compose)
[ -d /usr/share/datasets/fashion-mnist ] || missing+=(dataset-fashion-mnist)
# The real-engine tests (pytest -m engine): podman with crun, debootstrap for the local base image
# (deploy/local-images.sh), and a one-node Slurm with munge (tests/slurm_cluster.py).
command -v podman >/dev/null || missing+=(podman)
command -v crun >/dev/null || missing+=(crun)
# compose's `init: true`: podman runs catatonit as the container's init (only recommended by podman).
[ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v slurmctld >/dev/null || missing+=(slurm-wlm)
command -v munged >/dev/null || missing+=(munge)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  echo "ensure-services: installing ${missing[*]}" >&2
  for package in "${missing[@]}"; do install "$package" || echo "ensure-services: could not install $package" >&2; done
fi

echo "ensure-services: rabbitmq-server and redis-server are installed" >&2
