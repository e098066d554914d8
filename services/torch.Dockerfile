# syntax=docker/dockerfile:1
# The image of the services that carry torch: the cell worker (also `submit`: it loads datasets)
# and the scorer. The two are the same layers but for a label and the default command, so the
# second build is the cache's.
#   docker build -f services/torch.Dockerfile --build-arg SERVICE=cell -t palomino-cell:cpu .
#   docker build -f services/torch.Dockerfile --build-arg SERVICE=scorer -t palomino-scorer:cpu .
#   docker build -f services/torch.Dockerfile --build-arg SERVICE=cell --build-arg TORCH_VARIANT=cu128 -t palomino-cell:cu128 .
# The context is the repository (.dockerignore keeps it to the package, the examples and deploy/wheelhouse).

ARG PYTHON_VERSION=3.11
# Any Debian-like image with that Python, venv and useradd; where no registry is reachable,
# deploy/local-images.sh makes python:3.11-slim from Debian's packages.
ARG BASE=python:${PYTHON_VERSION}-slim

FROM ${BASE} AS build
# cpu, or a CUDA tag listed for torch 2.13.0 on download.pytorch.org (e.g. cu126, cu128).
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/palomino
ENV PATH=/opt/palomino/bin:$PATH
# With wheels in deploy/wheelhouse (deploy/wheelhouse.sh) everything installs from there and no
# index is asked; without, torch comes from its variant's index and the rest from PyPI.
COPY deploy/wheelhouse /wheelhouse
# torch first, its variant pinned: `pip install .` then finds torch==2.13.0 satisfied. (hadolint
# takes the "$@" of index options for an unpinned package.)
# hadolint ignore=DL3013
RUN if ls /wheelhouse/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheelhouse; \
    else set -- --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}"; fi \
 && pip install "torch==${TORCH_VERSION}+${TORCH_VARIANT}" "$@"
# Then pyproject.toml's other dependencies, before the source: a change to the code rebuilds the
# small layer of the package alone, not the gigabyte of its dependencies.
WORKDIR /build
COPY pyproject.toml ./
RUN python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
      >requirements.txt \
 && if ls /wheelhouse/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheelhouse; fi \
 && pip install "$@" -r requirements.txt

FROM build AS package
COPY README.md ./
COPY palomino ./palomino
COPY services ./services
RUN if ls /wheelhouse/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheelhouse; fi \
 && pip wheel "$@" --no-deps --wheel-dir /dist .

FROM ${BASE} AS runtime
# A fixed, non-root uid/gid so volumes and Kubernetes' runAsUser/fsGroup can name it.
RUN groupadd --system --gid 10001 palomino \
 && useradd --system --uid 10001 --gid palomino --home-dir /home/palomino --create-home palomino \
 && mkdir -p /data/runs /data/datasets \
 && chown -R palomino:palomino /data
COPY --from=build /opt/palomino /opt/palomino
COPY --from=package /dist /dist
RUN /opt/palomino/bin/pip install --no-deps --no-index --no-cache-dir /dist/*.whl && rm -rf /dist
COPY --chown=palomino:palomino examples /app/examples
# MALLOC_ARENA_MAX=2: glibc gives busy threads their own malloc arenas (up to 8 a core); in a
# 7-minute soak without kills the torch services grew 1.1–1.7×, with two arenas 0.95–1.33×
# (benchmarks/chaos.py; docs/distributed.md).
ENV PATH=/opt/palomino/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    OMP_NUM_THREADS=1 \
    MALLOC_ARENA_MAX=2 \
    COLUMNS=200
WORKDIR /app
VOLUME ["/data/runs", "/data/datasets"]
# Last, so the layers above are the same for both services. The RUN makes the build cache tell the
# two apart: podman 4's builder keys LABEL and ENV steps without the arguments they expand.
ARG SERVICE=cell
ARG TORCH_VARIANT=cpu
RUN echo "${SERVICE}" >/etc/palomino-service
USER 10001:10001
LABEL org.opencontainers.image.title="palomino-${SERVICE}" \
      org.opencontainers.image.description="Palomino ${SERVICE} (cell: trains the cells it is assigned, also submit; scorer: scores mixtures from the score queue)" \
      org.opencontainers.image.licenses="MIT" \
      palomino.torch-variant="${TORCH_VARIANT}"
ENV PALOMINO_SERVICE=${SERVICE}
CMD ["sh", "-c", "exec palomino \"$PALOMINO_SERVICE\""]
