"""Which way the package's imports flow, and how its code is cut (docs/architecture.md).

The package is a stack of layers (:data:`LAYERS`), each a folder or a few modules of the
package root: a module imports only from its own layer and the layers below it, counting
imports under ``TYPE_CHECKING`` and inside functions, and no module imports one that imports
it back. The layer picture of docs/architecture.md is drawn from :data:`LAYERS`
(``python tests/unit/test_layering.py`` writes it again), and a test holds the page to it.
No folder holds more than 15 modules, and no function is over 80 lines, docstrings aside."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ray_triton_shm"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: The layers, top first: (name, what it holds, its modules and folders under the package,
#: ``""`` for the package's ``__init__``). A module imports only from its own layer and those
#: below it. The core is the face and what is below it: it imports no tool, Ray or bench.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("api", "the public names, each imported on first use", ("",)),
    ("command", "the ray-triton-shm command line", ("__main__", "_cli")),
    ("bench", "the benchmark: runner, paths, results and reports", ("_bench",)),
    ("ray", "the Ray layer: node actor, ShmModel, ShmPredictor, metrics", ("ray",)),
    ("tools", "the doctor's node checks, the regions' status", ("_tools",)),
    ("local", "the embedded Triton (no Ray)", ("local",)),
    (
        "face",
        "TritonSHMClient, one call, a stream, a lease; the modules' old names",
        ("_client", "_calls", "_streaming", "_lease", "_moved"),
    ),
    ("pools", "a client's pools over time: registry, following, scaling, cleanup", ("_pools",)),
    ("inference", "one request: engine, model pool, inputs, outputs, transport", ("_inference",)),
    ("slots", "where tensors live: shm, header, GPU memory, slot pools, specs", ("_slots",)),
    ("wire", "the way to Triton: gRPC, HTTP, TLS, keys, restarts, its errors", ("_wire",)),
    (
        "vocabulary",
        "the exception tree, defaults, the sans-I/O drivers",
        ("_exceptions", "_defaults", "_drive"),
    ),
)
#: The layers that make the core.
CORE = ("face", "pools", "inference", "slots", "wire", "vocabulary")
#: The bench's results and their renderings: a report is drawn without Ray.
REPORTS = ("_results", "_summary", "_format", "_config", "_load", "report")
REPORTS += tuple(f"report.{m}" for m in ("_text", "_console", "_json", "_html", "_figures"))
MAX_MODULES_PER_FOLDER = 15
MAX_FUNCTION_LINES = 80


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


def layer_of(name: str) -> str:
    """The layer of a module of the package, by its first name under the package."""
    parts = name.split(".")
    first = parts[1] if len(parts) > 1 else ""
    for layer, _, members in LAYERS:
        if first in members:
            return layer
    raise AssertionError(f"{name} is in no layer: add {first!r} to LAYERS")


#: Each layer's place, 0 at the top.
RANK = {layer: rank for rank, (layer, _, _) in enumerate(LAYERS)}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} ({layer_of(name)}) imports {imported} ({layer_of(imported)})"
        for name, imports in graph.items()
        for imported in imports
        if imported in MODULES and RANK[layer_of(imported)] < RANK[layer_of(name)]
    )


def test_no_module_imports_one_that_imports_it_back() -> None:
    circles = sorted(
        (name, imported)
        for name in MODULES
        for imported in GRAPH[name]
        if imported in MODULES and name in _closure(imported)
    )
    assert circles == []


def test_every_module_is_in_a_layer_and_every_layer_has_modules() -> None:
    layers = {layer_of(name) for name in MODULES}
    assert layers == set(RANK)


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert _upward(GRAPH) == []


def test_the_core_imports_no_ray() -> None:
    core = [name for name in MODULES if layer_of(name) in CORE]
    assert "ray_triton_shm._client" in core and len(core) > 40
    assert {name for name in core if "ray" in _closure(name)} == set()


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


def test_the_checks_see_an_import_and_an_import_upward() -> None:
    """The graph is read right (else every check above passes on an empty graph), and an
    import upward is seen."""
    assert "ray_triton_shm._drive" in GRAPH["ray_triton_shm._calls"]
    assert "ray" in GRAPH["ray_triton_shm.ray._actor"]
    assert "ray_triton_shm._client" in _closure("ray_triton_shm.ray._handle")
    upward = {"ray_triton_shm._wire._http": {"ray_triton_shm._pools._registry"}}
    assert _upward(upward) == [
        "ray_triton_shm._wire._http (wire) imports ray_triton_shm._pools._registry (pools)"
    ]


#: The core's modules the Ray layer may use, through the internal APIs named for it (a module
#: added here is a decision: say which API of it the Ray layer needs).
RAY_USES = {
    f"ray_triton_shm.{name}"
    for name in (
        # the client, its pools (registry_of, attach_region, share_slots), its calls
        # (call_with, lease_with), one reading of a pool (PoolSnapshot)
        "_client",
        "_pools._registry",  # the type of those pools, for the binding that attaches them
        "_pools._snapshot",
        "_inference._engine",  # SuspectedChange
        "_inference._model_pool",  # ModelPool, the actor's view of the pools it owns
        "_pools._retry",  # the one rule of where a call goes on (follow_model)
        "_inference._options",  # RequestOptions, checked once where a handle makes them
        "_inference._stream",  # StreamResponse, what a handle's stream yields
        "_inference._node_batching",  # NodeBatching, the model's on the node
        # the vocabulary: errors, specs, inputs, keys, sizes, where slots live, defaults
        "_exceptions",
        "_slots._specs",
        "_inference._inputs",
        "_lease",
        "_wire._keys",
        "_slots._sizing",
        "_slots._memory",
        "_slots._cuda",
        "_defaults",
        "_slots._header",  # the histograms' buckets and the growth limits, for the metrics
        "_slots._slot_pool",  # PoolStats, of a handle's pool in its process
        "_inference._transport",  # how a model reaches Triton: transport values, Transport
        "_slots._shm",  # /dev/shm: its room, the regions on the node and their owners
        "_pools._scaling",  # the /dev/shm budget
        "_pools._reclaim",  # what dead owners left
        "_tools._doctor",  # the doctor's node checks, run on every node
        "_tools._doctor_report",  # what they found, gathered from every node
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


def _part(name: str) -> str:
    """The core as one, and each layer above it."""
    layer = layer_of(name)
    return "core" if layer in CORE else layer


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
            if not module.startswith("ray_triton_shm") or _part(module) == _part(name):
                continue
            reached += [
                f"{name}: {module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and f"{module}.{alias.name}" not in MODULES
            ]
    assert reached == []


def test_no_folder_of_the_package_holds_more_than_15_modules() -> None:
    crowded = {
        str(folder.relative_to(PACKAGE.parent)): count
        for folder in {path.parent for path in MODULES.values()}
        if (count := sum(1 for p in folder.glob("*.py") if p.name != "__init__.py"))
        > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Its lines, its docstring's aside."""
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    body = node.body[0] if node.body else None
    if (
        isinstance(body, ast.Expr)
        and isinstance(body.value, ast.Constant)
        and isinstance(body.value.value, str)
    ):
        lines -= (body.end_lineno or body.lineno) - body.lineno + 1
    return lines


def long_functions() -> dict[str, int]:
    """Every function of the package over :data:`MAX_FUNCTION_LINES`, by place."""
    return {
        f"{name}:{node.lineno} {node.name}": lines
        for name, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (lines := _function_lines(node)) > MAX_FUNCTION_LINES
    }


def test_no_function_of_the_package_is_over_80_lines() -> None:
    assert long_functions() == {}


def test_the_function_rule_counts_a_long_one() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f'def f():\n    """Doc\n\n    more."""\n{body}\n')
    assert _function_lines(tree.body[0]) == MAX_FUNCTION_LINES + 1  # type: ignore[arg-type]


#: Where docs/architecture.md holds the layer picture.
PICTURE_START = "<!-- layers: drawn from tests/unit/test_layering.py's LAYERS -->"
PICTURE_END = "<!-- /layers -->"


def _member_name(member: str) -> str:
    if not member:
        return "__init__"
    return f"{member}/" if (PACKAGE / member).is_dir() else member


def layer_picture() -> str:
    """The layers as a Mermaid flowchart, top first, each with what it holds."""
    lines = ["```mermaid", "flowchart TB"]
    for layer, holds, members in LAYERS:
        names = ", ".join(_member_name(m) for m in members)
        lines.append(f'    {layer}["<b>{layer}</b>: {holds}<br/>{names}"]')
    lines += [f"    {upper} --> {lower}" for (upper, *_), (lower, *_) in zip(LAYERS, LAYERS[1:])]
    return "\n".join([*lines, "```"])


def _drawn(page: str) -> str:
    start = page.index(PICTURE_START) + len(PICTURE_START)
    return page[start : page.index(PICTURE_END)].strip()


def test_the_architecture_page_draws_these_layers() -> None:
    """Else: ``python tests/unit/test_layering.py`` draws them again."""
    assert _drawn(ARCHITECTURE.read_text()) == layer_picture()


if __name__ == "__main__":
    page = ARCHITECTURE.read_text()
    start = page.index(PICTURE_START) + len(PICTURE_START)
    end = page.index(PICTURE_END)
    ARCHITECTURE.write_text(f"{page[:start]}\n{layer_picture()}\n{page[end:]}")
