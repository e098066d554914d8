# syntax=docker/dockerfile:1
# One image for every Palomino service (orchestrator, cell, scorer, dashboard, submit).
#   docker build -t palomino:cpu .                                   # CPU torch (default, ~1 GB)
#   docker build -t palomino:cuda --build-arg TORCH_VARIANT=cu128 .  # CUDA torch (wheels bundle CUDA; the host needs the NVIDIA driver)
# The orchestrator and the dashboard never import torch, so they start fast even though it is installed.
# Datasets are mounted at /data/datasets and runs at /data/runs: nothing of either is baked in.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
# cpu, or a CUDA tag listed for torch 2.13.0 on download.pytorch.org (e.g. cu126, cu128).
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/palomino
ENV PATH=/opt/palomino/bin:$PATH
# torch first, from the variant's index: `pip install .` then finds torch==2.13.0 satisfied
# (2.13.0+cpu or +cuXXX) instead of pulling the default CUDA build from PyPI.
RUN pip install "torch==${TORCH_VERSION}" --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}"
WORKDIR /build
COPY pyproject.toml README.md ./
COPY palomino ./palomino
RUN pip install . && rm -rf /build

FROM python:${PYTHON_VERSION}-slim AS runtime
ARG TORCH_VARIANT=cpu
LABEL org.opencontainers.image.title="palomino" \
      org.opencontainers.image.description="Coevolutionary GAN training on a toroidal grid (Lipizzaner)" \
      org.opencontainers.image.licenses="MIT" \
      palomino.torch-variant="${TORCH_VARIANT}"
# A fixed, non-root uid/gid so volumes and Kubernetes' runAsUser/fsGroup can name it.
RUN groupadd --system --gid 10001 palomino \
 && useradd --system --uid 10001 --gid palomino --home-dir /home/palomino --create-home palomino \
 && mkdir -p /data/runs /data/datasets \
 && chown -R palomino:palomino /data
COPY --from=build /opt/palomino /opt/palomino
COPY --chown=palomino:palomino examples /app/examples
ENV PATH=/opt/palomino/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    OMP_NUM_THREADS=1 \
    COLUMNS=200
WORKDIR /app
USER 10001:10001
VOLUME ["/data/runs", "/data/datasets"]
# 8000: the orchestrator's API; 8080: the dashboard.
EXPOSE 8000 8080
CMD ["palomino", "--help"]
