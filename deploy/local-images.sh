#!/usr/bin/env bash
# Make the images docker-compose.yml and the service Dockerfiles start FROM, where no image registry
# is reachable (air-gapped clusters, these development machines): a Debian base from debootstrap,
# and stand-ins for python:3.11-slim, rabbitmq:3.13-management and redis:7-alpine built on it from
# Debian's packages. Also the two host settings podman (crun) needs on a machine that gives
# containers fewer rights than usual. Every step is skipped when already done; nothing is changed
# that this script did not create, and each change is printed.
#
#   sudo deploy/local-images.sh            # then: deploy/wheelhouse.sh; docker compose up --build
#   deploy/local-images.sh --undo          # removes what it made: the images, the drop-in, the mounts
#
# Environment: ENGINE (podman), DEBIAN_MIRROR (http://deb.debian.org/debian), SUITE (bookworm).
set -euo pipefail
cd "$(dirname "$0")"

engine=${ENGINE:-podman}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=${SUITE:-bookworm}
base=localhost/palomino-debian:$suite-minbase
dropin=/etc/containers/containers.conf.d/50-palomino-ulimits.conf
# name the compose file and the Dockerfiles use -> stand-in folder
standins=("docker.io/library/python:3.11-slim python" "docker.io/library/rabbitmq:3.13-management rabbitmq"
  "docker.io/library/redis:7-alpine redis")

say() { echo "local-images: $*" >&2; }
fail() {
  say "$*"
  exit 2
}
command -v "$engine" >/dev/null || fail "no $engine: apt-get install podman crun (or set ENGINE)"

if [ "${1:-}" = --undo ]; then
  for entry in "${standins[@]}" "$base x"; do
    read -r name _ <<<"$entry"
    if [ "$($engine image inspect --format '{{index .Labels "palomino.stand-in"}}' "$name" 2>/dev/null)" != "" ]; then
      $engine rmi "$name" >/dev/null && say "removed $name"
    fi
  done
  [ -f "$dropin" ] && grep -q palomino "$dropin" && rm "$dropin" && say "removed $dropin"
  for mount in /sys/fs/cgroup/*; do
    if grep -q "^palomino-v1 $mount " /proc/mounts 2>/dev/null; then umount "$mount" && rmdir "$mount" && say "unmounted $mount"; fi
  done
  exit 0
fi

# --- the base: Debian's minimal system, imported as an image ---------------------------------
if $engine image exists "$base" 2>/dev/null; then
  say "$base exists"
else
  command -v debootstrap >/dev/null || fail "no debootstrap: apt-get install debootstrap"
  [ "$(id -u)" -eq 0 ] || fail "debootstrap needs root: run this script with sudo"
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  say "debootstrap --variant=minbase $suite from $mirror (about a minute)"
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 || fail "debootstrap failed: see $root.log"
  rm -f "$root.log"
  tar -C "$root" -c . | $engine import --quiet --change 'CMD ["bash"]' \
    --change 'LABEL palomino.stand-in="debootstrap --variant=minbase '"$suite"'"' - "$base" >/dev/null
  rm -rf "$root"
  trap - EXIT
  say "made $base"
fi

# --- host settings, only where a container does not start without them ------------------------
probe() { $engine run --rm --network none "$base" true 2>&1; }
error=$(probe) || true
if [[ $error == *"setrlimit"* ]]; then
  # podman's default ulimits (nofile 1048576, nproc 4194304) exceed what this host lets a process
  # raise to; ask for the host's own hard limits, no more (crun was refused nproc above pid_max).
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  pid_max=$(cat /proc/sys/kernel/pid_max)
  [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
  mkdir -p "$(dirname "$dropin")"
  printf '# made by palomino deploy/local-images.sh: default ulimits within this host'"'"'s hard limits\n[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
    "$nofile" "$nofile" "$nproc" "$nproc" >"$dropin"
  say "wrote $dropin (nofile $nofile, nproc $nproc)"
  error=$(probe) || true
fi
if [[ $error == *"hybrid mode not supported"* ]]; then
  # crun refuses a cgroup v1 host whose v2 hierarchy still holds a controller (hugetlb here):
  # mount each such controller as a v1 hierarchy of its own, which takes it off v2.
  read -ra controllers </sys/fs/cgroup/unified/cgroup.controllers
  for controller in "${controllers[@]}"; do
    mkdir -p "/sys/fs/cgroup/$controller"
    mount -t cgroup -o "$controller" palomino-v1 "/sys/fs/cgroup/$controller"
    say "mounted the $controller cgroup controller at /sys/fs/cgroup/$controller (v1)"
  done
  error=$(probe) || true
fi
[ -z "$error" ] || fail "$engine cannot start a container here: $error"
say "$engine starts containers"

# --- stand-ins for the images the compose file and the Dockerfiles name -------------------------
for entry in "${standins[@]}"; do
  read -r name folder <<<"$entry"
  digest=$({ $engine image inspect --format '{{.Id}}' "$base" && cat "standins/$folder"/*; } | sha256sum | cut -c1-16)
  have=$($engine image inspect --format '{{index .Labels "palomino.stand-in-digest"}}' "$name" 2>/dev/null || true)
  if [ "$have" = "$digest" ]; then
    say "$name is the stand-in of standins/$folder"
    continue
  fi
  if [ -n "$($engine image inspect --format '{{.Id}}' "$name" 2>/dev/null)" ] && [ -z "$have" ]; then
    say "$name exists and is not a stand-in: kept"
    continue
  fi
  say "building $name from standins/$folder"
  $engine build --quiet --build-arg "BASE=$base" --label "palomino.stand-in-digest=$digest" \
    -t "$name" "standins/$folder" >/dev/null
  say "made $name"
done
