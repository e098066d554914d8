"""Where the broker, Redis and the orchestrator are: flags, else PALOMINO_* variables, else local defaults."""

from __future__ import annotations

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from palomino.endpoints import BROKER_URL, CONNECT_DEADLINE, ORCHESTRATOR_URL, REDIS_URL
from palomino.services.common.auth import check_token
from palomino.transport.replay import MAX_AGE
from palomino.transport.signing import MessageKey


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PALOMINO_", extra="ignore")

    broker_url: str = BROKER_URL
    redis_url: str = REDIS_URL
    orchestrator_url: str = ORCHESTRATOR_URL
    # Seconds a connect keeps trying a broker that times out or refuses (0: one try), with backoff.
    connect_deadline: float = Field(CONNECT_DEADLINE, ge=0, le=3600)
    # Several stacks on one broker (e.g. two `palomino up` at once) keep apart by namespace:
    # each has its own orchestrator queue and score queue. Empty: the shared default names.
    namespace: str = Field("", pattern=r"^[A-Za-z0-9_-]{0,64}$")  # no dots: queue names stay unambiguous
    # Folders (os.pathsep-separated) a submitted experiment's data.dir may be in; empty: the usual ones.
    data_roots: str = ""
    # Bytes a submitted experiment's data may take in each cell (estimated at submit, see config/footprint.py).
    max_data_bytes: int = Field(4 * 1024**3, ge=1024**2)
    # Experiments one client (address) may have waiting or running at once; further submissions get 429.
    max_active_per_client: int = Field(16, ge=1, le=100_000)
    # Seconds an ended experiment stays listed; its run directory stays on disk regardless.
    retention_seconds: float = Field(7 * 24 * 3600, ge=0, le=10 * 365 * 24 * 3600)
    # The orchestrator writes each experiment's TensorBoard events to <tensorboard>/<experiment>; empty: none.
    tensorboard: str = ""
    # The orchestrator API's bearer token: the orchestrator requires it, its clients send it.
    orchestrator_token: SecretStr | None = None
    # Signs every message between the stack's services (palomino/transport/signing.py); unset: none is
    # signed or checked. Every service of a stack needs the same one.
    message_key: SecretStr | None = None
    # Seconds a signed message may wait in a queue before it is refused as a possible replay
    # (palomino/transport/replay.py): a week, as long as a score job may wait for a scorer.
    message_max_age: float = Field(MAX_AGE, ge=60, le=365 * 24 * 3600)

    @field_validator("orchestrator_token", "message_key")
    @classmethod
    def _token(cls, token: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if token is None or not token.get_secret_value().strip():
            return None
        return SecretStr(check_token(token.get_secret_value(), f"PALOMINO_{str(info.field_name).upper()}"))

    @property
    def signer(self) -> MessageKey | None:
        if not self.message_key:
            return None
        return MessageKey(self.message_key.get_secret_value(), max_age=self.message_max_age)

    @property
    def token(self) -> str | None:
        return self.orchestrator_token.get_secret_value() if self.orchestrator_token else None

    def with_flags(self, **flags: str | None) -> ServiceSettings:
        return self.model_copy(update={k: v for k, v in flags.items() if v})
