"""Where an experiment's past comes from: the orchestrator's HTTP API, or run directories on disk.

Both answer the same questions with the same shapes; `None` means "not known here" (the API
turns it into a 404), `SourceUnavailable` means "could not ask" (a 503 naming the source).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import httpx

from palomino.errors import PalominoError
from palomino.services.common.runfiles import RunsFolder, valid_cell, valid_experiment_id


class SourceUnavailable(PalominoError):
    """A history source could not be asked (the orchestrator is down, or answered with an error)."""


class History(Protocol):
    name: str

    async def experiments(self) -> list[dict[str, Any]]: ...
    async def experiment(self, experiment: str) -> dict[str, Any] | None: ...
    async def metrics(self, experiment: str, since: int, limit: int) -> dict[str, Any] | None: ...
    async def layouts(self, experiment: str) -> list[dict[str, Any]] | None: ...
    async def samples(self, experiment: str, cell: str) -> list[int] | None: ...
    async def sample_png(self, experiment: str, cell: str, iteration: int) -> bytes | None: ...
    async def real_png(self, experiment: str) -> bytes | None: ...
    async def result(self, experiment: str) -> dict[str, Any] | None: ...
    async def result_png(self, experiment: str) -> bytes | None: ...
    async def close(self) -> None: ...


def _read(path) -> bytes | None:
    return path.read_bytes() if path is not None else None


class RunsHistory:
    """Run directories under a folder: finished runs, embedded runs, an orchestrator's runs on this disk."""

    name = "runs"

    def __init__(self, folder: RunsFolder) -> None:
        self.folder = folder

    async def experiments(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            return [run.summary() for e in self.folder.ids() if (run := self.folder.get(e)) is not None]

        return await asyncio.to_thread(read)

    async def experiment(self, experiment: str) -> dict[str, Any] | None:
        run = self.folder.get(experiment)
        return None if run is None else await asyncio.to_thread(run.summary)

    async def metrics(self, experiment: str, since: int, limit: int) -> dict[str, Any] | None:
        run = self.folder.get(experiment)
        return None if run is None else await asyncio.to_thread(run.metrics_page, since, limit)

    async def layouts(self, experiment: str) -> list[dict[str, Any]] | None:
        run = self.folder.get(experiment)
        return None if run is None else await asyncio.to_thread(run.layouts)

    async def samples(self, experiment: str, cell: str) -> list[int] | None:
        run = self.folder.get(experiment)
        if run is None or not await asyncio.to_thread(run.has_cell, cell):
            return None
        return await asyncio.to_thread(run.sample_iterations, cell)

    async def sample_png(self, experiment: str, cell: str, iteration: int) -> bytes | None:
        run = self.folder.get(experiment)
        return None if run is None else await asyncio.to_thread(lambda: _read(run.sample_png(cell, iteration)))

    async def real_png(self, experiment: str) -> bytes | None:
        run = self.folder.get(experiment)
        return None if run is None else await asyncio.to_thread(lambda: _read(run.real_png()))

    async def result(self, experiment: str) -> dict[str, Any] | None:
        run = self.folder.get(experiment)
        return None if run is None else await asyncio.to_thread(run.result)

    async def result_png(self, experiment: str) -> bytes | None:
        run = self.folder.get(experiment)
        return None if run is None else await asyncio.to_thread(lambda: _read(run.result_png()))

    async def close(self) -> None:
        return None


class OrchestratorHistory:
    """The orchestrator's HTTP API (`palomino orchestrator`): live states, liveness, failures."""

    name = "orchestrator"

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, transport=transport, headers=headers)

    async def _get(self, path: str, **params: Any) -> httpx.Response | None:
        try:
            response = await self._http.get(path, params=params or None)
        except httpx.HTTPError as error:
            raise SourceUnavailable(
                f"cannot reach the orchestrator at {self.url}: {error or type(error).__name__}"
            ) from None
        if response.status_code == 404:
            return None
        if response.status_code == 401:
            raise SourceUnavailable(
                f"the orchestrator at {self.url} refused the dashboard (401): set PALOMINO_ORCHESTRATOR_TOKEN to its token"
            )
        if response.status_code >= 400:
            raise SourceUnavailable(f"the orchestrator at {self.url} answered {response.status_code} to GET {path}")
        return response

    async def _json(self, path: str, **params: Any) -> Any:
        response = await self._get(path, **params)
        if response is None:
            return None
        try:
            return response.json()
        except ValueError:
            raise SourceUnavailable(f"the orchestrator at {self.url} sent no JSON for GET {path}") from None

    async def _bytes(self, path: str) -> bytes | None:
        response = await self._get(path)
        return None if response is None else response.content

    @staticmethod
    def _tag(summary: Any) -> Any:
        if isinstance(summary, dict):
            summary.setdefault("source", "orchestrator")
        return summary

    async def experiments(self) -> list[dict[str, Any]]:
        found = await self._json("/experiments")
        return [self._tag(s) for s in found or [] if isinstance(s, dict)]

    async def experiment(self, experiment: str) -> dict[str, Any] | None:
        return self._tag(await self._json(f"/experiments/{experiment}"))

    async def metrics(self, experiment: str, since: int, limit: int) -> dict[str, Any] | None:
        page = await self._json(f"/experiments/{experiment}/metrics", since=since, limit=min(limit, 10_000))
        if page is None:
            return None
        records = page.get("records", [])[:limit]
        following = (
            page.get("next", since + len(records)) if len(page.get("records", [])) <= limit else since + len(records)
        )
        return {"since": since, "next": following, "total": page.get("total", following), "records": records}

    async def layouts(self, experiment: str) -> list[dict[str, Any]] | None:
        found = await self._json(f"/experiments/{experiment}/topology")
        return None if found is None else found.get("layouts", [])

    async def samples(self, experiment: str, cell: str) -> list[int] | None:
        found = await self._json(f"/experiments/{experiment}/cells/{cell}/samples")
        return None if found is None else found.get("iterations", [])

    async def sample_png(self, experiment: str, cell: str, iteration: int) -> bytes | None:
        return await self._bytes(f"/experiments/{experiment}/cells/{cell}/samples/{iteration}.png")

    async def real_png(self, experiment: str) -> bytes | None:
        return await self._bytes(f"/experiments/{experiment}/samples/real.png")

    async def result(self, experiment: str) -> dict[str, Any] | None:
        return await self._json(f"/experiments/{experiment}/result")

    async def result_png(self, experiment: str) -> bytes | None:
        return await self._bytes(f"/experiments/{experiment}/result/samples.png")

    async def close(self) -> None:
        await self._http.aclose()


class CombinedHistory:
    """Asks each source in turn (the orchestrator first: it knows live states); the first that knows answers."""

    name = "combined"

    def __init__(self, sources: Sequence[History]) -> None:
        self.sources = list(sources)
        self.unavailable: dict[str, str] = {}  # source → why, from the last call that could not ask it

    async def _first(self, method: str, *args: Any) -> Any:
        errors: list[SourceUnavailable] = []
        for source in self.sources:
            try:
                answer = await getattr(source, method)(*args)
            except SourceUnavailable as error:
                self.unavailable[source.name] = str(error)
                errors.append(error)
                continue
            self.unavailable.pop(source.name, None)
            if answer is not None:
                return answer
        if errors:
            raise errors[0]  # nobody knew, and someone could not be asked: "unknown" would be a guess
        return None

    async def experiments(self) -> list[dict[str, Any]]:
        merged: dict[str, dict[str, Any]] = {}
        errors = []
        for source in self.sources:
            try:
                found = await source.experiments()
            except SourceUnavailable as error:
                self.unavailable[source.name] = str(error)
                errors.append(error)
                continue
            self.unavailable.pop(source.name, None)
            for summary in found:
                merged.setdefault(summary["id"], summary)
        if errors and len(errors) == len(self.sources):
            raise errors[0]
        return list(merged.values())

    async def experiment(self, experiment: str) -> dict[str, Any] | None:
        return await self._first("experiment", experiment) if valid_experiment_id(experiment) else None

    async def metrics(self, experiment: str, since: int, limit: int) -> dict[str, Any] | None:
        return await self._first("metrics", experiment, since, limit) if valid_experiment_id(experiment) else None

    async def layouts(self, experiment: str) -> list[dict[str, Any]] | None:
        return await self._first("layouts", experiment) if valid_experiment_id(experiment) else None

    async def samples(self, experiment: str, cell: str) -> list[int] | None:
        ok = valid_experiment_id(experiment) and valid_cell(cell)
        return await self._first("samples", experiment, cell) if ok else None

    async def sample_png(self, experiment: str, cell: str, iteration: int) -> bytes | None:
        ok = valid_experiment_id(experiment) and valid_cell(cell) and iteration >= 0
        return await self._first("sample_png", experiment, cell, iteration) if ok else None

    async def real_png(self, experiment: str) -> bytes | None:
        return await self._first("real_png", experiment) if valid_experiment_id(experiment) else None

    async def result(self, experiment: str) -> dict[str, Any] | None:
        return await self._first("result", experiment) if valid_experiment_id(experiment) else None

    async def result_png(self, experiment: str) -> bytes | None:
        return await self._first("result_png", experiment) if valid_experiment_id(experiment) else None

    async def close(self) -> None:
        for source in self.sources:
            await source.close()
