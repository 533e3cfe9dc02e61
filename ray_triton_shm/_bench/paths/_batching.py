"""The many-callers case's own paths (``bench --ray``, node batching): callers of a row or a
few each, from many processes, on one small model (:data:`~.._config.MANY_CALLERS`).

* ``shm-model-nb``: ``ShmModel`` with node batching in each caller process: the calls of
  every process on the node merged into one Triton request; ``serve-shm-nb``: the bench's
  Serve replica on it.
* ``grpc-procs-dynamic`` and ``shm-model-dynamic``: the model's twin with Triton's dynamic
  batcher on (:data:`~.._config.DYNAMIC_SUFFIX`), through plain gRPC and through ``ShmModel``
  without node batching, in each caller process.
* ``shm-model-nb-byvalue``, ``shm-model-byvalue`` and ``grpc-procs-byvalue``: ``ShmModel``
  with and without node batching, and plain gRPC, in each caller process, on a Triton with a
  ``/dev/shm`` of its own (:attr:`~._base.BenchPath.elsewhere`), where the library sends by
  value.

The other runs of the case are the Ray paths' own (``shm-model``, ``grpc-procs``,
``serve-shm``, ``serve-grpc``) and perf_analyzer's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._config import DYNAMIC_SUFFIX
from ray_triton_shm._bench.paths._base import BenchTarget, SkipPath
from ray_triton_shm._bench.paths._clients import Backend
from ray_triton_shm._bench.paths._ray import GrpcProcsPath, ServeShmPath, ShmModelPath
from ray_triton_shm._bench.paths._ray_session import RayPath
from ray_triton_shm._exceptions import ModelSpecError
from ray_triton_shm._wire._plain_client import tritonclient_for

__all__ = ["PATHS", "dynamic_twin"]

#: What the library says of a model it will not batch on the node.
_REFUSED = "cannot be batched on the node"


def dynamic_twin(case: ModelCase, target: BenchTarget) -> ModelCase:
    """``case`` on its model's twin with Triton's dynamic batcher on: the same tensors and
    ``max_batch_size``, its config's ``dynamic_batching`` on.

    Raises:
        SkipPath: Triton serves no such twin (saying what it would be).
    """
    twin = case.model + DYNAMIC_SUFFIX
    mine = _config(target.grpc_url, case.model)
    theirs = _config(target.grpc_url, twin)
    same = ("input", "output", "max_batch_size")
    if theirs is None or mine is None or any(mine.get(k) != theirs.get(k) for k in same):
        raise SkipPath(
            f"no model {twin!r} on Triton at {target.grpc_url} with {case.model!r}'s tensors "
            f"and max_batch_size and Triton's dynamic batcher on (a copy of {case.model!r} "
            "with dynamic_batching { } in its config, as the example models have)"
        )
    if "dynamic_batching" not in theirs:
        raise SkipPath(f"model {twin!r} has no dynamic_batching in its config")
    return dataclasses.replace(case, model=twin, dynamic_batching=True)


def _config(url: str, model: str) -> Mapping[str, Any] | None:
    """``model``'s config on the Triton at ``url`` (``None``: no such model)."""
    client = tritonclient_for(url)
    try:
        config = client.get_model_config(model, as_json=True)
    except Exception:
        return None
    finally:
        client.close()
    return config.get("config", config)  # type: ignore[no-any-return]


class _NodeBatched(RayPath):
    """A path on ``ShmModel`` with node batching: skipped, in the library's words, where it
    will not batch the model."""

    def setup(self) -> None:
        try:
            super().setup()
        except ModelSpecError as exc:
            said = [line.strip() for line in str(exc).splitlines() if _REFUSED in line]
            if not said:
                raise
            raise SkipPath(said[-1]) from None


class ShmModelNbPath(_NodeBatched, ShmModelPath):
    """``ShmModel`` with node batching in every caller process, on ``slots`` node slots, each
    room for the model's ``max_batch_size`` rows."""

    name, label = "shm-model-nb", "ShmModel with node batching in each caller"
    backend = Backend.SHM_MODEL_NB


class ServeShmNbPath(_NodeBatched, ServeShmPath):
    """The Serve replica calls Triton through ``ShmModel`` with node batching."""

    name, label = "serve-shm-nb", "Serve replica, ShmModel with node batching"
    backend = Backend.SHM_MODEL_NB


class _DynamicTwin(RayPath):
    """A path on the model's twin with Triton's dynamic batcher on (:func:`dynamic_twin`)."""

    def setup(self) -> None:
        self.case = dynamic_twin(self.case, self.target)
        super().setup()


class GrpcProcsDynamicPath(_DynamicTwin, GrpcProcsPath):
    """Plain ``tritonclient.grpc`` in every caller process, on the twin: Triton's own
    batcher merges what queues while the model is busy."""

    name, label = "grpc-procs-dynamic", "gRPC in each caller, Triton's dynamic batcher"


class ShmModelDynamicPath(_DynamicTwin, ShmModelPath):
    """``ShmModel`` without node batching in every caller process, on the twin."""

    name, label = "shm-model-dynamic", "ShmModel in each caller, Triton's dynamic batcher"


class _ByValue(RayPath):
    """A path on a Triton with a ``/dev/shm`` of its own (:attr:`target`): ``ShmModel``'s
    calls go to it (``url=``, a node actor of its URL), by value."""

    elsewhere: ClassVar[bool] = True
    slots: int

    def _arg(self) -> Any:
        if self.backend == Backend.GRPC:
            return self.target.grpc_url
        return (self.slots, self.target.grpc_url)


class ShmModelNbByValuePath(_ByValue, ShmModelNbPath):
    """``ShmModel`` with node batching in every caller process, by value."""

    name, label = "shm-model-nb-byvalue", "ShmModel with node batching in each caller, by value"


class ShmModelByValuePath(_ByValue, ShmModelPath):
    """``ShmModel`` in every caller process, by value."""

    name, label = "shm-model-byvalue", "ShmModel in each caller, by value"


class GrpcProcsByValuePath(_ByValue, GrpcProcsPath):
    """Plain ``tritonclient.grpc`` in every caller process, on the Triton elsewhere."""

    name, label = "grpc-procs-byvalue", "gRPC client in each caller, Triton elsewhere"


#: The many-callers case's own paths, in table order (``_config.BATCHING_PATHS`` and
#: ``BY_VALUE_PATHS``).
PATHS: tuple[type[RayPath], ...] = (
    ShmModelNbPath,
    ServeShmNbPath,
    GrpcProcsDynamicPath,
    ShmModelDynamicPath,
    ShmModelNbByValuePath,
    ShmModelByValuePath,
    GrpcProcsByValuePath,
)
