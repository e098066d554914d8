#!/usr/bin/env bash
# Make RabbitMQ (5672) and Redis (6379) reachable on this machine: start them, installing
# them from Debian's packages first if they are missing. Also installs what the tests drive:
# chromium (dashboard browser test), shellcheck and docker-compose (deployment files),
# Fashion-MNIST (dataset-fashion-mnist). Used by `make test`.
set -euo pipefail

reachable() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {  # port name seconds
  for _ in $(seq "$3"); do reachable "$1" && return 0; sleep 1; done
  echo "ensure-services: $2 is still not reachable on 127.0.0.1:$1" >&2
  return 1
}

install() {  # package
  if ! command -v apt-get >/dev/null; then
    echo "ensure-services: $1 is missing and there is no apt-get; install it and start it on 127.0.0.1" >&2
    exit 1
  fi
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$1" >/dev/null
}

if ! reachable 6379; then
  command -v redis-server >/dev/null || install redis-server
  echo "ensure-services: starting Redis" >&2
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
  wait_for 6379 Redis 30
fi

if ! reachable 5672; then
  command -v rabbitmq-server >/dev/null || install rabbitmq-server
  echo "ensure-services: starting RabbitMQ" >&2
  rabbitmq-server -detached >/dev/null 2>&1 || true
  wait_for 5672 RabbitMQ 90
fi
# Test tools: installed once, when missing (apt-get only; elsewhere the tests that need them say so).
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v shellcheck >/dev/null || missing+=(shellcheck)
command -v docker-compose >/dev/null || missing+=(docker-compose)
[ -d /usr/share/datasets/fashion-mnist ] || missing+=(dataset-fashion-mnist)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  echo "ensure-services: installing ${missing[*]}" >&2
  for package in "${missing[@]}"; do install "$package" || echo "ensure-services: could not install $package" >&2; done
fi

echo "ensure-services: RabbitMQ 127.0.0.1:5672 and Redis 127.0.0.1:6379 are reachable" >&2
