"""Every example's three-iteration run hashes as recorded in tests/fixtures/example_runs.json
(tests/example_runs.py says how the file is rewritten on purpose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from example_runs import EXAMPLES, FIXTURE, run_hash

from palomino.config import load_config


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_every_example_trains_the_numbers_recorded(
    example: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    data = load_config(example).data.name
    if data in ("mnist", "fashion_mnist"):
        request.getfixturevalue(f"{data}_dir")  # skipped without the data (failed under CI)
    assert run_hash(example, tmp_path) == json.loads(FIXTURE.read_text())[example.stem], (
        f"{example.stem} trains other numbers than recorded; a change that means to rewrites "
        "tests/fixtures/example_runs.json (python tests/example_runs.py --write)"
    )


def test_every_example_has_a_recorded_hash() -> None:
    assert set(json.loads(FIXTURE.read_text())) == {e.stem for e in EXAMPLES}
