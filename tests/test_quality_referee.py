"""benchmarks/quality.py, the referee: every image case's scores carry the memorization ratio beside
FID (real MNIST digits: copies of the training digits flagged, held-out digits not), and the table
and its JSON rows show it, a row below 0.9 marked as memorizing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quality() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quality_benchmark", REPO / "benchmarks" / "quality.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_referee_scores_images_with_the_memorization_ratio_beside_fid(
    quality: ModuleType, mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from palomino.config.loading import load_config
    from palomino.scoring.classifier import save_classifier, train_classifier

    monkeypatch.setattr(quality, "MNIST_DIR", mnist_dir)
    case = quality.CASES["mnist-1x1"]
    overrides = [*case.overrides, f"data.dir={mnist_dir}", "seed=0"]
    config = load_config(REPO / "examples" / f"{case.example}.yaml", overrides)
    train, held_out = quality.split_data(config, 0)
    assert (len(train), len(held_out)) == (8000, 2000)
    # The referee trains its classifier once per output folder; a small one here, where it looks.
    small = train_classifier(config.data, holdout=quality.IMAGE_SAMPLES, train_size=1000, test_size=200, epochs=1)
    save_classifier(small, tmp_path / f"classifier-{config.data.name}.safetensors")
    referee = quality.Referee(config, train, held_out, tmp_path)

    copies = train.samples[:2000] + 0.01 * torch.randn(2000, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    copied = referee.score(copies.clamp(-1, 1))
    assert set(copied) == {"fid", "tvd", "memorization"} and copied["memorization"] < 0.1
    fresh = referee.score(held_out.samples[:1000])  # real digits the GANs never saw
    assert fresh["memorization"] == pytest.approx(1.0, abs=0.1)


def test_the_table_and_its_rows_flag_a_memorizing_method(quality: ModuleType) -> None:
    Result = quality.Result
    results = [
        Result("mnist-3x3", seed, method, 1000, 10.0, {"fid": fid, "tvd": 0.1, "memorization": ratio})
        for seed in (0, 1)
        for method, fid, ratio in (("grid", 30.0 + seed, 1.02), ("indep-regions", 8.0 + seed, 0.5 + 0.1 * seed))
    ]
    rows = quality.summarise(results)
    grid, regions = rows
    assert grid["memorizing"] is False and regions["memorizing"] is True
    assert regions["memorization"]["values"] == [0.5, 0.6] and regions["memorization"]["mean"] == pytest.approx(0.55)
    table = quality.format_table(rows).splitlines()
    assert "memorization" in table[0] and "fid" in table[0]
    assert "1.020 ±0.000" in table[1] and "!" not in table[1]
    assert "0.550!±0.050" in table[2]
    assert table[-1].startswith("memorization: median distance") and "! = below 0.9: memorizing" in table[-1]
    # The toys' table is as it was: no memorization column, no legend.
    toy = quality.format_table(quality.summarise([Result("ring-3x3", 0, "grid", 10, 1.0, {"modes": 8, "hq": 1.0})]))
    assert "memorization" not in toy and "!" not in toy
