"""The public surface, pinned: what a user imports, and nothing else."""

from __future__ import annotations

import inspect
import subprocess
import sys
from types import ModuleType

import pytest

import ray_triton_shm
import ray_triton_shm.ray
from ray_triton_shm import _exceptions

CORE = [
    "AccessDeniedError",
    "CheckResult",
    "ClientClosedError",
    "CudaError",
    "ForeignRegionError",
    "GPUMemoryFullError",
    "InvalidInputError",
    "Keys",
    "LeaseByValueError",
    "LocalServerError",
    "LocalTritonServer",
    "ModelChangedError",
    "ModelNotLoadedError",
    "ModelNotRegisteredError",
    "ModelSpec",
    "ModelSpecError",
    "NodeBatching",
    "NodeReport",
    "OverloadedError",
    "PoolStats",
    "ReclaimReport",
    "RegionStatus",
    "ServerUnreachableError",
    "SharedMemoryFullError",
    "SharedMemoryNotAllowedError",
    "SharedMemoryUnreachableError",
    "SlotAutoscaling",
    "SlotLease",
    "SlotTimeoutError",
    "StreamInterruptedError",
    "StreamResponse",
    "StreamingModelError",
    "StatusReport",
    "TLSHandshakeError",
    "TensorSpec",
    "TlsFiles",
    "TritonSHMClient",
    "TritonSHMError",
    "TritonServerError",
    "__version__",
    "check_node",
    "headers_from_dir",
    "headers_from_env",
    "reclaim_regions",
    "region_status",
]
RAY = [
    "BlockingCallError",
    "NodeStats",
    "ShmModel",
    "ShmPredictor",
    "RegionReplacedError",
    "TritonNodeActor",
    "URL_ENV_VAR",
    "check_cluster",
    "get_node_actor",
    "grafana_dashboard",
    "install_grafana_dashboard",
]


def _public_names(module: ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }


def test_core_exports_exactly_its_all() -> None:
    assert sorted(ray_triton_shm.__all__, key=str.casefold) == sorted(CORE, key=str.casefold)
    # Imported on first use: each name resolves, and nothing else is public.
    assert all(getattr(ray_triton_shm, name) is not None for name in CORE)
    assert _public_names(ray_triton_shm) == set(CORE) - {"__version__"}
    assert sorted(dir(ray_triton_shm)) == sorted(CORE)
    with pytest.raises(AttributeError, match="SlotPool"):
        ray_triton_shm.SlotPool  # noqa: B018


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]])
def test_the_package_and_the_cli_help_load_no_heavy_module(argv: list[str]) -> None:
    script = (
        "import contextlib, io, sys\n"
        "from ray_triton_shm._cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})\n"
        "heavy = ('numpy', 'grpc', 'tritonclient', 'ray', 'rich', 'matplotlib')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_ray_exports_exactly_its_all() -> None:
    assert sorted(ray_triton_shm.ray.__all__) == sorted(RAY)
    assert _public_names(ray_triton_shm.ray) == set(RAY)


def test_every_error_is_in_the_one_tree_and_exported() -> None:
    errors = [
        value
        for value in vars(_exceptions).values()
        if inspect.isclass(value) and issubclass(value, BaseException)
    ]
    assert all(issubclass(error, ray_triton_shm.TritonSHMError) for error in errors)
    exported = {*CORE, *RAY}
    assert {error.__name__ for error in errors} <= exported


def test_the_earlier_names_still_work_and_say_their_new_ones() -> None:
    from ray_triton_shm import _exceptions
    from ray_triton_shm.ray._actor import NodeActorConfig

    with pytest.warns(DeprecationWarning, match="RegionReplacedError"):
        old = ray_triton_shm.ray.StaleLeaseError  # type: ignore[attr-defined]
    assert old is ray_triton_shm.ray.RegionReplacedError
    with pytest.warns(DeprecationWarning, match="RegionReplacedError"):
        assert _exceptions.StaleLeaseError is _exceptions.RegionReplacedError  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="metrics_interval_s"):
        config = NodeActorConfig(sweep_interval_s=0.5)
    assert config.metrics_interval_s == 0.5
    assert NodeActorConfig().metrics_interval_s == 1.0
    with pytest.raises(AttributeError, match="NoSuchError"):
        ray_triton_shm.ray.NoSuchError  # type: ignore[attr-defined]  # noqa: B018
