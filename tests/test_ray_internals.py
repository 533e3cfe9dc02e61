"""Ray's private APIs, each reached through ``ray_triton_shm/ray/_ray_internals.py`` alone.

Each function of that module works against the installed Ray: a Ray upgrade that moves one of
them breaks its test here, not a path that needs it. And nothing else in the package, its
deployments or its tests reaches Ray's private modules.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

import pytest
from _helpers import wait_for

ray = pytest.importorskip("ray")

from ray_triton_shm.ray import _ray_internals  # noqa: E402
from ray_triton_shm.ray._actor import NOSET_VISIBLE_DEVICES_ENV_VAR  # noqa: E402
from ray_triton_shm.ray._dashboard import (  # noqa: E402
    DEFAULT_UID,
    GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR,
    METRICS_OUTPUT_ROOT_ENV_VAR,
    _dashboard_config,
)

ROOT = Path(__file__).resolve().parent.parent
#: Ray's private modules: what only ``_ray_internals`` may reach.
PRIVATE = ("ray._private", "ray._raylet", "ray._common", "ray.dashboard.modules")
#: Where the package, its deployments and its tests are.
SCANNED = ("ray_triton_shm", "deployments", "tests")
#: The one module that reaches them.
INTERNALS = ROOT / "ray_triton_shm" / "ray" / "_ray_internals.py"


# ---------------------------------------------------------------- each function, on this Ray


def test_every_function_is_tested_here() -> None:
    tested = {
        name.removeprefix("test_")
        for name, value in globals().items()
        if name.startswith("test_") and callable(value)
    }
    assert set(_ray_internals.__all__) <= tested


def test_dashboard_classes() -> None:
    classes = _ray_internals.dashboard_classes()
    for name in ("DashboardConfig", "Panel", "Row", "Target", "GridPos"):
        assert isinstance(getattr(classes, name), type), name


def test_render_grafana_dashboard() -> None:
    rendered = json.loads(_ray_internals.render_grafana_dashboard(_dashboard_config()))
    assert rendered["uid"] == DEFAULT_UID and rendered["panels"]


def test_grafana_output_env_vars() -> None:
    """Ray's names of them are the ones the package reads itself."""
    assert _ray_internals.grafana_output_env_vars() == (
        GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR,
        METRICS_OUTPUT_ROOT_ENV_VAR,
    )


def test_default_temp_dir() -> None:
    temp_dir = _ray_internals.default_temp_dir()
    assert temp_dir.is_absolute() and temp_dir.name == "ray"


def test_session_dir(ray_local: str) -> None:
    session = _ray_internals.session_dir()
    assert session.name.startswith("session_") and (session / "logs").is_dir()


def test_quiet_raylet_messages() -> None:
    """It finds what it silences, and gives it back."""
    undo = _ray_internals.quiet_raylet_messages()
    undo()


def test_reread_ray_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_raylet_start_wait_time_s", "31")
    try:
        assert _ray_internals.reread_ray_config()
    finally:
        monkeypatch.delenv("RAY_raylet_start_wait_time_s")
        _ray_internals.reread_ray_config()


def test_forget_auth_token() -> None:
    assert _ray_internals.forget_auth_token()


def test_task_events_of(ray_local: str) -> None:
    """An actor's method calls, as the GCS records them."""

    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, value: int) -> int:
            return value

    actor = Echo.remote()  # type: ignore[attr-defined]
    try:
        ref = actor.echo.remote(1)
        assert ray.get(ref, timeout=60) == 1
        called = ref.task_id().binary()

        def reported() -> list[Any]:
            return [e for e in _ray_internals.task_events_of(actor) if e.task_id == called]

        (event,) = wait_for(reported, timeout_s=60, what="the actor's call in the GCS")
        assert event.task_info.name.endswith("echo") and event.attempt_number == 0
    finally:
        ray.kill(actor)


def test_noset_visible_gpus_env_var() -> None:
    """Ray's name of it is the one the node actor sets."""
    assert _ray_internals.noset_visible_gpus_env_var() == NOSET_VISIBLE_DEVICES_ENV_VAR


def test_set_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.delenv(NOSET_VISIBLE_DEVICES_ENV_VAR, raising=False)
    _ray_internals.set_visible_gpus(["2"])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    monkeypatch.setenv(NOSET_VISIBLE_DEVICES_ENV_VAR, "1")
    _ray_internals.set_visible_gpus(["3"])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


# ---------------------------------------------------------------- nobody else reaches them


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain on a name, else ``None``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def private_uses(source: str | ast.Module) -> list[str]:
    """Where ``source`` (or its syntax tree) reaches a private module of Ray: an import of one,
    an attribute chain through one (``ray._raylet.Config``), or its name given to a call
    (``importorskip``)."""
    found = []
    tree = ast.parse(source) if isinstance(source, str) else source
    for node in ast.walk(tree):
        names: list[Any] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Attribute):
            names = [_dotted(node)]
        elif isinstance(node, ast.Call):
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
        found += [
            f"line {node.lineno}: {name}"
            for name in names
            if isinstance(name, str) and any(name == p or name.startswith(f"{p}.") for p in PRIVATE)
        ]
    return sorted(set(found))


#: Every scanned file's syntax tree, parsed once at collection. (Parsed after other tests ran
#: in the same process, CPython 3.11.7's ``ast.parse`` can raise "SystemError: AST
#: constructor recursion depth mismatch", a bug of its own; see tests/unit/test_layering.py.)
TREES = {
    str(path.relative_to(ROOT)): ast.parse(path.read_text())
    for folder in SCANNED
    for path in sorted((ROOT / folder).rglob("*.py"))
    if path != INTERNALS
}


def test_only_the_internals_reach_rays_private_modules() -> None:
    reached = {name: uses for name, tree in TREES.items() if (uses := private_uses(tree))}
    assert reached == {}


def test_the_scan_sees_each_way_of_reaching_them() -> None:
    """Else the test above passes on a scan that sees nothing."""
    assert private_uses(INTERNALS.read_text())
    for source in (
        "import ray._private.worker",
        "from ray._private import worker",
        "from ray import _raylet",
        "import ray\nray._raylet.Config.initialize('')",
        "pytest.importorskip('ray.dashboard.modules.metrics.metrics_head')",
    ):
        assert private_uses(source), source
    prose = '"""Ray\'s ``ray._private.node.Node`` waits."""\nfrom ray.util import state'
    assert private_uses(prose) == []
