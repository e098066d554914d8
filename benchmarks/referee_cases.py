"""The referee's cases (benchmarks/quality.py): which example each runs, at what budget, on which
data, and the shape of one method's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from palomino.data import data_dir

ROOT = Path(__file__).resolve().parent.parent
MNIST_DIR = data_dir("mnist")  # $PALOMINO_DATA_DIR/mnist, else the user cache's
BASELINES = ("plain", "indep", "regions")  # --baselines: the rows beside the grid's
THREADS = 2  # torch threads of the grid's runs (the 2-core reference machine's cores)
VALIDATION = 1000  # images set aside from the training split when --rates sweeps learning rates


@dataclass(frozen=True)
class Case:
    example: str  # examples/<example>.yaml
    overrides: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()  # extra overrides under --quick


# Images: examples/mnist-regions-3x3.yaml at its own per-cell budget for every grid size (100
# iterations × 50 batches of 100), so a bigger grid spends more in all and its baselines get as
# much. At 30 × 50 every cell's generator was still drawing blurred strokes and the grid lost to
# one plain GAN on MNIST (docs/quality.md). --quick cuts it to 4 × 20.
IMAGE_BUDGET = (
    "training.iterations=100",
    "training.batches_per_iteration=50",
    "training.sample_every=0",
    "training.checkpoint_every=0",
)
IMAGE_QUICK = ("training.iterations=4", "training.batches_per_iteration=20")
MNIST = (f"data.dir={MNIST_DIR}", "data.split=test")  # the offline copy: 8,000 images to train on, 2,000 held out
FASHION = ("data.name=fashion_mnist", "data.split=train")  # scored against its test split
CASES: dict[str, Case] = {
    "ring-3x3": Case("ring-3x3", quick=("training.iterations=30",)),
    "grid-4x4": Case("grid-4x4", quick=("training.iterations=30",)),
    **{
        f"mnist-{n}x{n}": Case(
            "mnist-regions-3x3", (*IMAGE_BUDGET, f"grid.rows={n}", f"grid.cols={n}", *MNIST), IMAGE_QUICK
        )
        for n in (1, 2, 3, 4, 5, 8, 12)
    },
    "fashion-3x3": Case(
        "mnist-regions-3x3",
        (*IMAGE_BUDGET, *FASHION, "data.size=10000"),
        IMAGE_QUICK,
    ),
    # The main case for the larger grids: all 60,000 training images (a 5×5 cell's region
    # ~2,400 of them, against MNIST's 320), scored against the 10,000 of the test split.
    **{
        f"fashion-full-{n}x{n}": Case(
            "mnist-regions-3x3",
            (*IMAGE_BUDGET, *FASHION, f"grid.rows={n}", f"grid.cols={n}"),
            IMAGE_QUICK,
        )
        for n in (1, 3, 5, 8, 12)
    },
}


@dataclass
class Result:
    case: str
    seed: int
    method: str
    steps: int
    seconds: float
    scores: dict[str, float] = field(default_factory=dict)
    rate: float | None = None  # training.learning_rate of the run (set when sweeping --rates)
    validation: dict[str, float] = field(default_factory=dict)  # the same scores on the validation split
