"""How the paths talk to Triton: the backends a path's requests go through (:class:`Backend`),
the one way a measured ``TritonSHMClient`` is made (:func:`shm_client`), and a request by
value with tritonclient (:func:`infer`), which the reference is made with too."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._client import TritonSHMClient
from ray_triton_shm._slots._specs import ModelSpec
from ray_triton_shm._wire._keys import Keys

__all__ = ["Backend", "by_value", "infer", "shm_client", "transport_of"]


class Backend(str, enum.Enum):
    """What a path's requests go through to Triton, where the same caller, replica or job is
    measured on each: its value is the name the Ray paths' actors, the bench's Serve replica
    (a method each) and the example app (``deployments/classifier.py``) know it by."""

    #: Plain ``tritonclient.grpc`` (``.aio`` in a Serve replica).
    GRPC = "grpc"
    #: ``ShmModel``: the node actor's slots.
    SHM_MODEL = "shm"
    #: A ``TritonSHMClient`` of the process's own.
    SHM_CLIENT = "inproc"
    #: Nothing: the answers computed before (the ceiling of what carries the requests).
    NOOP = "noop"
    #: A Serve ``DeploymentHandle`` (the replica then calls Triton its own way).
    SERVE = "serve"

    def __str__(self) -> str:
        return self.value


def shm_client(
    url: str,
    case: ModelCase,
    slots: int,
    *,
    reconnect_timeout_s: float,
    **registration: Any,
) -> tuple[TritonSHMClient, ModelSpec]:
    """A ``TritonSHMClient`` on the Triton at ``url`` (the environment's keys as headers,
    waiting ``reconnect_timeout_s`` for an unreachable Triton), with ``case``'s model
    registered on ``slots`` slots (:data:`~.._config.ELASTIC`: a pool that follows its load)
    and ``registration``'s further arguments (``memory="cuda"``...); and the model's spec.
    The caller closes the client."""
    client = TritonSHMClient(
        url, headers=Keys(environ=True), reconnect_timeout_s=reconnect_timeout_s
    )
    try:
        spec = client.register_shm_model(case.model, **case.registration(slots), **registration)
    except BaseException:
        client.close()
        raise
    return client, spec


def transport_of(url: str, case: ModelCase, *, reconnect_timeout_s: float) -> tuple[str, str]:
    """How the library's pools of ``case``'s model reach the Triton at ``url``, and why: a
    pool of one slot registered as the paths' are (``transport="auto"``: shared memory where
    Triton maps it, proven by a probe request, else by value), read and closed."""
    client, _ = shm_client(url, case, 1, reconnect_timeout_s=reconnect_timeout_s)
    try:
        stats = client.shm_stats(case.model)
        return stats.transport, stats.transport_reason
    finally:
        client.close()


def by_value(
    module: Any, inputs: Mapping[str, np.ndarray], outputs: Iterable[str], **options: Any
) -> tuple[list[Any], list[Any]]:
    """The inputs, sent by value, and the requested outputs of one request, with the classes
    of ``module`` (``tritonclient.grpc``, ``.grpc.aio`` or ``.http``), built per request as
    a caller with new data each time does."""
    infer_inputs = []
    for name, array in inputs.items():
        datatype = str(np_to_triton_dtype(array.dtype))
        infer_input = module.InferInput(name, list(array.shape), datatype)
        infer_input.set_data_from_numpy(np.ascontiguousarray(array), **options)
        infer_inputs.append(infer_input)
    return infer_inputs, [module.InferRequestedOutput(name, **options) for name in outputs]


def infer(
    client: Any,
    case: ModelCase,
    inputs: Mapping[str, np.ndarray],
    module: Any = grpcclient,
    **options: Any,
) -> dict[str, Any]:
    """One request by value of ``client``, of ``module`` (:func:`by_value`): the outputs."""
    names = [t.name for t in case.outputs]
    infer_inputs, outputs = by_value(module, inputs, names, **options)
    result = client.infer(case.model, infer_inputs, outputs=outputs)
    return {name: result.as_numpy(name) for name in names}
