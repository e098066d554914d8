"""The memorization ratio: do generated images lie nearer the training images than real images never trained on?

    ratio = median over generated samples of the distance to their nearest training image
          / median over held-out images of the distance to their nearest training image

in pixel space ([−1, 1], flattened, L2). About 1 for a generator of new images of the data's kind;
well below 1 for one that reproduces its training images; above 1 for samples farther from the data
than real images are (noise, blur). FID cannot tell these apart: a copy of the training set has the
real statistics, so a grid of copiers scores ever better FIDs (issue 24: stacks of GANs on ever
smaller data regions went from FID 138 to 3.7 while this ratio fell from 1.09 to 0.44).
Pure torch; `palomino score` (metric `memorization`) and benchmarks/quality.py report it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MEMORIZING_BELOW = 0.9  # a ratio under this flags the samples as copies of the training images
# Distances are computed in blocks of QUERY_CHUNK × REFERENCE_CHUNK (32 MiB of float32), so 2,000
# samples against Fashion-MNIST's 60,000 training images never hold the 2,000 × 60,000 matrix.
QUERY_CHUNK = 1024
REFERENCE_CHUNK = 8192


@torch.no_grad()
def nearest_distances(
    queries: torch.Tensor,
    references: torch.Tensor,
    *,
    query_chunk: int = QUERY_CHUNK,
    reference_chunk: int = REFERENCE_CHUNK,
) -> torch.Tensor:
    """Each query's L2 distance to its nearest reference (both flattened), shape (len(queries),)."""
    if len(queries) == 0 or len(references) == 0:
        raise ValueError("nearest distances need at least one query and one reference")
    q_all = queries.flatten(1).float()
    r_all = references.flatten(1).float().to(q_all.device)
    if q_all.shape[1] != r_all.shape[1]:
        raise ValueError(f"queries of {q_all.shape[1]} values cannot be compared with references of {r_all.shape[1]}")
    r_norms = r_all.square().sum(1)
    out = torch.empty(len(q_all), device=q_all.device)
    for i in range(0, len(q_all), query_chunk):
        q = q_all[i : i + query_chunk]
        q_norm = q.square().sum(1, keepdim=True)
        best = torch.full((len(q),), float("inf"), device=q.device)
        for j in range(0, len(r_all), reference_chunk):
            r = r_all[j : j + reference_chunk]
            # ‖q − r‖² = ‖q‖² + ‖r‖² − 2 q·r: one matrix product per block; rounding can dip below 0
            squared = torch.addmm(r_norms[j : j + reference_chunk], q, r.T, alpha=-2).add_(q_norm)
            best = torch.minimum(best, squared.min(1).values)
        out[i : i + len(q)] = best.clamp_(min=0).sqrt_()
    return out


def median_nearest_distance(
    queries: torch.Tensor,
    references: torch.Tensor,
    *,
    query_chunk: int = QUERY_CHUNK,
    reference_chunk: int = REFERENCE_CHUNK,
) -> float:
    """The median over `queries` of their distance to the nearest of `references`."""
    distances = nearest_distances(queries, references, query_chunk=query_chunk, reference_chunk=reference_chunk)
    return float(torch.quantile(distances.double(), 0.5))


@dataclass(frozen=True)
class Memorization:
    generated: float  # median distance of a generated sample to its nearest training image
    held_out: float  # median distance of a held-out image to its nearest training image
    samples: int
    held_out_images: int
    training_images: int

    @property
    def ratio(self) -> float:
        return self.generated / self.held_out if self.held_out > 0 else float("inf")

    @property
    def memorizing(self) -> bool:
        return self.ratio < MEMORIZING_BELOW

    def as_dict(self) -> dict[str, float | int | bool]:
        return {
            "value": self.ratio,
            "memorizing": self.memorizing,
            "generated": self.generated,
            "held_out": self.held_out,
            "samples": self.samples,
            "held_out_images": self.held_out_images,
            "training_images": self.training_images,
        }


@dataclass(frozen=True)
class MemorizationScale:
    """The training images and the held-out images' median distance to them, measured once, for
    every set of samples scored against them (the referee's methods, a run's mixtures)."""

    train: torch.Tensor
    held_out: float
    held_out_images: int
    query_chunk: int = QUERY_CHUNK
    reference_chunk: int = REFERENCE_CHUNK

    @classmethod
    def calibrate(
        cls,
        train: torch.Tensor,
        held_out: torch.Tensor,
        *,
        query_chunk: int = QUERY_CHUNK,
        reference_chunk: int = REFERENCE_CHUNK,
    ) -> MemorizationScale:
        """`held_out`: real images none of which is in `train`, in the same pixel space."""
        median = median_nearest_distance(held_out, train, query_chunk=query_chunk, reference_chunk=reference_chunk)
        return cls(train, median, len(held_out), query_chunk, reference_chunk)

    def of(self, generated: torch.Tensor) -> Memorization:
        return Memorization(
            generated=median_nearest_distance(
                generated, self.train, query_chunk=self.query_chunk, reference_chunk=self.reference_chunk
            ),
            held_out=self.held_out,
            samples=len(generated),
            held_out_images=self.held_out_images,
            training_images=len(self.train),
        )


def memorization_ratio(
    generated: torch.Tensor,
    train: torch.Tensor,
    held_out: torch.Tensor,
    *,
    query_chunk: int = QUERY_CHUNK,
    reference_chunk: int = REFERENCE_CHUNK,
) -> Memorization:
    """The ratio of `generated` samples against the `train` images, calibrated by `held_out` real images
    (none of them in `train`); all in the same pixel space, generator space [−1, 1] by convention."""
    chunks = {"query_chunk": query_chunk, "reference_chunk": reference_chunk}
    return MemorizationScale.calibrate(train, held_out, **chunks).of(generated)
