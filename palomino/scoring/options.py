"""What a scoring computes and how: one pydantic model, validated at the boundary (CLI flags, a score job)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

from pydantic import ConfigDict, Field, ValidationError

from palomino.config.models import REAL_SCORE_SAMPLES, SCORE_SAMPLES, MetricName, MixtureScoring, ScoringConfig
from palomino.errors import ConfigError, describe_validation

METRICS: tuple[str, ...] = get_args(MetricName)
DEFAULT_METRICS = {"image": ["fid", "is", "kid", "tvd", "memorization"], "points": ["modes"]}


class ScoringOptions(MixtureScoring):
    """An experiment's scoring choices (metrics, samples, extractor, classifier) and how to compute them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inception_weights: Path | None = Field(
        None, description="None: $PALOMINO_INCEPTION_WEIGHTS, else torchvision's hub cache"
    )
    cache_dir: Path | None = Field(None, description="None: $PALOMINO_CACHE_DIR, else ~/.cache/palomino")
    real_samples: int = Field(REAL_SCORE_SAMPLES, ge=0, description="real images behind the real statistics; 0 = all")
    seed: int = Field(0, ge=0, description="seeds the generated samples and KID's / IS's subsets")
    batch_size: int = Field(500, ge=1)
    is_splits: int = Field(10, ge=1, description="Inception Score splits")
    device: str = "cpu"

    @classmethod
    def build(cls, config: ScoringConfig | None = None, **flags: Any) -> ScoringOptions:
        """An experiment's `scoring:` section overridden by the flags that were given (None = not given);
        a bad value is a ConfigError naming the flag."""
        values: dict[str, Any] = {}
        if config is not None:
            values.update(config.job_options())  # what a score job would carry
        values.update({k: v for k, v in flags.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            raise ConfigError(describe_validation(error, lambda field: "--" + field.replace("_", "-"))) from None

    def metrics_for(self, kind: str) -> list[str]:
        return list(self.metrics) if self.metrics else list(DEFAULT_METRICS[kind])

    def samples_for(self, kind: str) -> int:
        return self.samples or SCORE_SAMPLES[kind]


def parse_metrics(text: str | None) -> list[str] | None:
    """`fid,is,kid` → ["fid", "is", "kid"]; an unknown name is a ConfigError listing the valid ones."""
    if text is None:
        return None
    names = list(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        raise ConfigError(
            f"--metrics {text!r}: unknown metric {', '.join(unknown) or '(none given)'}; choose from {','.join(METRICS)}"
        )
    return names
