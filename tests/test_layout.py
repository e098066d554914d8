"""The project's layout: the library in palomino/, each service in services/<name>/ with its own
Dockerfile and README, no service importing another, and the torch-free images' services
starting with torch made unimportable."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import secrets
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, cli_env

from palomino.services.local import free_port, stop_processes

SERVICES = ("orchestrator", "cell", "scorer", "dashboard")
TORCH_FREE = ("orchestrator", "dashboard")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def module_of(folder: Path) -> str:
    """palomino/x/y → palomino.x.y; services/x → palomino.services.x (the package-dir mapping)."""
    parts = folder.relative_to(REPO).parts
    return ".".join(("palomino", *parts) if parts[0] == "services" else parts)


def test_every_package_folder_is_installed() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"palomino.services": "services"}
    found = {module_of(init.parent) for root in ("palomino", "services") for init in (REPO / root).rglob("__init__.py")}
    assert found == listed, (
        f"pyproject's [tool.setuptools] packages: add {sorted(found - listed)}, drop {sorted(listed - found)}"
    )


# Package markers and entry points are meant to repeat; every other module's name says what it holds,
# once (wire/control_messages.py vs transport/control_channel.py, not two control.py).
REPEATABLE = {"__init__.py", "__main__.py", "conftest.py"}


def test_no_two_modules_share_a_name() -> None:
    found: dict[str, list[str]] = {}
    for root in ("palomino", "services", "benchmarks", "scripts"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path.name not in REPEATABLE:
                found.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in sorted(found.items()) if len(paths) > 1}
    assert not shared, "modules sharing a name (rename one to say what it holds): " + "; ".join(
        " & ".join(paths) for paths in shared.values()
    )


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_has_its_code_readme_and_image(name: str) -> None:
    """Its image comes from one of two Dockerfiles (with torch or without), which its README names."""
    folder = REPO / "services" / name
    assert (folder / "__init__.py").is_file() and (folder / "README.md").is_file()
    readme = (folder / "README.md").read_text()
    dockerfile = "services/plain.Dockerfile" if name in TORCH_FREE else "services/torch.Dockerfile"
    assert f"palomino {name}" in readme and "docker build" in readme and dockerfile in readme
    assert f"SERVICE={name}" in readme


def test_no_service_imports_another() -> None:
    for name in SERVICES:
        others = {f"palomino.services.{other}" for other in SERVICES if other != name}
        for path in (REPO / "services" / name).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                modules += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                for module in modules:
                    assert not any(module == o or module.startswith(o + ".") for o in others), (
                        f"{path}: imports {module}"
                    )


@pytest.mark.parametrize("name", TORCH_FREE)
def test_a_torch_free_image_installs_only_pyprojects_dependencies_without_torch(name: str) -> None:
    dependencies = set(PYPROJECT["project"]["dependencies"])
    lines = [
        line
        for line in (REPO / "services" / name / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert set(lines) <= dependencies, f"not as pyproject.toml says: {sorted(set(lines) - dependencies)}"
    assert not [line for line in lines if line.startswith(("torch", "torchmetrics"))]
    dockerfile = (REPO / "services" / "plain.Dockerfile").read_text()
    assert "COPY services/${SERVICE}/requirements.txt" in dockerfile and 'pip install "$@" --no-deps .' in dockerfile
    assert "TORCH_VARIANT" not in dockerfile


# The orchestrator connects to RabbitMQ and Redis before it answers; the dashboard here reads only files.
@pytest.mark.parametrize("name", [pytest.param("orchestrator", marks=pytest.mark.integration), "dashboard"])
def test_the_torch_free_services_start_and_answer_with_only_their_requirements(name: str, tmp_path: Path) -> None:
    """As in their image: every dependency of pyproject.toml that the service's requirements.txt
    leaves out (torch, and e.g. the dashboard's sse-starlette for the orchestrator) is unimportable."""
    port = free_port()
    kept = {
        re.split(r"[<>=\[ ]", line)[0].lower()
        for line in (REPO / "services" / name / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    left_out = {re.split(r"[<>=\[ ]", d)[0].lower() for d in PYPROJECT["project"]["dependencies"]} - kept
    modules = sorted(
        module
        for module, distributions in importlib.metadata.packages_distributions().items()
        if {d.lower().replace("_", "-") for d in distributions} & left_out
    )
    assert "torch" in modules
    blocked = f"import sys; sys.modules.update(dict.fromkeys({modules!r})); from palomino.cli import run; run()"
    args = {"orchestrator": ["--runs", str(tmp_path)], "dashboard": ["--runs", str(tmp_path)]}[name]
    log = (tmp_path / "log.txt").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-c", blocked, name, *args, "--port", str(port)],
        cwd=tmp_path,
        env=cli_env() | {"PALOMINO_NAMESPACE": f"layout-{secrets.token_hex(4)}"},  # its own queues
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline, status = time.monotonic() + 60, None
        while status != 200:
            assert process.poll() is None, (tmp_path / "log.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "log.txt").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                    status = response.status
            except OSError:
                time.sleep(0.2)
    finally:
        stop_processes([process])
        log.close()
    assert "No module named 'torch'" not in (tmp_path / "log.txt").read_text()


def test_a_partitioned_result_is_written_without_torch(tmp_path: Path) -> None:
    """The orchestrator writes a partitioned run's result/ itself, tiling the classes' pictures:
    with torch unimportable (its image has none), as in test_the_torch_free_services_start…"""
    script = """
import io, sys
sys.modules['torch'] = sys.modules['torchmetrics'] = None
from pathlib import Path
from PIL import Image
from palomino.runs.directory import RunDirectory
from palomino.runs.result import CellResult, write_class_result

def png(colour, size):
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()

run = RunDirectory(Path(sys.argv[1]))
results = [
    CellResult(f"{label}-0", 0.1, [f"{label}-0"], [1.0], b"", {"class": label, "class_count": 5}, png(colour, size))
    for label, colour, size in ((0, "red", (30, 20)), (1, "blue", (20, 30)))
]
write_class_result(run, results, [0, 1])
print(Image.open(Path(sys.argv[1]) / "result" / "samples.png").size)
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "(68, 30)"  # two 30×30 tiles, 8 px apart, on white
    # …and its image installs Pillow for it.
    assert "pillow>=10" in (REPO / "services" / "orchestrator" / "requirements.txt").read_text().splitlines()


def import_graph() -> dict[str, set[str]]:
    """palomino's modules (services/ as palomino.services) → the palomino modules each imports.

    Every import counts: at the top, inside a function (deferred) and under `if TYPE_CHECKING:`
    (annotations only). Those keep the interpreter from tripping over a circle, not the modules
    from depending on each other, and a circle hidden that way is still one to untie. Importing
    a.b.c runs a/ and a/b/'s __init__ too: an edge to each, except to the importer's own packages
    (already being imported: a package importing its submodules is no circle)."""
    files = {}
    for root in ("palomino", "services"):
        for path in (REPO / root).rglob("*.py"):
            parts = module_of(path.with_suffix("")).split(".")
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from .x / from ..x: relative to the importer's package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                named.update(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names
                )
        edges = set()
        for name in named:
            parts = name.split(".")
            for k in range(1, len(parts) + 1):
                prefix = ".".join(parts[:k])
                if k == len(parts) or not (module == prefix or module.startswith(prefix + ".")):
                    edges.add(prefix)
        graph[module] = {e for e in edges if e in files and e != module}
    return graph


def test_palominos_modules_import_each_other_in_no_circle() -> None:
    graph = import_graph()
    assert {"palomino.runs.result", "palomino.services.scorer.scorer"} <= set(graph)  # what it walks
    assert "palomino.runs.mixture" in graph["palomino.runs.finish"]
    state: dict[str, str] = {}  # module → "open" (on the path walked now) or "done"

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            assert state.get(target) != "open", "import circle: " + " → ".join([*path[path.index(target) :], target])
            if target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


# The library's packages from the bottom up: each may import only those below it (docs/development.md's layout).
# An import running up a layer (runs → scoring once did) fails here with the pair named.
LAYERS = [
    ("palomino.errors", "palomino.cache", "palomino.io", "palomino.endpoints", "palomino.heap"),
    ("palomino.grid",),
    ("palomino.config",),
    ("palomino.wire", "palomino.data", "palomino.nn"),
    ("palomino.transport", "palomino.coevolution", "palomino.baselines"),
    ("palomino.runs",),
    ("palomino.engine",),
    ("palomino.scoring",),
    ("palomino.services",),
    ("palomino.cli", "palomino.__main__"),
]


def layer_of(module: str) -> int:
    for depth, names in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in names):
            return depth
    return -1 if module == "palomino" else len(LAYERS)


def test_no_import_runs_up_a_layer() -> None:
    graph = import_graph()
    unplaced = sorted(m for m in graph if layer_of(m) == len(LAYERS))
    assert not unplaced, f"place these in LAYERS: {unplaced}"
    upward = [
        f"{module} → {target}"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "imports running up a layer: " + "; ".join(sorted(upward))
