"""YAML in, validated ExperimentConfig out; every failure is a ConfigError naming the field."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from palomino.config.models import ExperimentConfig
from palomino.errors import ConfigError, describe_validation


def parse_config(raw: dict[str, Any]) -> ExperimentConfig:
    if not isinstance(raw, dict):
        raise ConfigError("config: the top level must be a mapping of keys (grid, training, data, ...)")
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(f"config: {describe_validation(error)}") from None


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` strings; values are parsed as YAML scalars or lists."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected dotted.key=value, e.g. training.iterations=20")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return raw


def load_config(path: Path, overrides: Iterable[str] = ()) -> ExperimentConfig:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"config: cannot read {path}: {error.strerror}") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"config: {path} is not valid YAML: {error}".replace("\n", " ")) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config: {path} must hold a mapping of keys (grid, training, data, ...)")
    return parse_config(apply_overrides(raw, overrides))


def dump_config(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
