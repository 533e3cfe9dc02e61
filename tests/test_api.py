"""The public surface, pinned: what a user imports, and nothing else."""

from __future__ import annotations

import inspect
from types import ModuleType

import ray_triton_shm
import ray_triton_shm.ray
from ray_triton_shm import _exceptions

CORE = [
    "ClientClosedError",
    "InvalidInputError",
    "LocalServerError",
    "LocalTritonServer",
    "ModelNotRegisteredError",
    "ModelSpec",
    "ModelSpecError",
    "OverloadedError",
    "PoolStats",
    "ReclaimReport",
    "RegionStatus",
    "ServerUnreachableError",
    "SharedMemoryFullError",
    "SharedMemoryNotAllowedError",
    "SlotTimeoutError",
    "StatusReport",
    "TensorSpec",
    "TritonSHMClient",
    "TritonSHMError",
    "TritonServerError",
    "__version__",
    "reclaim",
    "status",
]
RAY = [
    "NodeStats",
    "ShmModel",
    "ShmPredictor",
    "StaleLeaseError",
    "TritonNodeActor",
    "URL_ENV_VAR",
    "get_node_actor",
]


def _public_names(module: ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }


def test_core_exports_exactly_its_all() -> None:
    assert sorted(ray_triton_shm.__all__, key=str.casefold) == sorted(CORE, key=str.casefold)
    assert _public_names(ray_triton_shm) == set(CORE) - {"__version__"}


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
