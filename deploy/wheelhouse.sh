#!/usr/bin/env bash
# Download, on a machine with the package index, every wheel the service images install:
# pyproject.toml's dependencies, torch's CPU build and the build backend, for the images' Python
# (3.11, Linux x86_64), into deploy/wheelhouse/. The Dockerfiles then install from there alone and
# never reach an index (an air-gapped cluster's build hosts; copy the folder across with the repository).
#
#   deploy/wheelhouse.sh                 # then: docker compose build (or podman build)
#   TORCH_INDEX= deploy/wheelhouse.sh    # torch from pip's own configuration (e.g. PIP_FIND_LINKS) only
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
torch=${TORCH:-torch==2.13.0+cpu}
index=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
dest=deploy/wheelhouse

mapfile -t requirements < <("$python" -c 'import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
print(*project["build-system"]["requires"], *project["project"]["dependencies"], sep="\n")')
extra=()
if [ -n "$index" ]; then
  # A build host that cannot reach it (a mirror's PIP_INDEX_URL or PIP_FIND_LINKS serves torch)
  # should not wait out pip's retries.
  if "$python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$index" 2>/dev/null; then
    extra=(--extra-index-url "$index")
  else
    echo "wheelhouse: $index is not reachable: torch from pip's own configuration" >&2
  fi
fi
# Binary wheels for the images' interpreter and platform, whatever Python runs this script. pip
# judges a python_full_version marker by the Python running it, so what redis asks for below 3.11.3
# (Debian bookworm's python3 is 3.11.2) is named here.
"$python" -m pip download --quiet --dest "$dest" --only-binary=:all: --implementation cp \
  --python-version 3.11 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  "${extra[@]}" "$torch" "${requirements[@]}" "async-timeout>=4.0.3"
echo "wheelhouse: $(find "$dest" -name '*.whl' | wc -l) wheels, $(du -sh "$dest" | cut -f1), in $dest" >&2
