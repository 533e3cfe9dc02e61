"""Every use of Ray's private APIs, in one place.

Ray has no public API for these: the classes its own Grafana dashboards are made of, the
function that renders them and where its dashboard writes them; where a local Ray keeps its
files, and the session directory of the Ray a process is connected to; the driver's printing
of the raylet's messages; RayConfig and the auth token read again from the environment; the
task events of the GCS without a dashboard; what Ray does to a worker's
``CUDA_VISIBLE_DEVICES``. Each is reached here alone, by a function named for what it does,
so that a Ray upgrade that moves one breaks its test (``tests/test_ray_internals.py``), not a
path that needs it. Nothing else in the package, its deployments or its tests imports
``ray._private``, ``ray._raylet``, ``ray._common`` or ``ray.dashboard.modules`` (the same
test).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "dashboard_classes",
    "default_temp_dir",
    "forget_auth_token",
    "grafana_output_env_vars",
    "noset_visible_gpus_env_var",
    "quiet_raylet_messages",
    "render_grafana_dashboard",
    "reread_ray_config",
    "session_dir",
    "set_visible_gpus",
    "task_events_of",
]

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


def grafana_output_env_vars() -> tuple[str, str]:
    """The variables that tell Ray's dashboard where to write Grafana's dashboards: their
    directory, and the root of the metrics' files (``grafana/dashboards`` under it)."""
    from ray.dashboard.modules.metrics import metrics_head

    return (
        metrics_head.GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR,
        metrics_head.METRICS_OUTPUT_ROOT_ENV_VAR,
    )


def default_temp_dir() -> Path:
    """Where a local Ray keeps its sessions by default."""
    try:
        from ray._common.utils import get_default_ray_temp_dir
    except ImportError:  # other Ray versions keep it elsewhere; /tmp/ray is its default
        return DEFAULT_TEMP_DIR
    return Path(get_default_ray_temp_dir())


def session_dir() -> Path:
    """The session directory of the Ray this process is connected to (its ``logs``...)."""
    from ray._private import worker

    return Path(worker.global_worker.node.get_session_dir_path())


def quiet_raylet_messages() -> Callable[[], None]:
    """Keeps this driver from printing the raylet's messages ("N worker processes have been
    started"), which it prints whatever ``log_to_driver`` says.

    Returns:
        What prints them again.
    """
    from ray._private import worker

    printer = worker.print_to_stdstream
    worker.print_to_stdstream = lambda data, ignore_prefix: None

    def undo() -> None:
        worker.print_to_stdstream = printer

    return undo


def reread_ray_config() -> bool:
    """Reads RayConfig again from this process's environment (Ray reads its ``RAY_*``
    variables once per process, and again as it turns token auth on).

    Returns:
        Whether this Ray has such a config (else nothing was read).
    """
    import ray._raylet

    config = getattr(ray._raylet, "Config", None)
    if config is None:
        return False
    config.initialize("")
    return True


def forget_auth_token() -> bool:
    """Forgets the auth token Ray cached in this process: the next use reads the environment
    again.

    Returns:
        Whether this Ray caches one (a Ray without token auth has none to forget).
    """
    import ray._raylet

    loader = getattr(ray._raylet, "AuthenticationTokenLoader", None)
    if loader is None:
        return False
    loader.instance().reset_cache()
    return True


def task_events_of(actor: Any) -> list[Any]:
    """The task events in the GCS of an actor's tasks (its method calls): the table Ray's state
    API (``ray.util.state.list_tasks``) serves through the dashboard, read without one.

    Returns:
        Ray's ``TaskEvents`` messages (``task_id``, ``attempt_number``, ``task_info``,
        ``state_updates``).
    """
    from ray._private.state import state

    actor_id = actor._actor_id.binary()
    return [e for e in state._get_all_task_events() if e.task_info.actor_id == actor_id]


def noset_visible_gpus_env_var() -> str:
    """The variable that keeps Ray from setting a worker's ``CUDA_VISIBLE_DEVICES``."""
    from ray._private.accelerators import nvidia_gpu

    return str(nvidia_gpu.NOSET_CUDA_VISIBLE_DEVICES_ENV_VAR)


def set_visible_gpus(ids: Sequence[str]) -> None:
    """Sets this process's ``CUDA_VISIBLE_DEVICES`` as Ray does for a worker given the GPUs
    ``ids`` (Ray's own code: where :func:`noset_visible_gpus_env_var` is set, it leaves it)."""
    from ray._private.accelerators import nvidia_gpu

    nvidia_gpu.NvidiaGPUAcceleratorManager.set_current_process_visible_accelerator_ids(list(ids))
