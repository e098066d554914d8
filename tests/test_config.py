"""palomino.config and the CLI boundary: every key the docs promise, overrides, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import palomino, tiny, write_yaml

from palomino.config import ExperimentConfig, apply_overrides, dump_config, load_config, parse_config
from palomino.errors import ConfigError


def lookup(config: ExperimentConfig, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


# (dotted key, --set text, expected value): each value differs from the default.
REQUIRED_KEYS = [
    ("grid.rows", "4", 4),
    ("grid.cols", "5", 5),
    ("grid.neighbourhood", "moore", "moore"),
    ("grid.neighbourhood", "von_neumann", "von_neumann"),
    ("training.iterations", "7", 7),
    ("training.batch_size", "17", 17),
    ("training.batches_per_iteration", "3", 3),
    ("training.population_size", "4", 4),
    ("training.tournament_size", "3", 3),
    ("training.learning_rate", "0.003", 0.003),
    ("training.losses", "[minimax]", ["minimax"]),
    ("training.losses", "[mse]", ["mse"]),
    ("training.losses", "[nonsaturating]", ["nonsaturating"]),
    ("training.losses", "[wgan_gp]", ["wgan_gp"]),
    ("training.losses", "[minimax,mse]", ["minimax", "mse"]),
    ("training.losses", "[minimax, mse, nonsaturating, wgan_gp]", ["minimax", "mse", "nonsaturating", "wgan_gp"]),
    ("training.fitness.sample_size", "33", 33),
    ("training.fitness.mode", "average", "average"),
    ("training.fitness.mode", "best", "best"),
    ("training.fitness.mode", "worst", "worst"),
    ("training.mixture.sigma", "0.2", 0.2),
    ("training.checkpoint_every", "4", 4),
    ("training.synchronous", "true", True),
    ("seed", "42", 42),
    ("data.name", "gaussian_grid", "gaussian_grid"),
    ("data.name", "mnist", "mnist"),
    ("data.dir", "/tmp/some/where", Path("/tmp/some/where")),
    ("network.name", "dcgan", "dcgan"),
]


@pytest.mark.parametrize(("key", "text", "expected"), REQUIRED_KEYS)
def test_required_key_exists_and_is_settable(key: str, text: str, expected: Any) -> None:
    config = parse_config(apply_overrides({}, [f"{key}={text}"]))
    assert lookup(config, key) == expected


@pytest.mark.parametrize(("key", "text", "expected"), REQUIRED_KEYS)
def test_required_key_from_yaml(tmp_path: Path, key: str, text: str, expected: Any) -> None:
    import yaml

    raw: dict[str, Any] = {}
    node = raw
    *sections, last = key.split(".")
    for section in sections:
        node = node.setdefault(section, {})
    node[last] = yaml.safe_load(text)
    config = load_config(write_yaml(tmp_path / "c.yaml", raw))
    assert lookup(config, key) == expected


def test_defaults() -> None:
    config = parse_config({})
    assert (config.grid.rows, config.grid.cols, config.grid.neighbourhood) == (3, 3, "von_neumann")
    assert config.training.losses == ["nonsaturating"]
    assert config.training.tournament_size == 2 and config.training.population_size == 1
    assert config.training.fitness.mode == "average"
    assert config.training.synchronous is False
    assert config.data.dir is None
    assert config.cells == 9


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "c.yaml", tiny())
    config = load_config(
        path,
        [
            "training.iterations=11",
            "training.losses=[minimax,mse]",
            "grid.neighbourhood=moore",
            "training.mixture.sigma=0.5",
        ],
    )
    assert config.training.iterations == 11
    assert config.training.losses == ["minimax", "mse"]
    assert config.grid.neighbourhood == "moore"
    assert config.training.mixture.sigma == 0.5
    assert config.training.batch_size == tiny()["training"]["batch_size"]  # untouched keys kept


def test_override_value_may_contain_equals_sign() -> None:
    raw = apply_overrides({}, ["name=a=b"])
    assert raw == {"name": "a=b"}


def test_override_creates_missing_sections() -> None:
    assert apply_overrides({}, ["training.fitness.mode=best"]) == {"training": {"fitness": {"mode": "best"}}}


@pytest.mark.parametrize("item", ["training.iterations", "=3", " =3", "noequals"])
def test_bad_override_syntax(item: str) -> None:
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        apply_overrides({}, [item])


def test_override_into_a_value_is_an_error() -> None:
    with pytest.raises(ConfigError, match="rows is a value, not a section"):
        apply_overrides({"grid": {"rows": 3}}, ["grid.rows.x=1"])


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"training": {"itertions": 3}}, "training.itertions"),
        ({"grid": {"rows": 0}}, "grid.rows"),
        ({"grid": {"cols": -2}}, "grid.cols"),
        ({"grid": {"neighbourhood": "hex"}}, "grid.neighbourhood"),
        ({"training": {"losses": ["minimax", "hinge"]}}, "training.losses.1"),
        ({"training": {"losses": []}}, "training.losses"),
        ({"training": {"fitness": {"mode": "median"}}}, "training.fitness.mode"),
        ({"training": {"mixture": {"sigma": 0}}}, "training.mixture.sigma"),
        ({"training": {"learning_rate": -1}}, "training.learning_rate"),
        ({"training": {"synchronous": "perhaps"}}, "training.synchronous"),
        ({"data": {"name": "imagenet"}}, "data.name"),
        ({"network": {"name": "resnet"}}, "network.name"),
        ({"seed": -1}, "seed"),
        ({"colour": "blue"}, "colour"),
        ({"training": {"population_size": 1, "replacements": 2}}, "training"),
        # Upper bounds (issue 13): each of these was accepted and took the worker down or hung it.
        ({"training": {"iterations": 10**12}}, "training.iterations"),
        ({"training": {"batch_size": 10**7}}, "training.batch_size"),
        ({"training": {"population_size": 10_000}}, "training.population_size"),
        ({"data": {"name": "image_folder", "dir": "x", "image_size": 4096}}, "data.image_size"),
        ({"distributed": {"heartbeat_ttl": 0.001}}, "distributed.heartbeat_ttl"),
        ({"grid": {"rows": 5000}}, "grid.rows"),
        ({"network": {"hidden": 10**6}}, "network.hidden"),
    ],
)
def test_invalid_config_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    message = str(caught.value)
    assert message.startswith(f"config: {field}: "), message
    assert "\n" not in message


def test_unknown_key_message_says_so() -> None:
    with pytest.raises(ConfigError, match=r"training\.itertions: unknown key"):
        parse_config({"training": {"itertions": 3}})


def test_bad_value_message_shows_the_input() -> None:
    with pytest.raises(ConfigError, match=r"grid\.neighbourhood: .*'hex'"):
        parse_config({"grid": {"neighbourhood": "hex"}})


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    config = parse_config(tiny(training={"losses": ["minimax", "wgan_gp"], "synchronous": True}, data={"dir": "/x/y"}))
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config


# --- the real command line ------------------------------------------------------------------

BAD_CONFIGS = [
    # (id, YAML text or None for "no file", extra args, text the one-line message must contain)
    ("unknown-key", "training:\n  itertions: 3\n", [], "training.itertions"),
    ("bad-value", "grid:\n  rows: 0\n", [], "grid.rows"),
    ("bad-enum", "grid:\n  neighbourhood: hex\n", [], "grid.neighbourhood"),
    ("invalid-yaml", "grid: [1,\n  rows: 2\n", [], "not valid YAML"),
    ("not-a-mapping", "- grid\n- training\n", [], "mapping"),
    ("missing-file", None, [], "cannot read"),
    ("bad-set-syntax", "seed: 1\n", ["--set", "training.iterations"], "dotted.key=value"),
    ("bad-set-value", "seed: 1\n", ["--set", "training.losses=[minimax,hinge]"], "training.losses"),
    ("bad-set-key", "seed: 1\n", ["--set", "training.itertions=3"], "training.itertions"),
]


@pytest.mark.parametrize(("text", "extra", "needle"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_cli_rejects_bad_config_with_one_line(tmp_path: Path, text: str | None, extra: list[str], needle: str) -> None:
    config = tmp_path / "experiment.yaml"
    if text is not None:
        config.write_text(text)
    out = tmp_path / "runs"
    result = palomino("train", config, "--out", out, *extra, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout.strip() == ""
    assert not out.exists() or not any(out.iterdir()), "a bad config must not create a run directory"
    assert not (tmp_path / "runs").exists()


def test_cli_resume_of_a_non_run_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = palomino("train", "--resume", tmp_path / "empty", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "not a run directory" in lines[0], result.stderr


# A usage error is told before torch loads (seconds on a small machine): the command line run with
# torch made unimportable must still say what is wrong, exit 2, and show no traceback.
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; from palomino.cli import run; run(sys.argv[1:])"
USAGE_ERRORS = [
    ("train-bad-config", ["train", "{config}"], "grid.rows"),
    ("train-resume-not-a-run", ["train", "--resume", "{empty}"], "not a run directory"),
    ("sample-bad-suffix", ["sample", "{empty}", "--n", "5", "--out", "x.csv"], ".npy or .png"),
    ("sample-not-a-run", ["sample", "{empty}", "--n", "5", "--out", "x.npy"], "not a run directory"),
    ("score-not-a-run", ["score", "{empty}"], "not a run directory"),
    ("classifier-bad-out", ["classifier", "train", "--data", "mnist", "--out", "x.txt"], ".safetensors"),
]


@pytest.mark.parametrize(("args", "needle"), [c[1:] for c in USAGE_ERRORS], ids=[c[0] for c in USAGE_ERRORS])
def test_usage_errors_are_told_before_torch_loads(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.yaml").write_text("grid:\n  rows: 0\n")
    names = {"config": str(tmp_path / "bad.yaml"), "empty": str(tmp_path / "empty")}
    command = [sys.executable, "-c", WITHOUT_TORCH, *(a.format(**names) for a in args)]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and needle in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "torch" not in result.stderr


# ---- the reference in docs/configuration.md -----------------------------------------------------


def test_the_docs_reference_is_the_schemas() -> None:
    """docs/configuration.md's key table is generated from the models: an edit to either shows here."""
    from palomino.config import reference

    text = reference.DOC.read_text()
    assert reference.rewrite(text) == text, "run: python -m palomino.config.reference --write"


def test_the_config_keys_in_architecture_md_exist() -> None:
    """docs/architecture.md names configuration keys in backticks: each dotted one is a key of the
    models, and each bare snake_case name is at least a key's last part (write it dotted)."""
    import re

    from palomino.config import reference

    keys = {e.key for e in reference.entries()}
    sections = {key.split(".")[0] for key in keys if "." in key}
    leaves = {key.rsplit(".", 1)[-1] for key in keys}
    named = re.findall(r"`([^`\n]+)`", (Path(__file__).parents[1] / "docs" / "architecture.md").read_text())
    dotted = [n for n in named if re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", n) and n.split(".")[0] in sections]
    bare = [n for n in named if re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", n)]
    assert len(dotted) > 20, dotted  # the page does name its keys
    assert [n for n in dotted if n not in keys and not any(k.startswith(n + ".") for k in keys)] == []
    assert [n for n in bare if n not in leaves] == []


def test_every_key_is_described_and_every_size_bounded() -> None:
    from palomino.config import reference

    entries = reference.entries()
    assert len(entries) > 60
    assert [e.key for e in entries if not e.description] == []
    numeric = [e for e in entries if e.allowed.startswith(("integer", "number", "[", "list of"))]
    unbounded = [e.key for e in numeric if not {"≤", "<", "entries"} & set(e.allowed.split())]
    assert unbounded == []


def test_the_reference_shows_defaults_choices_and_bounds() -> None:
    from palomino.config import reference

    table = {e.key: e for e in reference.entries()}
    assert table["training.losses"].default == '["nonsaturating"]'  # a default_factory's value
    assert table["training.batch_size"].allowed == "integer ≥ 1, ≤ 65,536"
    assert table["data.image_size"].allowed == "integer ≥ 8, ≤ 1,024 or none"
    assert table["grid.neighbourhood"].allowed == '"von_neumann", "moore", "none"'
    assert table["training.adam_betas"].allowed == "[number ≥ 0, < 1, number ≥ 0, < 1]"
    assert "3.2 GB" in table["training.batch_size"].cost


def test_an_adam_beta_of_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="adam_betas"):
        parse_config({"training": {"adam_betas": [0.5, 1.0]}})


@pytest.mark.parametrize(
    "example", sorted((Path(__file__).parents[1] / "examples").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_example_loads(example: Path) -> None:
    assert load_config(example).name
