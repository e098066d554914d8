"""mixture.json's "filter": how a mixture's samples pass its critics (training.ensemble.critic).

Written by the grid's ensemble and by the scorer (whose rule the orchestrator checks before
result/ takes it) and read by `Mixture.load`: one shape for all of them.
    {"threshold": t, "quantile": q}                        mean: every critic together
    {"rule": "own", "thresholds": [t per component], ...}  own: each component its own critic
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# A threshold is a finite number: not NaN, not a string, not a bool (which JSON would let pass).
Threshold = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class FilterRule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: Literal["mean", "own"] = "mean"
    threshold: Threshold | None = None
    thresholds: list[Threshold] | None = None
    quantile: float | None = None  # of real data, from which the thresholds were calibrated

    @model_validator(mode="after")
    def _thresholds_of_the_rule(self) -> FilterRule:
        if self.rule == "own" and (self.thresholds is None or self.threshold is not None):
            raise ValueError("rule own takes thresholds, one per component, and no threshold")
        if self.rule == "mean" and (self.threshold is None or self.thresholds is not None):
            raise ValueError("rule mean takes one threshold for all critics")
        return self

    @classmethod
    def checked(cls, raw: Any, components: list[str], critics: list[str]) -> FilterRule:
        """The rule `raw` (mixture.json's or a scorer's) for these components and critics, or
        ValueError: every component needs its own critic under "own", and any rule some critic."""
        try:
            rule = cls.model_validate(raw)
        except ValidationError as error:
            raise ValueError(f"filter {str(raw)[:80]} is malformed: {error.errors()[0]['msg']}") from None
        own_fits = (
            rule.thresholds is not None and len(rule.thresholds) == len(components) and set(components) <= set(critics)
        )
        if not critics or (rule.rule == "own" and not own_fits):
            raise ValueError(f"filter {str(raw)[:80]} does not fit the mixture's components and critics")
        return rule

    def encode(self) -> dict[str, Any]:
        """mixture.json's form (a "mean" rule is written without "rule", as before there were two)."""
        if self.rule == "own":
            return {"rule": "own", "thresholds": self.thresholds, "quantile": self.quantile}
        return {"threshold": self.threshold, "quantile": self.quantile}
