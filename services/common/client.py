"""A small client of the orchestrator's HTTP API, for `palomino submit / wait / status / up`."""

from __future__ import annotations

import time
from typing import Any

import httpx

from palomino.errors import PalominoError, TransportError
from palomino.services.common.states import ENDED


class OrchestratorClient:
    def __init__(self, url: str, timeout: float = 10.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise TransportError(
                f"cannot reach the orchestrator at {self.url}: {error} (check --orchestrator / PALOMINO_ORCHESTRATOR_URL)"
            ) from None
        if response.status_code == 401:
            raise PalominoError(
                f"orchestrator at {self.url}: refused (401): set PALOMINO_ORCHESTRATOR_TOKEN to its token"
            )
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise PalominoError(f"orchestrator: {detail}")
        return response.json()

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def submit(self, config_yaml: str) -> dict[str, Any]:
        return self._call(
            "POST", "/experiments", content=config_yaml.encode(), headers={"content-type": "application/yaml"}
        )

    def experiment(self, experiment_id: str) -> dict[str, Any]:
        return self._call("GET", f"/experiments/{experiment_id}")

    def delete(self, experiment_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/experiments/{experiment_id}")

    def wait(
        self,
        experiment_id: str,
        timeout: float | None = None,
        on_poll=None,
        period: float = 1.0,
        unreachable: float = 120.0,
    ) -> dict[str, Any]:
        """Poll until the experiment ends. An orchestrator that restarts (a new version, a replaced
        container) is away for seconds while the run goes on: keep asking for up to `unreachable` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        lost_since: float | None = None
        while True:
            try:
                summary = self.experiment(experiment_id)
            except TransportError:
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > unreachable:
                    raise
                time.sleep(period)
                continue
            lost_since = None
            if on_poll is not None:
                on_poll(summary)
            if summary["state"] in ENDED:
                return summary
            if deadline is not None and time.monotonic() > deadline:
                raise PalominoError(f"experiment {experiment_id} still {summary['state']} after {timeout:.0f} s")
            time.sleep(period)
