"""The dashboard's FastAPI app: one page, a read-only JSON API under /api, and an SSE stream of events."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse

from palomino.services.common.auth import bearer_guard
from palomino.services.common.http import unprocessable
from palomino.services.common.runfiles import valid_cell, valid_experiment_id
from palomino.services.dashboard.events import EventHub
from palomino.services.dashboard.history import History, SourceUnavailable

STATIC = resources.files("palomino.services.dashboard") / "static"
MAX_PAGE = 50_000
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class Feed(Protocol):
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    def status(self) -> dict[str, Any]: ...


def create_app(
    history: History,
    hub: EventHub,
    *,
    feeds: Sequence[Feed] = (),
    token: str | None = None,
    origins: Sequence[str] = (),
    title: str = "Palomino dashboard",
) -> FastAPI:
    """The app over `history`, streaming what `feeds` put into `hub`. Only GET routes exist."""
    app = FastAPI(
        title=title,
        lifespan=_lifespan(history, feeds),
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    if origins:  # same-origin by default; other pages only when named one by one
        app.add_middleware(
            CORSMiddleware, allow_origins=list(origins), allow_methods=["GET"], allow_headers=["Authorization"]
        )

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.exception_handler(SourceUnavailable)
    async def unavailable(request: Request, error: SourceUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=503)

    guard = Depends(bearer_guard(token, "PALOMINO_DASHBOARD_TOKEN", query=True))
    known = Known(history)
    app.include_router(experiments_router(history, known), prefix="/api", dependencies=[guard])
    app.include_router(pictures_router(history, known), prefix="/api", dependencies=[guard])
    app.include_router(events_router(hub, known), prefix="/api", dependencies=[guard])
    app.include_router(page_router(history, hub, feeds))
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    return app


def _lifespan(history: History, feeds: Sequence[Feed]):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        started: list[Feed] = []
        try:
            for feed in feeds:
                await feed.start()
                started.append(feed)
            yield
        finally:
            for feed in reversed(started):
                await feed.close()
            await history.close()

    return lifespan


class Known:
    """404 for an experiment or cell the history does not know (422 for a malformed cell)."""

    def __init__(self, history: History) -> None:
        self.history = history

    async def experiment(self, experiment: str) -> dict[str, Any]:
        summary = await self.history.experiment(experiment) if valid_experiment_id(experiment) else None
        if summary is None:
            raise HTTPException(404, f"no experiment {experiment!r}")
        return summary

    async def cell(self, experiment: str, cell: str) -> None:
        if not valid_cell(cell):
            raise unprocessable("path", "cell", f"cell {cell!r}: use ROW-COL, e.g. 0-1")
        summary = await self.experiment(experiment)
        layouts = await self.history.layouts(experiment) or [summary]
        row, col = map(int, cell.split("-"))
        if not any(row < (layout.get("rows") or 0) and col < (layout.get("cols") or 0) for layout in layouts):
            raise HTTPException(404, f"experiment {experiment!r} has no cell {cell} in any of its layouts")


def experiments_router(history: History, known: Known) -> APIRouter:
    """The experiments, their metrics, layouts and results, as JSON."""
    api = APIRouter()

    @api.get("/experiments")
    async def experiments() -> dict[str, Any]:
        found = await history.experiments()
        found.sort(key=lambda s: s.get("id", ""), reverse=True)  # ids end in their start time: newest first
        return {"experiments": found, "unavailable": dict(getattr(history, "unavailable", {}))}

    @api.get("/experiments/{experiment}")
    async def experiment(experiment: str) -> dict[str, Any]:
        return await known.experiment(experiment)

    @api.get("/experiments/{experiment}/metrics")
    async def metrics(
        experiment: str, since: int = Query(0, ge=0), limit: int = Query(MAX_PAGE, ge=1, le=MAX_PAGE)
    ) -> dict[str, Any]:
        await known.experiment(experiment)
        page = await history.metrics(experiment, since, limit)
        if page is None:
            raise HTTPException(404, f"no experiment {experiment!r}")
        return page

    @api.get("/experiments/{experiment}/topology")
    async def topology(experiment: str) -> dict[str, Any]:
        summary = await known.experiment(experiment)
        layouts = await history.layouts(experiment)
        if not layouts and summary.get("rows"):  # not started yet, or an orchestrator without the endpoint
            layouts = [{k: summary.get(k) for k in ("epoch", "rows", "cols", "cells")}]
        return {"layouts": layouts or []}

    @api.get("/experiments/{experiment}/cells/{cell}/samples")
    async def samples(experiment: str, cell: str) -> dict[str, Any]:
        await known.cell(experiment, cell)
        return {"cell": cell, "iterations": await history.samples(experiment, cell) or []}

    @api.get("/experiments/{experiment}/result")
    async def result(experiment: str) -> dict[str, Any]:
        await known.experiment(experiment)
        return await history.result(experiment) or {"ranking": None, "scores": None, "samples": False, "real": False}

    return api


def pictures_router(history: History, known: Known) -> APIRouter:
    """The PNGs: a cell's samples at an iteration, the real data, the result's samples."""
    api = APIRouter()

    @api.get("/experiments/{experiment}/cells/{cell}/samples/{iteration}.png")
    async def sample_png(experiment: str, cell: str, iteration: int) -> Response:
        await known.cell(experiment, cell)
        if iteration < 0:
            raise unprocessable("path", "iteration", "iteration: must be ≥ 0")
        return _png(
            await history.sample_png(experiment, cell, iteration), f"samples of cell {cell} at iteration {iteration}"
        )

    @api.get("/experiments/{experiment}/samples/real.png")
    async def real_png(experiment: str) -> Response:
        await known.experiment(experiment)
        return _png(await history.real_png(experiment), "real samples (samples/real.png)")

    @api.get("/experiments/{experiment}/result/samples.png")
    async def result_png(experiment: str) -> Response:
        await known.experiment(experiment)
        return _png(await history.result_png(experiment), "result samples (result/samples.png)")

    return api


def _png(data: bytes | None, what: str) -> Response:
    if data is None:
        raise HTTPException(404, f"no {what} yet")
    return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=60"})


def events_router(hub: EventHub, known: Known) -> APIRouter:
    api = APIRouter()

    @api.get("/events")
    async def events(request: Request, experiment: str | None = Query(None)) -> EventSourceResponse:
        """Server-Sent Events: `events` messages carry a JSON list of events. Without `experiment`:
        state, topology and score events of every experiment (for the list)."""
        if experiment is not None:
            await known.experiment(experiment)

        async def stream():
            with hub.subscribe(experiment) as subscription:
                yield {"event": "hello", "data": json.dumps({"experiment": experiment})}
                async for batch in hub.batches(subscription):
                    yield {"event": "events", "data": json.dumps(batch, allow_nan=False, default=str)}

        return EventSourceResponse(stream(), ping=15, headers={"Cache-Control": "no-store"})

    return api


def page_router(history: History, hub: EventHub, feeds: Sequence[Feed]) -> APIRouter:
    """The page itself and /healthz: open (the page asks for the token when the API wants one)."""
    api = APIRouter()

    @api.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {
            "status": "ok",
            "sources": [s.name for s in getattr(history, "sources", [history])],
            "unavailable": dict(getattr(history, "unavailable", {})),
            "feeds": [feed.status() for feed in feeds],
            "streams": hub.subscribers,
        }

    @api.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"), headers={"Cache-Control": "no-cache"})

    return api
