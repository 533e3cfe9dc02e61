"""Which way the package's imports flow (docs/architecture.md): no module imports one that
imports it back, however indirectly, counting imports under ``TYPE_CHECKING`` and inside
functions; the core imports no tool, no Ray and no bench; the bench's reports import no Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ray_triton_shm"
#: The modules of the package root that are no part of the core: the public facade, and the
#: tools (the command line, the doctor, the regions report).
NOT_CORE = {"ray_triton_shm", "ray_triton_shm.__main__"} | {
    f"ray_triton_shm.{name}" for name in ("_cli", "_doctor", "_doctor_report", "_region_status")
}
#: What the core never imports: Ray, the Ray layer, the bench, the embedded server, the tools.
OUTSIDE_CORE = ("ray", "ray_triton_shm.ray", "ray_triton_shm._bench", "ray_triton_shm.local")
#: The bench's results and their renderings: a report is drawn without Ray.
REPORTS = ("_results", "_summary", "_format", "_config", "_load", "report")
REPORTS += tuple(f"report.{m}" for m in ("_text", "_console", "_json", "_html", "_figures"))


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()
#: Each module's syntax tree, parsed once at collection. (Parsed later, after other tests ran
#: in the same process, CPython 3.11.7's ``ast.parse`` once raised "SystemError: AST
#: constructor recursion depth mismatch", a bug of its own.)
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def _imports(name: str) -> set[str]:
    """Every module ``name`` imports, wherever the import is: the package's own modules, and
    other packages by their top-level name."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name if alias.name in MODULES else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            submodules = {f"{module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(module if module in MODULES else module.split(".")[0])
    found.discard(name)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _closure(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for imported in GRAPH.get(todo.pop(), ()):
            if imported not in seen:
                seen.add(imported)
                todo.append(imported)
    return seen


def test_no_module_imports_one_that_imports_it_back() -> None:
    circles = sorted(
        (name, imported)
        for name in MODULES
        for imported in GRAPH[name]
        if imported in MODULES and name in _closure(imported)
    )
    assert circles == []


def test_the_core_imports_no_tool_no_ray_no_bench_and_no_embedded_server() -> None:
    core = [
        name
        for name in MODULES
        # ray_triton_shm.<module>, not a subpackage
        if name.count(".") == 1 and name not in NOT_CORE and MODULES[name].name != "__init__.py"
    ]
    assert "ray_triton_shm._client" in core and len(core) > 20
    wrong = {
        name: sorted(
            m
            for m in _closure(name)
            if m in NOT_CORE or any(m == o or m.startswith(f"{o}.") for o in OUTSIDE_CORE)
        )
        for name in core
    }
    assert {name: imported for name, imported in wrong.items() if imported} == {}


def test_the_bench_reports_are_drawn_without_ray() -> None:
    """Nor with any path: a run's results are read and drawn anywhere."""
    every_report = {m for m in MODULES if m.startswith("ray_triton_shm._bench.report")}
    assert every_report <= {f"ray_triton_shm._bench.{report}" for report in REPORTS}
    for report in REPORTS:
        name = f"ray_triton_shm._bench.{report}"
        assert name in MODULES, name  # a name moved away would pass every check below
        imported = _closure(name)
        assert "ray" not in imported, name
        assert not {
            m
            for m in imported
            if m.startswith(("ray_triton_shm.ray", "ray_triton_shm._bench.paths"))
        }, name


def test_the_bench_reports_load_no_client() -> None:
    """Imported, the reports load neither Ray nor tritonclient (a results module's types may
    name the workload, whose dtypes are tritonclient's, for the type checker only)."""
    names = [f"ray_triton_shm._bench.{report}" for report in REPORTS]
    code = (
        f"import importlib, sys\nfor name in {names!r}: importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'tritonclient', 'grpc'}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"


def test_the_checks_see_a_circle_and_a_forbidden_import() -> None:
    """The graph is read right: a known import is in it (else every check above passes on
    an empty graph)."""
    assert "ray_triton_shm._drive" in GRAPH["ray_triton_shm._client"]
    assert "ray" in GRAPH["ray_triton_shm.ray._actor"]
    assert "ray_triton_shm._client" in _closure("ray_triton_shm.ray._handle")


#: The core's modules the Ray layer may use, through the internal APIs named for it (a module
#: added here is a decision: say which API of it the Ray layer needs).
RAY_USES = {
    f"ray_triton_shm.{name}"
    for name in (
        # the client, its pools (registry_of, attach_region, share_slots), its calls
        # (infer_with, lease_with), one reading of a pool (PoolSnapshot)
        "_client",
        "_registry",  # the type of those pools, for the binding that attaches them
        "_snapshot",
        "_engine",  # ModelPool, SuspectedChange
        "_moves",  # the one rule of where a call goes on (follow_model)
        "_options",  # RequestOptions, checked once where a handle makes them
        # the vocabulary: errors, specs, inputs, keys, sizes, where slots live, defaults
        "_exceptions",
        "_specs",
        "_inputs",
        "_lease",
        "_keys",
        "_sizing",
        "_memory",
        "_cuda",
        "_defaults",
        "_header",  # the histograms' buckets and the growth limits, for the metrics
        "_pool",  # PoolStats, of a handle's pool in its process
        "_route",  # how a model reaches Triton: transport values, Transport, their errors
        "_shm",  # /dev/shm: its room, the regions on the node and their owners
        "_scaling",  # the /dev/shm budget
        "_reclaim",  # what dead owners left
        "_doctor",  # the doctor's node checks, run on every node
    )
}


def test_the_ray_layer_uses_only_the_core_modules_named_for_it() -> None:
    used = {
        m
        for name in MODULES
        if name.startswith("ray_triton_shm.ray")
        for m in GRAPH[name]
        if m.startswith("ray_triton_shm.") and not m.startswith("ray_triton_shm.ray")
    }
    assert used - RAY_USES == set()
    assert RAY_USES - used == set()  # the list is not stale


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ("ray", "_bench", "local") else "core"


def test_no_module_reaches_a_private_name_of_another_layer() -> None:
    """``from ray_triton_shm.local._server import _proc_stats`` is a private of another layer;
    ``from .. import _cuda`` (a module) is not."""
    reached = []
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(TREES[name]):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if not module.startswith("ray_triton_shm") or _layer(module) == _layer(name):
                continue
            reached += [
                f"{name}: {module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and f"{module}.{alias.name}" not in MODULES
            ]
    assert reached == []


def test_no_file_of_the_package_is_over_750_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in MODULES.values()
        if (lines := len(path.read_text().splitlines())) > 750
    }
    assert long == {}
