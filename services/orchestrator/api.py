"""The orchestrator's HTTP API (FastAPI). Read the experiment, its metrics; submit and delete."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

import yaml
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Response
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily

from palomino.config import ExperimentConfig, parse_config
from palomino.config.data_roots import check_data_dir, data_roots
from palomino.config.footprint import check_data_memory
from palomino.errors import ConfigError
from palomino.services.common.auth import bearer_guard
from palomino.services.common.http import unprocessable
from palomino.services.common.runfiles import RunFiles, valid_cell
from palomino.services.common.service_settings import ServiceSettings
from palomino.services.common.states import STATES
from palomino.services.orchestrator.experiment import Experiment
from palomino.services.orchestrator.orchestrator import Orchestrator, TooBusy

MAX_CONFIG_BYTES = 256 * 1024  # an experiment's YAML: a few kB in practice
MAX_ALIASES = 64
MAX_METRICS_PAGE = 10_000  # records per /metrics page
STALLED_AFTER = 120.0  # seconds one control message or score result may take to handle

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


async def bounded_body(request: Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed `limit` bytes (never read whole)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"the config is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"the config exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_submitted(body: bytes, roots: list[Path], max_data_bytes: int = 4 * 1024**3) -> ExperimentConfig:
    """A submitted YAML body → the experiment's config, its data.dir under an allowed root (ConfigError)."""
    text = body.decode("utf-8", errors="replace")
    try:
        # Aliases let a few bytes stand for an exponential tree: a config has no use for many.
        if sum(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=yaml.SafeLoader)) > MAX_ALIASES:
            raise ConfigError(f"config: more than {MAX_ALIASES} YAML aliases; write the values out")
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"config: not valid YAML: {error}".replace("\n", " ")) from None
    config = parse_config(raw)
    check_data_dir(config.data.dir, roots)
    try:
        check_data_memory(config.data, max_data_bytes)  # after the roots: only allowed folders are counted
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return config


class OrchestratorCounters:
    """Counts that only grow (messages, records, failures, rejections) as a Prometheus counter,
    `palomino_orchestrator_total{name=…}`, read when scraped."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator

    def collect(self):
        family = CounterMetricFamily("palomino_orchestrator", "Orchestrator counters", labels=["name"])
        control = getattr(self.orchestrator, "control", None)
        for name, value in {
            **self.orchestrator.counters,
            "rejected_messages": control.rejected if control else 0,
        }.items():
            family.add_metric([name], value)
        yield family


def create_app(settings: ServiceSettings, runs: Path) -> FastAPI:
    orchestrator = Orchestrator(settings, runs)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with orchestrator:  # closes what it opened, also when start() fails half-way
            yield

    app = FastAPI(title="Palomino orchestrator", lifespan=lifespan)
    app.state.orchestrator = orchestrator
    # Everything but /healthz and /metrics needs the token, when there is one.
    guard = Depends(bearer_guard(settings.token, "PALOMINO_ORCHESTRATOR_TOKEN"))
    lookup = experiment_lookup(orchestrator)
    app.include_router(experiments_router(orchestrator, settings, lookup), dependencies=[guard])
    app.include_router(run_files_router(lookup), dependencies=[guard])
    app.include_router(health_router(orchestrator))
    return app


def experiment_lookup(orchestrator: Orchestrator) -> Callable[[str], Experiment]:
    def lookup(experiment_id: str) -> Experiment:
        experiment = orchestrator.get(experiment_id) if _ID.match(experiment_id) else None
        if experiment is None:
            raise HTTPException(404, f"no experiment {experiment_id!r}")
        return experiment

    return lookup


def experiments_router(
    orchestrator: Orchestrator, settings: ServiceSettings, lookup: Callable[[str], Experiment]
) -> APIRouter:
    """Submit, list, read, page the metrics of and delete experiments."""
    api = APIRouter()
    roots = data_roots(settings.data_roots)

    @api.post("/experiments", status_code=201)
    async def submit(request: Request) -> dict:
        body = await bounded_body(request, MAX_CONFIG_BYTES)
        try:  # off the event loop: a slow parse must not hold /healthz or the consumers
            config = await asyncio.to_thread(parse_submitted, body, roots, settings.max_data_bytes)
        except ConfigError as error:
            raise HTTPException(422, str(error)) from None
        try:
            experiment = await orchestrator.submit(config, client=request.client.host if request.client else "")
        except TooBusy as error:
            raise HTTPException(429, str(error)) from None
        return {"id": experiment.id, "run_dir": str(experiment.run.path)}

    @api.get("/experiments")
    async def experiments() -> list[dict]:
        return [e.summary(orchestrator.alive) for e in orchestrator.experiments.values()]

    @api.get("/experiments/{experiment_id}")
    async def experiment(experiment_id: str) -> dict:
        return lookup(experiment_id).summary(orchestrator.alive)

    @api.get("/experiments/{experiment_id}/metrics")
    async def metrics(
        experiment_id: str, since: int = Query(0, ge=0), limit: int = Query(1000, ge=1, le=MAX_METRICS_PAGE)
    ) -> dict:
        # Read incrementally, off the event loop: never the whole file.
        return await asyncio.to_thread(lookup(experiment_id).files.metrics_page, since, limit)

    @api.delete("/experiments/{experiment_id}")
    async def delete(experiment_id: str) -> dict:
        experiment = lookup(experiment_id)
        await orchestrator.cancel(experiment)
        return experiment.summary(orchestrator.alive)

    return api


def run_files_router(lookup: Callable[[str], Experiment]) -> APIRouter:
    """Read-only views of an experiment's run directory, for dashboards on other machines."""
    api = APIRouter()

    def files_of(experiment_id: str, cell: str | None = None) -> RunFiles:
        files = lookup(experiment_id).files
        if cell is not None:
            if not valid_cell(cell):
                raise unprocessable("path", "cell", f"cell {cell!r}: use ROW-COL, e.g. 0-1")
            if not files.has_cell(cell):
                raise HTTPException(404, f"experiment {experiment_id!r} has no cell {cell} in any of its layouts")
        return files

    @api.get("/experiments/{experiment_id}/topology")
    async def topology(experiment_id: str) -> dict:
        return {"layouts": files_of(experiment_id).layouts()}

    @api.get("/experiments/{experiment_id}/cells/{cell}/samples")
    async def samples(experiment_id: str, cell: str) -> dict:
        return {"cell": cell, "iterations": files_of(experiment_id, cell).sample_iterations(cell)}

    @api.get("/experiments/{experiment_id}/cells/{cell}/samples/{iteration}.png")
    async def sample_png(experiment_id: str, cell: str, iteration: int) -> Response:
        path = files_of(experiment_id, cell).sample_png(cell, iteration)
        return _png(path, f"samples of cell {cell} at iteration {iteration}")

    @api.get("/experiments/{experiment_id}/samples/real.png")
    async def real_png(experiment_id: str) -> Response:
        return _png(files_of(experiment_id).real_png(), "real samples (samples/real.png)")

    @api.get("/experiments/{experiment_id}/result")
    async def result(experiment_id: str) -> dict:
        """ranking.json and scores.json as written (null until then)."""
        return files_of(experiment_id).result()

    @api.get("/experiments/{experiment_id}/result/samples.png")
    async def result_png(experiment_id: str) -> Response:
        return _png(files_of(experiment_id).result_png(), "result samples (result/samples.png)")

    return api


def _png(path: Path | None, what: str) -> Response:
    if path is None:
        raise HTTPException(404, f"no {what} yet")
    return Response(path.read_bytes(), media_type="image/png")


def health_router(orchestrator: Orchestrator) -> APIRouter:
    """/healthz and Prometheus's /metrics: open, for probes and scrapers."""
    api = APIRouter()
    registry = CollectorRegistry()
    experiments = Gauge("palomino_experiments", "Experiments by state", ["state"], registry=registry)
    workers = Gauge("palomino_workers_alive", "Workers with a live heartbeat", registry=registry)
    registry.register(OrchestratorCounters(orchestrator))

    @api.get("/healthz")
    async def healthz(response: Response) -> dict:
        # A consumer whose handler never returns holds its queue: that is not healthy, whatever else is.
        stalled = max(orchestrator.control.in_flight.stalled_for(), orchestrator.scoring.in_flight.stalled_for())
        status = "ok"
        if stalled > STALLED_AFTER:
            response.status_code, status = 503, f"stalled: a message has been in hand for {stalled:.0f} s"
        return {
            "status": status,
            "experiments": len(orchestrator.experiments),
            "workers_alive": len(orchestrator.alive),
        }

    @api.get("/metrics")
    async def prometheus() -> Response:
        for state in STATES:
            experiments.labels(state=state).set(sum(1 for e in orchestrator.experiments.values() if e.state == state))
        workers.set(len(orchestrator.alive))
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    return api
