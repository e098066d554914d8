"""Every example's three-iteration run hashes as recorded in tests/fixtures/example_runs.json
(tests/example_runs.py says how the file is rewritten on purpose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from example_runs import EXAMPLES, FIXTURE, PINNED_KERNELS, hashes, same_run

from palomino.config import load_config

TRAINED = sorted(set(same_run().values()))  # one example of those that are one run once shortened


@pytest.fixture(scope="module")
def trained() -> dict[str, str]:
    """Every trained example's hash, from two child processes with pinned numerics (example_runs.py)."""
    return hashes(TRAINED)


@pytest.mark.slow
@pytest.mark.parametrize("example", TRAINED, ids=[e.stem for e in TRAINED])
def test_every_example_trains_the_numbers_recorded(
    example: Path, request: pytest.FixtureRequest, trained: dict[str, str]
) -> None:
    data = load_config(example).data.name
    if data in ("mnist", "fashion_mnist"):
        request.getfixturevalue(f"{data}_dir")  # skipped without the data (failed under CI)
    if trained["kernels"] != PINNED_KERNELS:
        pytest.skip(f"the hashes are of {PINNED_KERNELS} kernels, which this processor lacks ({trained['kernels']})")
    assert trained[example.stem] == json.loads(FIXTURE.read_text())[example.stem], (
        f"{example.stem} trains other numbers than recorded; a change that means to rewrites "
        "tests/fixtures/example_runs.json (python tests/example_runs.py --write)"
    )


def test_every_example_has_a_recorded_hash() -> None:
    assert set(json.loads(FIXTURE.read_text())) == {e.stem for e in EXAMPLES}


def test_examples_that_are_one_run_once_shortened_are_recorded_alike() -> None:
    """ring-3x3 is quickstart with more iterations: once shortened the same run, trained once above."""
    recorded = json.loads(FIXTURE.read_text())
    pairs = {e.stem: first.stem for e, first in same_run().items() if e != first}
    assert pairs == {"ring-3x3": "quickstart"}  # a new pair is fine; an example that stops being one is checked here
    assert all(recorded[e] == recorded[first] for e, first in pairs.items())
