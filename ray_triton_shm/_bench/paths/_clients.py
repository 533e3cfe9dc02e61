"""How the paths talk to Triton: the backends a path's requests go through (:class:`Backend`),
the one way a measured ``TritonSHMClient`` is made (:func:`shm_client`), and a request by
value with tritonclient (:func:`infer`), which the reference is made with too; for a streaming
model, tritonclient's streaming client as its users run it (:class:`GrpcStreamer` in a thread,
:class:`GrpcStreamerAsync` on an event loop); and Triton's own counts of a model's requests,
rows and executions (:class:`TritonCounts`)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import queue
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._client import TritonSHMClient
from ray_triton_shm._slots._specs import ModelSpec
from ray_triton_shm._wire._keys import Keys
from ray_triton_shm._wire._plain_client import tritonclient_for

__all__ = ["Backend", "GrpcStreamer", "GrpcStreamerAsync", "by_value", "infer", "shm_client"]
__all__ += ["TritonCounts", "transport_of"]


class Backend(str, enum.Enum):
    """What a path's requests go through to Triton, where the same caller, replica or job is
    measured on each: its value is the name the Ray paths' actors, the bench's Serve replica
    (a method each) and the example app (``deployments/classifier.py``) know it by."""

    #: Plain ``tritonclient.grpc`` (``.aio`` in a Serve replica).
    GRPC = "grpc"
    #: ``ShmModel``: the node actor's slots.
    SHM_MODEL = "shm"
    #: ``ShmModel`` with node batching: the calls of every process on the node merged.
    SHM_MODEL_NB = "shm_nb"
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


#: The parameter of a response that says it is its request's last.
_FINAL = "triton_final_response"


class GrpcStreamer:
    """tritonclient's streaming client, as its users run one: a client on the Triton at
    ``url`` with its gRPC stream (``start_stream``, whose callback hands each response over),
    and each request sent on it by value (``async_stream_infer``, with an empty final
    response, so that a request's end shows). tritonclient allows one stream per client:
    concurrent streams need a streamer each (the bench's callers have one each)."""

    def __init__(self, url: str) -> None:
        self._client = tritonclient_for(url)
        self._responses: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._client.start_stream(callback=self._deliver)

    def _deliver(self, result: Any, error: Any) -> None:
        self._responses.put((result, error))

    def stream(self, case: ModelCase, inputs: Mapping[str, np.ndarray]) -> Iterator[dict[str, Any]]:
        """One request of ``inputs`` to ``case``'s model: each response's outputs, as they
        come, until Triton's final response (an empty one is not yielded).

        Raises:
            InferenceServerException: The model answered with an error.
        """
        names = [t.name for t in case.outputs]
        infer_inputs, outputs = by_value(grpcclient, inputs, names)
        request_id = str(next(self._ids))
        self._client.async_stream_infer(
            case.model,
            infer_inputs,
            outputs=outputs,
            request_id=request_id,
            enable_empty_final_response=True,
        )
        while True:
            result, error = self._responses.get()
            if error is not None:
                raise error
            response = result.get_response()
            if response.id != request_id:
                raise AssertionError(f"request {request_id} got a response of {response.id}")
            if response.outputs:
                yield {name: result.as_numpy(name) for name in names}
            if response.parameters[_FINAL].bool_param:
                return

    def close(self) -> None:
        """Ends its stream and closes its client."""
        try:
            self._client.stop_stream()
        finally:
            self._client.close()


class GrpcStreamerAsync:
    """tritonclient's streaming client in an event loop (a Serve replica's), as its users run
    one there: one client and its gRPC stream (tritonclient allows one per client), every
    request on it with an id of its own, each response handed by the client's callback (on a
    thread of its own) to the queue of its request on the loop."""

    def __init__(self, url: str) -> None:
        self._client = tritonclient_for(url)
        self._queues: dict[str, asyncio.Queue[tuple[Any, Any]]] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client.start_stream(callback=self._deliver)

    def _deliver(self, result: Any, error: Any) -> None:
        assert self._loop is not None
        # tritonclient's errors on a stream carry no request id: every request waiting fails.
        mine = list(self._queues.values()) if result is None else []
        mine += [] if result is None else [self._queues[result.get_response().id]]
        for responses in mine:
            self._loop.call_soon_threadsafe(responses.put_nowait, (result, error))

    async def stream(
        self, case: ModelCase, inputs: Mapping[str, np.ndarray]
    ) -> AsyncIterator[dict[str, Any]]:
        """:meth:`GrpcStreamer.stream` on the running event loop."""
        self._loop = asyncio.get_running_loop()
        names = [t.name for t in case.outputs]
        infer_inputs, outputs = by_value(grpcclient, inputs, names)
        request_id = str(next(self._ids))
        responses = self._queues[request_id] = asyncio.Queue()
        try:
            self._client.async_stream_infer(
                case.model,
                infer_inputs,
                outputs=outputs,
                request_id=request_id,
                enable_empty_final_response=True,
            )
            while True:
                result, error = await responses.get()
                if error is not None:
                    raise error
                response = result.get_response()
                if response.outputs:
                    yield {name: result.as_numpy(name) for name in names}
                if response.parameters[_FINAL].bool_param:
                    return
        finally:
            del self._queues[request_id]

    def close(self) -> None:
        """Ends its stream and closes its client."""
        try:
            self._client.stop_stream()
        finally:
            self._client.close()


#: Triton's counts of a model (its statistics, over its versions): requests answered, the
#: rows (samples) in them, and the executions of the model they took (fewer than the
#: requests where Triton's dynamic batcher merged them).
Counts = tuple[int, int, int]


class TritonCounts:
    """Triton's counts of the models the paths send to (:data:`Counts`), read from its
    statistics before and after each slice: their difference is the slice's. A plain client
    per Triton, kept until :meth:`close`."""

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}

    def read(self, url: str, model: str) -> Counts | None:
        """``model``'s counts on the Triton at ``url`` now (``None``: unread, Triton away)."""
        try:
            client = self._clients.get(url)
            if client is None:
                client = self._clients[url] = tritonclient_for(url)
            stats = client.get_inference_statistics(model, as_json=True)
        except Exception:
            return None
        requests = rows = executions = 0
        for version in stats.get("model_stats", ()):
            requests += int(version.get("inference_stats", {}).get("success", {}).get("count", 0))
            rows += int(version.get("inference_count", 0))
            executions += int(version.get("execution_count", 0))
        return requests, rows, executions

    def close(self) -> None:
        """Closes its clients."""
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
