"""Feature extractors: images in [0, 1] (any size, 1 or 3 channels) → (features, logits).

- `classifier`: the small CNN of `palomino classifier train` (offline; features for FID/KID, logits for IS/TVD).
- `lipizzaner`: Lipizzaner's MNIST CNN: by default Lipizzaner's own trained weights (bundled with
  palomino.nn), else a file of it (`--arch lipizzaner`, or `classifier import`): its 10 logits are its
  features, so FIDs compare with Lipizzaner's published ones. `classifier` takes it too:
  the file says which network it holds, and the extractor is named after it.
- `inception`: Inception-v3, the standard FID network (2048 pool features, 1008 logits). Either
  torch-fidelity's FID Inception with its weights given by path, or torchvision's Inception-v3 when its
  weights are already in the torch hub cache. Both are imported only here, lazily; nothing is ever
  downloaded: without weights the error says which flag or variable to set.

Each extractor has an `identity` (name + SHA-256 of its weights) that keys the real-statistics cache.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from palomino.errors import ConfigError, PalominoError
from palomino.scoring.classifier import adapt_images, load_classifier
from palomino.scoring.lipizzaner_protocol import ARCH as LIPIZZANER
from palomino.scoring.lipizzaner_protocol import BUNDLED

if TYPE_CHECKING:
    from palomino.config import ExperimentConfig

EXTRACTORS: tuple[str, ...] = ("classifier", "lipizzaner", "inception")
CLASSIFIER_ENV = "PALOMINO_CLASSIFIER"
INCEPTION_ENV = "PALOMINO_INCEPTION_WEIGHTS"
CACHE_ENV = "PALOMINO_CACHE_DIR"
# torchvision's Inception-v3 (IMAGENET1K_V1), as torch.hub caches it.
TORCHVISION_INCEPTION = "inception_v3_google-0cc3c7bd.pth"


def scoring_cache_dir(option: Path | None = None) -> Path:
    """--cache-dir, else PALOMINO_CACHE_DIR, else Palomino's cache (~/.cache/palomino on Linux)."""
    from palomino.cache import cache_root

    if option is not None:
        return Path(option)
    return Path(os.environ.get(CACHE_ENV) or cache_root())


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class FeatureExtractor(nn.Module):
    """The protocol the metrics use: `extract(images) → (features, logits)`, plus what the cache keys on."""

    name: str
    identity: str
    num_features: int
    classes: tuple[str, ...]  # what the logits mean (the classifier's dataset classes; ImageNet's for inception)
    dataset: str | None  # the dataset a classifier was trained on; None for a general-purpose network

    def extract(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.extract(images)[0]


class ClassifierExtractor(FeatureExtractor):
    def __init__(self, path: Path, device: str = "cpu") -> None:
        super().__init__()
        trained = load_classifier(path, device)
        self.net = trained.net.requires_grad_(False)
        self.shape = trained.image_shape
        self.name = LIPIZZANER if trained.arch == LIPIZZANER else "classifier"  # what its features are
        self.identity = f"{self.name}-{trained.meta['sha256'][:16]}"
        self.num_features = self.net.num_features
        self.classes = trained.classes
        self.dataset = trained.meta["dataset"]
        self.meta = trained.meta

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.net.eval()
        return self.net.features_and_logits(adapt_images(images, self.shape))


class FidelityInception(FeatureExtractor):
    """torch-fidelity's FID Inception-v3 (TF-ported weights): the network published FIDs are computed with."""

    def __init__(self, weights: Path, device: str = "cpu", cache_dir: Path | None = None) -> None:
        super().__init__()
        try:
            from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
        except Exception as error:  # noqa: BLE001 — ImportError, or torchvision failing to import beneath it
            raise PalominoError(
                f"--extractor inception with --inception-weights needs torch-fidelity, which does not import here ({error}); "
                "install it with: pip install 'palomino[vision]', or score with --extractor classifier"
            ) from None
        # torch.load reads a .safetensors path with safetensors: torch-fidelity's weights are never unpickled.
        self.net = FeatureExtractorInceptionV3(
            "inception-v3-compat", ["2048", "logits_unbiased"], str(_as_safetensors(weights, cache_dir))
        )
        self.net.to(device)
        self.name = "inception"
        self.identity = f"inception-fidelity-{file_digest(weights)[:16]}"
        self.num_features = 2048
        self.classes = tuple(str(i) for i in range(1008))
        self.dataset = None

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # It takes uint8 RGB of any size and resizes to 299 itself, as in the reference FID code.
        pixels = (adapt_images(images, (3, *images.shape[-2:])).clamp(0, 1) * 255).round().to(torch.uint8)
        features, logits = self.net(pixels)
        return features, logits


class TorchvisionInception(FeatureExtractor):
    """torchvision's ImageNet Inception-v3 from weights already in the torch hub cache (FIDs are not
    comparable with published ones, which use the TF-ported network)."""

    def __init__(self, weights: Path, device: str = "cpu") -> None:
        super().__init__()
        try:
            from torchvision.models import inception_v3
        except Exception as error:  # noqa: BLE001 — torchvision fails in several ways with a CPU-only torch
            raise PalominoError(
                f"--extractor inception from torchvision's cache needs torchvision, which does not import here ({error}); "
                f"give torch-fidelity weights with --inception-weights FILE (or {INCEPTION_ENV}), or use --extractor classifier"
            ) from None
        net = inception_v3(weights=None, aux_logits=True, init_weights=False, transform_input=False)
        net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        self.fc = net.fc
        net.fc = nn.Identity()  # the network then returns its 2048 pooled features
        self.net = net.eval().requires_grad_(False).to(device)
        self.fc.requires_grad_(False).to(device)
        self.name = "inception"
        self.identity = f"inception-torchvision-{file_digest(weights)[:16]}"
        self.num_features = 2048
        self.classes = tuple(str(i) for i in range(1000))
        self.dataset = None

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.net.eval()
        x = adapt_images(images, (3, 299, 299)) * 2 - 1  # Google's Inception-v3 takes [−1, 1]
        features = self.net(x)
        return features, self.fc(features)


def _as_safetensors(weights: Path, cache_dir: Path | None) -> Path:
    """A .safetensors file of `weights`: itself, or a copy converted once into the cache (tensors only, no pickle)."""
    if weights.suffix == ".safetensors":
        return weights
    from safetensors.torch import save

    from palomino.io import atomic_write

    folder = scoring_cache_dir(cache_dir) / "weights"
    folder.mkdir(parents=True, exist_ok=True)
    converted = folder / f"{weights.stem}-{file_digest(weights)[:16]}.safetensors"
    if not converted.exists():
        state = torch.load(weights, map_location="cpu", weights_only=True)
        atomic_write(converted, save({k: v.contiguous() for k, v in state.items()}))
    return converted


def torchvision_cached_weights() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / TORCHVISION_INCEPTION


def build_extractor(
    name: str,
    *,
    classifier: Path | None = None,
    inception_weights: Path | None = None,
    device: str = "cpu",
    cache_dir: Path | None = None,
) -> FeatureExtractor:
    """The named extractor. Paths left as None come from PALOMINO_CLASSIFIER / PALOMINO_INCEPTION_WEIGHTS."""
    if name == LIPIZZANER and classifier is None:
        return ClassifierExtractor(BUNDLED, device)  # Lipizzaner's own weights, as its papers scored
    if name in ("classifier", LIPIZZANER):
        path = classifier or (Path(os.environ[CLASSIFIER_ENV]) if os.environ.get(CLASSIFIER_ENV) else None)
        arch = " --arch lipizzaner" if name == LIPIZZANER else ""
        make = f"palomino classifier train{arch} --data mnist --data-dir DIR --out FILE.safetensors"
        if name == LIPIZZANER:
            make += " (or from Lipizzaner's weights: palomino classifier import --weights FILE --data mnist --out FILE.safetensors)"
        if path is None:
            raise ConfigError(
                f"--extractor {name} needs a classifier file: give --classifier FILE (or set {CLASSIFIER_ENV}); "
                f"make one with: {make}"
            )
        extractor = ClassifierExtractor(Path(path), device)
        if name == LIPIZZANER and extractor.name != LIPIZZANER:
            raise ConfigError(
                f"--extractor lipizzaner: {path} is a {extractor.meta.get('architecture', {}).get('name', 'cnn')} "
                f"classifier, not Lipizzaner's MNIST CNN; make one with: {make}"
            )
        return extractor
    if name == "inception":
        path = inception_weights or (Path(os.environ[INCEPTION_ENV]) if os.environ.get(INCEPTION_ENV) else None)
        if path is not None:
            if not Path(path).is_file():
                raise ConfigError(f"--inception-weights {path}: no such file")
            return FidelityInception(Path(path), device, cache_dir)
        cached = torchvision_cached_weights()
        if cached.is_file():
            return TorchvisionInception(cached, device)
        raise ConfigError(
            "--extractor inception needs Inception-v3 weights and never downloads them: give torch-fidelity's "
            f"weights-inception-2015-12-05-6726825d.pth with --inception-weights FILE (or set {INCEPTION_ENV}), "
            f"or put torchvision's {TORCHVISION_INCEPTION} in {cached.parent}; "
            "offline, use --extractor classifier instead"
        )
    raise ConfigError(f"--extractor {name!r}: unknown; use one of {', '.join(EXTRACTORS)}")


def ensemble_features(
    config: ExperimentConfig, kind: str, device: str | torch.device = "cpu"
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What the grid's ensemble of an image run is scored on (palomino.runs.grid_ensemble.grid_ensemble's
    `features`): the features of the classifier of `scoring.classifier`, else $PALOMINO_CLASSIFIER,
    for generated images in generator space ([−1, 1]). None for points, or where no classifier is
    configured (the ensemble is then optimised on pixel MMD²)."""
    path = config.scoring.classifier or os.environ.get(CLASSIFIER_ENV)
    if kind != "image" or not config.grid_ensemble or not path:
        return None
    extractor = ClassifierExtractor(Path(path), str(device))

    def features(images: torch.Tensor) -> torch.Tensor:
        return extractor.extract(((images + 1) / 2).clamp(0, 1))[0]

    return features
