"""Where the dashboard reads from, and who may read it: flags, else PALOMINO_* variables, else `--runs runs`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from palomino.endpoints import BROKER_URL, ORCHESTRATOR_URL
from palomino.errors import ConfigError, describe_validation
from palomino.services.common.auth import check_token

DEFAULT_RUNS = Path("runs")


class DashboardSettings(BaseSettings):
    """PALOMINO_ORCHESTRATOR_URL, PALOMINO_BROKER_URL, PALOMINO_DASHBOARD_RUNS, PALOMINO_DASHBOARD_TOKEN,
    PALOMINO_DASHBOARD_ORIGINS (a JSON list of origins allowed to call the API from other pages)."""

    model_config = SettingsConfigDict(env_prefix="PALOMINO_", extra="ignore")

    orchestrator_url: str | None = None  # history (and liveness) from the orchestrator's HTTP API
    broker_url: str | None = None  # live events from `palomino.events`
    dashboard_runs: Path | None = None  # history from run directories (finished, embedded, or the orchestrator's)
    dashboard_token: SecretStr | None = None  # when set, every /api call needs `Authorization: Bearer <token>`
    orchestrator_token: SecretStr | None = None  # what the orchestrator's API wants from its clients
    dashboard_origins: list[str] = Field(default_factory=list)  # CORS: exact origins, never "*"
    dashboard_poll_seconds: float = Field(0.5, gt=0, le=60)  # how often run directories are looked at

    @field_validator("orchestrator_url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url and urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"{url!r} is not an http(s) URL (e.g. {ORCHESTRATOR_URL})")
        return url.rstrip("/") if url else None

    @field_validator("broker_url")
    @classmethod
    def _amqp(cls, url: str | None) -> str | None:
        if url and urlsplit(url).scheme not in ("amqp", "amqps"):
            raise ValueError(f"not an amqp(s) URL (e.g. {BROKER_URL})")
        return url or None

    @field_validator("dashboard_token", "orchestrator_token")
    @classmethod
    def _token(cls, token: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if token is None or not token.get_secret_value().strip():
            return None
        return SecretStr(check_token(token.get_secret_value(), "PALOMINO_" + str(info.field_name).upper()))

    @field_validator("dashboard_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            parts = urlsplit(origin)
            if origin == "*" or "*" in origin:
                raise ValueError("'*' is not allowed: list the exact origins, e.g. [\"https://lab.example.org\"]")
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], e.g. https://lab.example.org)")
        return [o.rstrip("/") for o in origins]

    @model_validator(mode="after")
    def _somewhere(self) -> DashboardSettings:
        if self.dashboard_runs is None and self.orchestrator_url is None:
            self.dashboard_runs = DEFAULT_RUNS  # what `palomino train` and `palomino orchestrator` write by default
        return self

    @property
    def token(self) -> str | None:
        return self.dashboard_token.get_secret_value() if self.dashboard_token else None


def dashboard_settings(**flags: object) -> DashboardSettings:
    """Settings from the environment with the given flags on top; a bad value is a ConfigError naming it."""
    given = {_FIELDS.get(k, k): v for k, v in flags.items() if v is not None}
    try:
        return DashboardSettings(**given)
    except ValidationError as error:
        name = describe_validation(
            error, lambda field: _NAMES.get(field, "PALOMINO_" + field.upper()), show_input=False
        )
        raise ConfigError(f"dashboard: {name}") from None


_FIELDS = {"orchestrator": "orchestrator_url", "broker": "broker_url", "runs": "dashboard_runs"}
_NAMES = {
    "orchestrator_url": "--orchestrator / PALOMINO_ORCHESTRATOR_URL",
    "broker_url": "--broker / PALOMINO_BROKER_URL",
    "dashboard_runs": "--runs / PALOMINO_DASHBOARD_RUNS",
}
