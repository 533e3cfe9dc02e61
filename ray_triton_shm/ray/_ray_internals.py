"""Every use of Ray's private APIs, in one place.

Ray has no public API for these: the classes its own Grafana dashboards are made of and the
function that renders them, and where a local Ray keeps its files. Each is reached here
alone, so that a Ray upgrade that moves one breaks its test (``tests/test_ray_internals.py``),
not a path that needs it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["dashboard_classes", "default_temp_dir", "render_grafana_dashboard"]

#: Ray's default temp dir, where a Ray version keeps it elsewhere.
DEFAULT_TEMP_DIR = Path("/tmp/ray")


def dashboard_classes() -> ModuleType:
    """The module of Ray's dashboard classes (``DashboardConfig``, ``Panel``, ``Row``...)."""
    from ray.dashboard.modules.metrics.dashboards import common

    return common


def render_grafana_dashboard(config: Any) -> str:
    """A ``DashboardConfig`` as Grafana's JSON, rendered by Ray's own dashboard factory."""
    from ray.dashboard.modules.metrics import grafana_dashboard_factory

    # Ray's function returns (content, uid) though it is annotated as returning str.
    generated: Any = grafana_dashboard_factory._generate_grafana_dashboard(config)
    content, _uid = generated
    return str(content)


def default_temp_dir() -> Path:
    """Where a local Ray keeps its sessions by default."""
    try:
        from ray._common.utils import get_default_ray_temp_dir
    except ImportError:  # other Ray versions keep it elsewhere; /tmp/ray is its default
        return DEFAULT_TEMP_DIR
    return Path(get_default_ray_temp_dir())
