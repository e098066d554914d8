"""The orchestrator's HTTP API (FastAPI). Read the experiment, its metrics; submit and delete."""

from __future__ import annotations

import re
from contextlib import asynccontextmanager
from pathlib import Path

import yaml
from fastapi import FastAPI, HTTPException, Query, Request, Response
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from palomino.config import parse_config
from palomino.services.dashboard.runfiles import RunFiles, valid_cell
from palomino.errors import ConfigError
from palomino.services.orchestrator import Orchestrator
from palomino.services.settings import ServiceSettings

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def create_app(settings: ServiceSettings, runs: Path) -> FastAPI:
    orchestrator = Orchestrator(settings, runs)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await orchestrator.start()
        yield
        await orchestrator.close()

    app = FastAPI(title="Palomino orchestrator", lifespan=lifespan)
    app.state.orchestrator = orchestrator
    registry = CollectorRegistry()
    gauges = {
        "experiments": Gauge("palomino_experiments", "Experiments by state", ["state"], registry=registry),
        "workers": Gauge("palomino_workers_alive", "Workers with a live heartbeat", registry=registry),
        "counters": Gauge("palomino_orchestrator_total", "Orchestrator counters", ["name"], registry=registry),
    }

    def lookup(experiment_id: str):
        if not _ID.match(experiment_id):
            raise HTTPException(404, f"no experiment {experiment_id!r}")
        experiment = orchestrator.get(experiment_id)
        if experiment is None:
            raise HTTPException(404, f"no experiment {experiment_id!r}")
        return experiment

    @app.post("/experiments", status_code=201)
    async def submit(request: Request) -> dict:
        text = (await request.body()).decode("utf-8", errors="replace")
        try:
            raw = yaml.safe_load(text) or {}
            config = parse_config(raw)
        except yaml.YAMLError as error:
            raise HTTPException(422, f"config: not valid YAML: {error}".replace("\n", " ")) from None
        except ConfigError as error:
            raise HTTPException(422, str(error)) from None
        experiment = await orchestrator.submit(config)
        return {"id": experiment.id, "run_dir": str(experiment.run.path)}

    @app.get("/experiments")
    async def experiments() -> list[dict]:
        return [e.summary(orchestrator.alive) for e in orchestrator.experiments.values()]

    @app.get("/experiments/{experiment_id}")
    async def experiment(experiment_id: str) -> dict:
        return lookup(experiment_id).summary(orchestrator.alive)

    @app.get("/experiments/{experiment_id}/metrics")
    async def metrics(experiment_id: str, since: int = Query(0, ge=0)) -> dict:
        records = orchestrator.metrics_since(lookup(experiment_id), since)
        return {"since": since, "next": since + len(records), "records": records}

    # ---- read-only views of the run directory (for dashboards on other machines) -------------

    def files_of(experiment_id: str, cell: str | None = None) -> RunFiles:
        files = RunFiles(lookup(experiment_id).run.path)
        if cell is not None:
            if not valid_cell(cell):
                raise HTTPException(422, f"cell {cell!r}: use ROW-COL, e.g. 0-1")
            if not files.has_cell(cell):
                raise HTTPException(404, f"experiment {experiment_id!r} has no cell {cell} in any of its layouts")
        return files

    def png(path: Path | None, what: str) -> Response:
        if path is None:
            raise HTTPException(404, f"no {what} yet")
        return Response(path.read_bytes(), media_type="image/png")

    @app.get("/experiments/{experiment_id}/topology")
    async def topology(experiment_id: str) -> dict:
        return {"layouts": files_of(experiment_id).layouts()}

    @app.get("/experiments/{experiment_id}/cells/{cell}/samples")
    async def samples(experiment_id: str, cell: str) -> dict:
        return {"cell": cell, "iterations": files_of(experiment_id, cell).sample_iterations(cell)}

    @app.get("/experiments/{experiment_id}/cells/{cell}/samples/{iteration}.png")
    async def sample_png(experiment_id: str, cell: str, iteration: int) -> Response:
        path = files_of(experiment_id, cell).sample_png(cell, iteration)
        return png(path, f"samples of cell {cell} at iteration {iteration}")

    @app.get("/experiments/{experiment_id}/samples/real.png")
    async def real_png(experiment_id: str) -> Response:
        return png(files_of(experiment_id).real_png(), "real samples (samples/real.png)")

    @app.get("/experiments/{experiment_id}/result")
    async def result(experiment_id: str) -> dict:
        """ranking.json and scores.json as written (null until then)."""
        return files_of(experiment_id).result()

    @app.get("/experiments/{experiment_id}/result/samples.png")
    async def result_png(experiment_id: str) -> Response:
        return png(files_of(experiment_id).result_png(), "result samples (result/samples.png)")

    @app.delete("/experiments/{experiment_id}")
    async def delete(experiment_id: str) -> dict:
        experiment = lookup(experiment_id)
        await orchestrator.cancel(experiment)
        return experiment.summary(orchestrator.alive)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "experiments": len(orchestrator.experiments), "workers_alive": len(orchestrator.alive)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        for state in ("waiting", "running", "finished", "failed", "stopped"):
            count = sum(1 for e in orchestrator.experiments.values() if e.state == state)
            gauges["experiments"].labels(state=state).set(count)
        gauges["workers"].set(len(orchestrator.alive))
        for name, value in {**orchestrator.counters, "rejected_messages": orchestrator.control.rejected}.items():
            gauges["counters"].labels(name=name).set(value)
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    return app
