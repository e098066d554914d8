"""Samples/s of FID scoring (feature extraction + torchmetrics' update) for each feature extractor.

For every extractor that is available here (the classifier always; Inception-v3 only with its weights:
--inception-weights / PALOMINO_INCEPTION_WEIGHTS or torchvision's hub cache, never downloaded) and every
device (CPU; CUDA when present), it times, on real MNIST digits:

- forward: the extractor alone on each batch (the baseline, measured in the same run);
- fid: `FrechetInceptionDistance.update(batch, real=False)` with the extractor as its `feature` module;

and prints samples/s, fid/forward (torchmetrics' overhead) and each extractor's fid rate against the
classifier's on the same device.

    python benchmarks/scoring.py --classifier /tmp/classifiers/mnist.safetensors
    python benchmarks/scoring.py --samples 500 --threads 2            # no classifier: trains a quick one first
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from palomino.config import DataConfig
from palomino.data import data_dir, load_dataset
from palomino.errors import PalominoError
from palomino.scoring.classifier import save_classifier, train_classifier
from palomino.scoring.extractors import FeatureExtractor, build_extractor
from palomino.scoring.metrics import SharedPass, fid_metric
from palomino.scoring.real_statistics import RealStatistics


def timed(work, repeats: int) -> float:
    """Median seconds of `repeats` runs of `work()` after one warm-up run."""
    work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(
    extractor: FeatureExtractor, images: torch.Tensor, device: str, batch: int, repeats: int
) -> dict[str, float]:
    extractor.to(device)
    batches = [b.to(device) for b in images.split(batch)]
    with torch.no_grad():
        real_features = torch.cat([extractor.extract(b)[0].cpu() for b in batches[:2]])
    real = RealStatistics(
        real_features,
        torch.full((len(extractor.classes),), 1 / len(extractor.classes), dtype=torch.float64),
        "labels",
        "bench",
    )

    def forward() -> None:
        for b in batches:
            extractor.extract(b)
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def fid() -> None:
        metric = fid_metric(SharedPass(extractor).view("features"), real).to(device)
        for b in batches:
            metric.update(b, real=False)
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    n = len(images)
    return {"forward": n / timed(forward, repeats), "fid": n / timed(fid, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--classifier", type=Path, help="a file of `palomino classifier train` (default: train a quick one)"
    )
    parser.add_argument("--inception-weights", type=Path, help="torch-fidelity's Inception-v3 weights")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=data_dir("mnist"),
        help="MNIST, either split (default: $PALOMINO_DATA_DIR/mnist)",
    )
    parser.add_argument("--samples", type=int, default=2000, help="images scored per timing")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    split = "test" if not (args.data_dir / "train-images-idx3-ubyte.gz").exists() else "train"
    dataset = load_dataset(DataConfig(name="mnist", dir=args.data_dir, split=split, download=False), 0)
    images = dataset.to_data_space(dataset.samples[: args.samples])

    with tempfile.TemporaryDirectory() as folder:
        classifier = args.classifier
        if classifier is None:
            print("no --classifier: training a quick one (2,000 images, 2 epochs; its speed is what counts here)")
            trained = train_classifier(
                DataConfig(name="mnist", dir=args.data_dir), train_size=2000, test_size=500, epochs=2
            )
            classifier = save_classifier(trained, Path(folder) / "quick.safetensors")
        extractors: dict[str, FeatureExtractor] = {"classifier": build_extractor("classifier", classifier=classifier)}
        try:
            extractors["inception"] = build_extractor("inception", inception_weights=args.inception_weights)
        except PalominoError as error:
            print(f"inception: not measured here — {error}")

        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        print(
            f"\n{len(images):,} MNIST images (1×28×28) in batches of {args.batch_size}, {args.threads} CPU thread(s), "
            f"median of {args.repeats}; torch {torch.__version__}"
        )
        print(
            f"{'extractor':<12}{'device':<8}{'forward/s':>12}{'fid/s':>12}{'fid/forward':>13}{'fid vs classifier':>19}"
        )
        for device in devices:
            rates = {
                name: measure(extractor, images, device, args.batch_size, args.repeats)
                for name, extractor in extractors.items()
            }
            for name, rate in rates.items():
                ratio = rate["fid"] / rates["classifier"]["fid"]
                print(
                    f"{name:<12}{device:<8}{rate['forward']:>12,.0f}{rate['fid']:>12,.0f}{rate['fid'] / rate['forward']:>13.2f}{ratio:>18.4f}×"
                )


if __name__ == "__main__":
    main()
