# syntax=docker/dockerfile:1
# The image of the services without torch: the orchestrator (experiments, layout, liveness,
# results, the HTTP API) and the dashboard (live grid heat maps, read-only). Neither imports torch
# (tests/test_layout.py starts them with torch made unimportable): small, up in a second or two.
#   docker build -f services/plain.Dockerfile --build-arg SERVICE=orchestrator -t palomino-orchestrator .
#   docker build -f services/plain.Dockerfile --build-arg SERVICE=dashboard --build-arg PORT=8080 -t palomino-dashboard .
# The context is the repository (.dockerignore keeps it to the package, the examples and deploy/wheelhouse).

ARG PYTHON_VERSION=3.11
# Any Debian-like image with that Python, venv and useradd (deploy/local-images.sh makes one).
ARG BASE=python:${PYTHON_VERSION}-slim

FROM ${BASE} AS build
ARG SERVICE=orchestrator
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/palomino
ENV PATH=/opt/palomino/bin:$PATH
# With wheels in deploy/wheelhouse (deploy/wheelhouse.sh) nothing asks an index.
COPY deploy/wheelhouse /wheelhouse
WORKDIR /build
COPY services/${SERVICE}/requirements.txt ./
# The package without its dependencies (torch, torchmetrics), then only what this service imports.
RUN if ls /wheelhouse/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheelhouse; fi \
 && pip install "$@" -r requirements.txt
COPY pyproject.toml README.md ./
COPY palomino ./palomino
COPY services ./services
RUN if ls /wheelhouse/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheelhouse; fi \
 && pip install "$@" --no-deps . && rm -rf /build

FROM ${BASE} AS runtime
RUN groupadd --system --gid 10001 palomino \
 && useradd --system --uid 10001 --gid palomino --home-dir /home/palomino --create-home palomino \
 && mkdir -p /data/runs \
 && chown -R palomino:palomino /data
ENV PATH=/opt/palomino/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    COLUMNS=200
WORKDIR /app
USER 10001:10001
VOLUME ["/data/runs"]
ARG SERVICE=orchestrator
ARG PORT=8000
COPY --from=build /opt/palomino /opt/palomino
LABEL org.opencontainers.image.title="palomino-${SERVICE}" \
      org.opencontainers.image.description="Palomino ${SERVICE} (orchestrator: experiments, layout, liveness, results, the HTTP API; dashboard: live grid heat maps)" \
      org.opencontainers.image.licenses="MIT"
EXPOSE ${PORT}
ENV PALOMINO_SERVICE=${SERVICE} PALOMINO_PORT=${PORT}
CMD ["sh", "-c", "exec palomino \"$PALOMINO_SERVICE\" --runs /data/runs --host 0.0.0.0 --port \"$PALOMINO_PORT\""]
