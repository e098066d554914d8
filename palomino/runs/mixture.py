"""A trained mixture of generators: saved as result/mixture.safetensors + mixture.json, sampled from.

Conditional generators draw labels from the class priors unless given them. A partitioned
run's result is a `ClassMixture`: p(x) = Σ_c p(c) p(x | c), one `Mixture` per class.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from palomino.coevolution.rejection import CriticFilter
from palomino.config import NetworkConfig
from palomino.errors import PalominoError
from palomino.nn import apply, build_discriminator, build_generator
from palomino.runs.checkpoints import encode_tensors
from palomino.runs.filter_rule import FilterRule
from palomino.runs.images import to_data_space
from palomino.runs.result import CLASS_MIXTURE, save_encoded


def component_counts(weights: np.ndarray, n: int) -> np.ndarray:
    """Exact proportions (largest remainder): component i draws ≈ n·w_i samples, summing to n."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / weights.sum()
    raw = weights * n
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: n - counts.sum()]:
        counts[i] += 1
    return counts


def draw_labels(priors: dict[int, float], n: int, rng: torch.Generator) -> torch.Tensor:
    """n labels in the priors' exact proportions (largest remainder), in a seeded random order."""
    classes = sorted(priors)
    counts = component_counts(np.array([priors[c] for c in classes]), n)
    labels = torch.tensor(classes, dtype=torch.int64).repeat_interleave(torch.from_numpy(counts))
    return labels[torch.randperm(n, generator=rng)]


def check_labels(labels: Sequence[int] | torch.Tensor, n: int, trained: Sequence[int]) -> torch.Tensor:
    """`labels` as a tensor of n labels, each one the mixture was trained on; PalominoError otherwise."""
    labels = torch.as_tensor(labels, dtype=torch.int64).flatten()
    if len(labels) != n:
        raise PalominoError(f"{len(labels)} labels for {n} samples: give one label per sample")
    unknown = sorted(set(labels.tolist()) - set(trained))
    if unknown:
        raise PalominoError(f"class {unknown[0]} was not trained in this run; its classes are {sorted(trained)}")
    return labels


@dataclass
class Mixture:
    generators: list[nn.Module]
    weights: np.ndarray
    components: list[str]  # "r-c" of the cell each generator came from
    network: NetworkConfig
    sample_shape: tuple[int, ...]
    kind: str
    info: dict[str, Any]
    priors: dict[int, float] | None = None  # conditional generators: p(c) of the training data
    label_count: int | None = None  # conditional generators: size of their label embedding
    # Discriminators that sampling passes every sample through (palomino.coevolution.rejection),
    # named by `critic_cells`; they filter only when `threshold` is set (a cell's neighbourhood
    # mixture carries its own discriminator so the grid's ensemble can gather them all).
    critics: list[nn.Module] = field(default_factory=list)
    critic_cells: list[str] = field(default_factory=list)
    threshold: float | None = None
    quantile: float | None = None  # of real data, from which `threshold` was calibrated
    # training.ensemble.critic "own": each component's samples pass its own cell's critic alone,
    # at its own threshold (one per component); `threshold` is then unused.
    thresholds: list[float] | None = None

    @property
    def conditional(self) -> bool:
        return self.priors is not None

    @property
    def filter(self) -> CriticFilter | None:
        """The critics together at one threshold (training.ensemble.critic "mean")."""
        if self.threshold is None or not self.critics:
            return None
        return CriticFilter(self.critics, self.threshold)

    def component_filters(self) -> list[CriticFilter | None]:
        """What each component's samples pass through: its own cell's critic at its own threshold
        where the mixture has `thresholds`, else the critics together (or nothing)."""
        if self.thresholds is None or not self.critics:
            return [self.filter] * len(self.generators)
        own = dict(zip(self.critic_cells, self.critics))
        return [CriticFilter([own[c]], t) for c, t in zip(self.components, self.thresholds)]

    @property
    def rule(self) -> FilterRule | None:
        """mixture.json's "filter" for how this mixture samples (None: unfiltered)."""
        if self.thresholds is not None:
            return FilterRule(rule="own", thresholds=self.thresholds, quantile=self.quantile)
        if self.threshold is not None:
            return FilterRule(threshold=self.threshold, quantile=self.quantile)
        return None

    def use_filter(self, rule: FilterRule | None) -> None:
        """Sample through `rule` from now on (its critics are this mixture's)."""
        self.threshold = rule.threshold if rule else None
        self.thresholds = rule.thresholds if rule else None
        self.quantile = rule.quantile if rule else None

    @property
    def classes(self) -> list[int]:
        """The labels a conditional mixture can be asked for ([] when unconditional)."""
        return sorted(self.priors) if self.priors else []

    def sample(
        self, n: int, seed: int = 0, data_space: bool = True, labels: Sequence[int] | torch.Tensor | None = None
    ) -> torch.Tensor:
        """n samples, each component contributing its weight's share, in a seeded random order.

        Conditional: sample i is of class labels[i]; without labels, classes follow the priors."""
        return self.sample_labelled(n, seed, data_space, labels)[0]

    @torch.no_grad()
    def sample_labelled(
        self, n: int, seed: int = 0, data_space: bool = True, labels: Sequence[int] | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(samples, the class each was drawn for); the classes are None for an unconditional mixture."""
        if not self.conditional:
            if labels is not None:
                raise PalominoError(
                    "this run's generators are unconditional: drawing a class needs a conditional "
                    "(network.conditional: true) or partitioned (data.partition: labels) run"
                )
            return self._sample_unconditional(n, seed, data_space), None
        assert self.priors is not None
        rng = torch.Generator().manual_seed(seed)
        labels = draw_labels(self.priors, n, rng) if labels is None else check_labels(labels, n, self.classes)
        order = torch.randperm(n, generator=rng)
        out: torch.Tensor | None = None
        start = 0
        for generator, count in zip(self.generators, component_counts(self.weights, n)):
            if not count:
                continue
            index, start = order[start : start + count], start + count
            generator.eval()
            device = next(generator.parameters()).device
            z = torch.randn(int(count), self.network.latent_dim, generator=rng).to(device)
            x = apply(generator, z, labels[index].to(device)).cpu()
            out = x.new_empty((n, *x.shape[1:])) if out is None else out
            out[index] = x
        assert out is not None
        return (to_data_space(out, self.kind) if data_space else out), labels

    @torch.no_grad()
    def _sample_unconditional(self, n: int, seed: int, data_space: bool) -> torch.Tensor:
        rng = torch.Generator().manual_seed(seed)
        parts = []
        filters = self.component_filters()
        for generator, count, critics in zip(self.generators, component_counts(self.weights, n), filters):
            if count:
                generator.eval()  # BatchNorm uses its running statistics when sampling
                device = next(generator.parameters()).device

                def generate(k: int, generator: nn.Module = generator, device: torch.device = device) -> torch.Tensor:
                    return generator(torch.randn(k, self.network.latent_dim, generator=rng).to(device)).cpu()

                parts.append(generate(int(count)) if critics is None else critics.draw(generate, int(count)))
        samples = torch.cat(parts)[torch.randperm(n, generator=rng)]
        return to_data_space(samples, self.kind) if data_space else samples

    def encode(self) -> tuple[bytes, dict[str, Any]]:
        """(safetensors bytes of the components, the JSON description): what result/ holds."""
        tensors = {f"component.{i}.{k}": v for i, g in enumerate(self.generators) for k, v in g.state_dict().items()}
        tensors.update({f"critic.{i}.{k}": v for i, d in enumerate(self.critics) for k, v in d.state_dict().items()})
        payload = encode_tensors(tensors)
        description = {
            "weights": [float(w) for w in self.weights],
            "components": self.components,
            "network": self.network.model_dump(mode="json"),
            "sample_shape": list(self.sample_shape),
            "kind": self.kind,
            **self.info,
        }
        if self.priors is not None:
            description["priors"] = {str(c): float(p) for c, p in sorted(self.priors.items())}
            description["label_count"] = self.label_count
        if self.critics:
            description["critics"] = self.critic_cells
        if self.rule is not None:
            description["filter"] = self.rule.encode()
        return payload, description

    def save(self, folder: Path) -> None:
        save_encoded(folder, *self.encode())

    @classmethod
    def load(cls, folder: Path, device: str = "cpu") -> Mixture | ClassMixture:
        """The mixture saved in `folder`; a partitioned run's result/ loads as a ClassMixture."""
        try:
            description = json.loads((folder / "mixture.json").read_text())
            if description.get("type") == CLASS_MIXTURE:
                return ClassMixture.load(folder, device)
            tensors = load_file(str(folder / "mixture.safetensors"), device=device)
        except (OSError, ValueError) as error:
            raise PalominoError(f"{folder}: no readable mixture ({error}); did the run finish?") from None
        network = NetworkConfig.model_validate(description["network"])
        shape = tuple(description["sample_shape"])
        priors = {int(c): float(p) for c, p in description["priors"].items()} if "priors" in description else None
        label_count = description.get("label_count")
        generators = []
        for i in range(len(description["weights"])):
            prefix = f"component.{i}."
            generator = build_generator(network, shape, description["kind"], label_count).to(device)
            generator.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
            generators.append(generator)
        critics = []
        for i in range(len(description.get("critics", []))):
            prefix = f"critic.{i}."
            critic = build_discriminator(network, shape, description["kind"], label_count).to(device)
            critic.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
            critics.append(critic)
        special = {
            "weights",
            "components",
            "network",
            "sample_shape",
            "kind",
            "priors",
            "label_count",
            "critics",
            "filter",
        }
        info = {k: v for k, v in description.items() if k not in special}
        rule = None
        if description.get("filter") is not None:
            try:
                rule = FilterRule.checked(
                    description["filter"], description["components"], description.get("critics", [])
                )
            except ValueError as error:
                raise PalominoError(f"{folder}: {error}") from None
        mixture = cls(
            generators,
            np.array(description["weights"]),
            description["components"],
            network,
            shape,
            description["kind"],
            info,
            priors,
            label_count,
            critics,
            list(description.get("critics", [])),
        )
        mixture.use_filter(rule)
        return mixture


@dataclass
class ClassMixture:
    """p(x) = Σ_c p(c) p(x | c): each class's best mixture (of its sub-grid), weighted by the
    class priors of the training data. What a partitioned run's result/ holds."""

    conditional = True  # like a conditional Mixture, it can be asked for a class (not a dataclass field)
    parts: dict[int, Mixture]  # label → that class's mixture
    priors: dict[int, float]
    info: dict[str, Any]

    @property
    def classes(self) -> list[int]:
        return sorted(self.parts)

    @property
    def kind(self) -> str:
        return self.parts[self.classes[0]].kind

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.parts[self.classes[0]].sample_shape

    def sample(
        self, n: int, seed: int = 0, data_space: bool = True, labels: Sequence[int] | torch.Tensor | None = None
    ) -> torch.Tensor:
        """n samples; sample i from class labels[i]'s mixture, or classes in the priors' proportions."""
        return self.sample_labelled(n, seed, data_space, labels)[0]

    @torch.no_grad()
    def sample_labelled(
        self, n: int, seed: int = 0, data_space: bool = True, labels: Sequence[int] | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rng = torch.Generator().manual_seed(seed)
        labels = draw_labels(self.priors, n, rng) if labels is None else check_labels(labels, n, self.classes)
        out: torch.Tensor | None = None
        for label in self.classes:
            part_seed = int(torch.randint(2**62, (1,), generator=rng))  # drawn for every class: stable seeds
            index = (labels == label).nonzero().squeeze(1)
            if len(index):
                x = self.parts[label].sample(len(index), seed=part_seed, data_space=data_space)
                out = x.new_empty((n, *x.shape[1:])) if out is None else out
                out[index] = x
        assert out is not None
        return out, labels

    @classmethod
    def load(cls, folder: Path, device: str = "cpu") -> ClassMixture:
        try:
            description = json.loads((folder / "mixture.json").read_text())
            classes = description["classes"]
        except (OSError, ValueError, KeyError) as error:
            raise PalominoError(f"{folder}: no readable class mixture ({error}); did the run finish?") from None
        parts: dict[int, Mixture] = {}
        for label, entry in classes.items():
            part = Mixture.load(folder / entry["path"], device)
            assert isinstance(part, Mixture)
            parts[int(label)] = part
        priors = {int(label): float(entry["prior"]) for label, entry in classes.items()}
        info = {k: v for k, v in description.items() if k != "classes"}
        return cls(parts, priors, info)
