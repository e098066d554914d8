"""ruff (pinned in the dev extra, rules in pyproject.toml) keeps the tree's lint and format clean."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: `pip install -e '.[dev]'` (the test command installs the dev extra)")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )


def test_ruff_check_is_clean() -> None:
    done = ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert done.returncode == 0, (
        f"`ruff check .` found problems (`ruff check --fix .` mends many):\n{done.stdout}{done.stderr}"
    )


def test_ruff_format_is_clean() -> None:
    done = ruff("format", "--no-cache", "--check", ".")
    assert done.returncode == 0, f"`ruff format .` would change these files:\n{done.stdout}{done.stderr}"


def test_no_test_module_imports_another() -> None:
    """Helpers several test modules share live in tests/conftest.py or tests/helpers.py: a test module
    imported by another drags its fixtures and module state along and couples the two."""
    import re

    tests = REPO / "tests"
    names = {path.stem for path in tests.glob("test_*.py")}
    pattern = re.compile(r"^\s*(?:from\s+(\w+)\s+import|import\s+(\w+))", re.MULTILINE)
    found = {
        path.name: hits
        for path in sorted(tests.glob("*.py"))
        if (hits := sorted({a or b for a, b in pattern.findall(path.read_text())} & names))
    }
    assert found == {}, f"test modules importing test modules: {found}"


# A path of one machine (a home folder, a workspace) or a folder beside the checkout; the Makefile and
# .ci/run may point PALOMINO_DATA_DIR at such a copy, and the images' own user has /home/palomino.
MACHINE_PATH = re.compile(r"\.\./shared|/work/|/root/|/Users/|/home/(?!palomino\b)[\w.-]+")
MAY_NAME_ONE = {"Makefile", ".ci/run", "tests/test_lint.py"}  # this file: for the pattern above


def test_no_tracked_file_names_a_path_of_one_machine() -> None:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no list of tracked files")
    found = []
    for name in listed.stdout.splitlines():
        path = REPO / name
        if name in MAY_NAME_ONE or not path.is_file():
            continue
        text = path.read_bytes()
        if b"\0" in text[:4096]:
            continue  # binary
        for number, line in enumerate(text.decode(errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "paths of one machine (use palomino.data.data_dir / $PALOMINO_DATA_DIR):\n" + "\n".join(found)
