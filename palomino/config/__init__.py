"""An experiment's configuration: YAML validated once, at the boundary, by pydantic."""

from palomino.config.loading import apply_overrides, dump_config, load_config, parse_config
from palomino.config.models import (
    DataConfig,
    DistributedConfig,
    ExperimentConfig,
    FitnessConfig,
    GridConfig,
    MixtureConfig,
    MutationConfig,
    NetworkConfig,
    TrainingConfig,
)

__all__ = [
    "DataConfig",
    "DistributedConfig",
    "ExperimentConfig",
    "FitnessConfig",
    "GridConfig",
    "MixtureConfig",
    "MutationConfig",
    "NetworkConfig",
    "TrainingConfig",
    "apply_overrides",
    "dump_config",
    "load_config",
    "parse_config",
]
