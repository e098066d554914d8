"""How the referee (benchmarks/quality.py) scores: the same held-out split, classifier and sample
counts for every method; mixtures drawn as the grid's are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from palomino.coevolution.ensemble_search import FINE_BANDWIDTH_FACTORS, FrechetScore
from palomino.coevolution.mixture_weights import MixtureScore
from palomino.config import ExperimentConfig
from palomino.data import Dataset, load_dataset
from palomino.scoring import mode_coverage
from palomino.scoring.memorization import MemorizationScale

SAMPLES = 2500  # toys: points scored per generator (the literature's protocol)
IMAGE_SAMPLES = 2000  # images: samples per FID, as many as the held-out real images


def split_data(
    config: ExperimentConfig, seed: int, validation: int = 0
) -> tuple[Dataset, Dataset | None, Dataset | None]:
    """(training data, held-out data, validation data): toys are drawn anew for scoring (and sampled
    with another seed for validation); images keep 2,000 aside, and `validation` more of the
    training images when a sweep picks learning rates (never trained on, never scored against)."""
    if config.data.name.startswith("gaussian"):
        return load_dataset(config.data, seed), None, None
    from palomino.data.dataset import subset_indices
    from palomino.scoring.classifier import classifier_split

    split = classifier_split(config.data, holdout=IMAGE_SAMPLES, seed=0)
    train = split.train
    if config.data.size and config.data.size < len(train):  # the case's data.size, as `palomino train` takes it
        train = train.rows(torch.from_numpy(subset_indices(len(train), config.data.size, 0, "the training split")))
    if not validation:
        return train, split.test, None
    kept, apart = torch.arange(len(train)).split([len(train) - validation, validation])
    return train.rows(kept), split.test, train.rows(apart)


@torch.no_grad()
def draw(generators: list[torch.nn.Module], weights: np.ndarray, n: int, latent: int, seed: int) -> torch.Tensor:
    """n samples of the mixture (generator space): component i draws about n·wᵢ of them."""
    from palomino.runs.mixture import component_counts

    g = torch.Generator().manual_seed(seed)
    parts = [
        net.eval()(torch.randn(int(k), latent, generator=g))
        for net, k in zip(generators, component_counts(weights, n))
        if k
    ]
    return torch.cat(parts)


class Referee:
    """Scores samples of one case the same way for every method."""

    def __init__(
        self,
        config: ExperimentConfig,
        train: Dataset,
        held_out: Dataset | None,
        out: Path,
        validation: Dataset | None = None,
        extractor: str = "classifier",
    ) -> None:
        self.config, self.train, self.held_out = config, train, held_out
        self.extractor = None
        if held_out is not None:
            from palomino.scoring.classifier import save_classifier, train_classifier
            from palomino.scoring.extractors import ClassifierExtractor

            arch = "lipizzaner" if extractor == "lipizzaner" else "cnn"
            path = out / f"classifier-{config.data.name}{'' if arch == 'cnn' else '-' + arch}.safetensors"
            if not path.exists():  # trained on the same 8,000 / 2,000 split the GANs use
                save_classifier(train_classifier(config.data, holdout=IMAGE_SAMPLES, arch=arch), path)
            self.classifier = path
            self.extractor = ClassifierExtractor(path)
            self.real = self.extractor.extract(((held_out.samples + 1) / 2).clamp(0, 1))
            self.validation_real = (
                None if validation is None else self.extractor.extract(((validation.samples + 1) / 2).clamp(0, 1))
            )
            # The memorization ratio's denominator, once per case: as many held-out images as samples scored.
            some = torch.randperm(len(held_out), generator=torch.Generator().manual_seed(0))[:IMAGE_SAMPLES]
            self.memorization = MemorizationScale.calibrate(train.samples, held_out.samples[some])

    def score(self, samples: torch.Tensor, validation: bool = False) -> dict[str, float]:
        """Scores against the held-out images (or, `validation`, the validation images: FID only)."""
        if self.extractor is None:
            coverage = mode_coverage(samples, self.train.modes, self.train.mode_std)
            return {"modes": coverage.covered, "hq": coverage.high_quality}
        from palomino.coevolution.ensemble_search import feature_fid
        from palomino.scoring.tvd import class_tvd

        features, logits = self.extractor.extract(((samples + 1) / 2).clamp(0, 1))
        real_features, real_logits = self.validation_real if validation else self.real
        scores = {"fid": feature_fid(features, real_features), "tvd": class_tvd(logits, real_logits)}
        if validation:
            return scores
        return {**scores, "memorization": self.memorization.of(samples).ratio}

    def sample_count(self) -> int:
        return SAMPLES if self.extractor is None else IMAGE_SAMPLES

    @staticmethod
    def worse(scores: dict[str, float]) -> float:
        """Lower is better: FID for images; for toys modes first, then the high-quality share."""
        return scores["fid"] if "fid" in scores else -(scores["modes"] + scores["hq"])


def selection_score(generator: torch.nn.Module, train: Dataset, latent: int, seed: int, referee: Referee) -> float:
    """How indep-best picks its GAN, as the grid's ensemble picks its weights: against training
    data, never the held-out data — FID on the classifier's features for images, MMD² for points."""
    fake = draw([generator], np.ones(1), 1000, latent, seed + 1)
    real = train.samples[torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:1000]]
    if referee.extractor is not None:
        features = [referee.extractor.extract(((x + 1) / 2).clamp(0, 1))[0] for x in (fake, real)]
        return FrechetScore.from_features([features[0]], features[1])(np.ones(1))
    return MixtureScore.from_samples([fake], real, FINE_BANDWIDTH_FACTORS)(np.ones(1))
