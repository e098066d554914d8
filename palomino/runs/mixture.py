"""A trained mixture of generators: saved as result/mixture.safetensors + mixture.json, sampled from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from palomino.config import NetworkConfig
from palomino.errors import PalominoError
from palomino.nn import build_generator
from palomino.runs.checkpoints import encode_tensors
from palomino.runs.result import save_encoded


def component_counts(weights: np.ndarray, n: int) -> np.ndarray:
    """Exact proportions (largest remainder): component i draws ≈ n·w_i samples, summing to n."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / weights.sum()
    raw = weights * n
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: n - counts.sum()]:
        counts[i] += 1
    return counts


def to_data_space(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Generator output → data space: images from [−1, 1] to [0, 1]; points unchanged."""
    return ((x + 1) / 2).clamp(0, 1) if kind == "image" else x


@dataclass
class Mixture:
    generators: list[nn.Module]
    weights: np.ndarray
    components: list[str]  # "r-c" of the cell each generator came from
    network: NetworkConfig
    sample_shape: tuple[int, ...]
    kind: str
    info: dict[str, Any]

    @torch.no_grad()
    def sample(self, n: int, seed: int = 0, data_space: bool = True) -> torch.Tensor:
        """n samples, each component contributing its weight's share, in a seeded random order."""
        rng = torch.Generator().manual_seed(seed)
        parts = []
        for generator, count in zip(self.generators, component_counts(self.weights, n)):
            if count:
                generator.eval()  # BatchNorm uses its running statistics when sampling
                z = torch.randn(int(count), self.network.latent_dim, generator=rng)
                parts.append(generator(z))
        samples = torch.cat(parts)[torch.randperm(n, generator=rng)]
        return to_data_space(samples, self.kind) if data_space else samples

    def encode(self) -> tuple[bytes, dict[str, Any]]:
        """(safetensors bytes of the components, the JSON description): what result/ holds."""
        payload = encode_tensors(
            {f"component.{i}.{k}": v for i, g in enumerate(self.generators) for k, v in g.state_dict().items()}
        )
        description = {
            "weights": [float(w) for w in self.weights],
            "components": self.components,
            "network": self.network.model_dump(mode="json"),
            "sample_shape": list(self.sample_shape),
            "kind": self.kind,
            **self.info,
        }
        return payload, description

    def save(self, folder: Path) -> None:
        save_encoded(folder, *self.encode())

    @classmethod
    def load(cls, folder: Path, device: str = "cpu") -> Mixture:
        try:
            description = json.loads((folder / "mixture.json").read_text())
            tensors = load_file(str(folder / "mixture.safetensors"), device=device)
        except (OSError, ValueError) as error:
            raise PalominoError(f"{folder}: no readable mixture ({error}); did the run finish?") from None
        network = NetworkConfig.model_validate(description["network"])
        shape = tuple(description["sample_shape"])
        generators = []
        for i in range(len(description["weights"])):
            prefix = f"component.{i}."
            generator = build_generator(network, shape, description["kind"]).to(device)
            generator.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
            generators.append(generator)
        info = {k: v for k, v in description.items() if k not in {"weights", "components", "network", "sample_shape", "kind"}}
        return cls(generators, np.array(description["weights"]), description["components"], network, shape, description["kind"], info)
