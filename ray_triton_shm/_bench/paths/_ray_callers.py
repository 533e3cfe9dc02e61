"""What runs in the Ray paths' own processes: the caller actors (:class:`Caller`, and
:class:`ChurnCaller` for the churn runs), the bench's Serve replica (:class:`BenchReplica`)
and the Ray Data job's predictor (:class:`Predictor`), each sending its requests through a
:class:`~._clients.Backend` (on a streaming model, its streams: :func:`connect_stream`); and
how their errors reach the driver (:class:`CallerError`). The paths that drive them are in
:mod:`._ray`."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._config import DYNAMIC_SUFFIX, ELASTIC
from ray_triton_shm._bench._load import (
    OpenLoop,
    StreamSlice,
    StreamTimes,
    run_open_loop,
    run_streams_until,
    run_until,
)
from ray_triton_shm._bench.paths._base import StreamRequest, check_outputs, time_stream
from ray_triton_shm._bench.paths._clients import (
    Backend,
    GrpcStreamer,
    GrpcStreamerAsync,
    by_value,
    infer,
    shm_client,
)
from ray_triton_shm._bench.paths._ray_session import reconnect_timeout_s
from ray_triton_shm._exceptions import TritonSHMError
from ray_triton_shm._inference._node_batching import NodeBatching
from ray_triton_shm._wire._plain_client import tritonclient_for

with contextlib.suppress(ImportError):  # without the ray extra: the session says so
    from ray_triton_shm.ray import ShmModel, ShmPredictor

__all__ = ["LATENCY", "BenchReplica", "Caller", "CallerError", "ChurnCaller", "Predictor"]
__all__ += ["STREAM_GRPC", "STREAM_SHM", "connect", "connect_stream", "errors_reach_the_driver"]
__all__ += ["FORCED", "NodeSlots", "bench_node_batching", "shm_model_options"]

#: The column in which the predictor reports its call's latency (on a batch's first row).
LATENCY = "__bench_latency_s"
#: The bench replica's streaming methods: through ``ShmModel.stream_async``, and through
#: tritonclient's streaming client (:class:`~._clients.GrpcStreamerAsync`).
STREAM_SHM, STREAM_GRPC = "stream_shm", "stream_grpc"

# The replica's backends, bound once: looking an enum's member up takes some 60 ns more than
# a global, on every request.
_GRPC, _SHM_MODEL, _SHM_CLIENT = Backend.GRPC, Backend.SHM_MODEL, Backend.SHM_CLIENT
_SHM_MODEL_NB = Backend.SHM_MODEL_NB
#: The backends through ``ShmModel``.
_SHM_MODELS = (Backend.SHM_MODEL, Backend.SHM_MODEL_NB)
#: The models node batching is forced on where their configs leave Triton's dynamic batcher
#: off: the examples, whose rows are independent of each other (their configs leave it off to
#: keep it out of the other runs). On another such model the library refuses node batching,
#: and the run is skipped saying why.
FORCED = ("identity", "classifier")

#: ``ShmModel``'s node slots on another Triton than the node's: ``(slots, its gRPC URL)``.
NodeSlots = tuple[int, str]
_Call = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
_Open = Callable[[Mapping[str, np.ndarray]], Iterable[Mapping[str, Any]]]
_F = TypeVar("_F", bound=Callable[..., Any])


class CallerError(RuntimeError):
    """An error a bench caller process raised, as it reaches the driver: its type and
    message. tritonclient's exceptions do not survive Ray's wrapping of a task's error (the
    driver sees "Failed to deserialize exception"); the library's own and the builtins do."""


def _as_caller_error(exc: Exception) -> Exception:
    if isinstance(exc, TritonSHMError) or type(exc).__module__ == "builtins":
        return exc
    kind = type(exc)
    return CallerError(f"{kind.__module__}.{kind.__qualname__}: {exc}")


@contextlib.contextmanager
def _carried_to_the_driver() -> Iterator[None]:
    """Lets an error through as itself where Ray can carry it to the driver, else as a
    :class:`CallerError` naming it."""
    try:
        yield
    except Exception as exc:
        carried = _as_caller_error(exc)
        if carried is exc:
            raise
        raise carried from None


def errors_reach_the_driver(method: _F) -> _F:
    """``method`` (of a caller actor, sync, async or an async generator) with
    :func:`_carried_to_the_driver`."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def wrapper_gen(*args: Any, **kwargs: Any) -> Any:
            with _carried_to_the_driver():
                async for item in method(*args, **kwargs):
                    yield item

        return wrapper_gen  # type: ignore[return-value]

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def wrapper_async(*args: Any, **kwargs: Any) -> Any:
            with _carried_to_the_driver():
                return await method(*args, **kwargs)

        return wrapper_async  # type: ignore[return-value]

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _carried_to_the_driver():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def shm_model_options(
    case: ModelCase, where: int | NodeSlots, *, node_batching: bool = False
) -> dict[str, Any]:
    """``ShmModel``'s arguments for ``case`` on ``where`` node slots
    (:data:`~.._config.ELASTIC`: the node actor's defaults; a :data:`NodeSlots`: those, on
    another Triton), waiting the bench's reconnect timeout for Triton; with
    ``node_batching``, each slot room for the model's ``max_batch_size`` rows, and its calls
    merged (:func:`bench_node_batching`)."""
    slots, url = (where, None) if isinstance(where, int) else where
    wait_s = reconnect_timeout_s()
    node = {"reconnect_timeout_s": wait_s, **({} if slots == ELASTIC else {"slots": slots})}
    options = {"actor_options": node, "reconnect_timeout_s": wait_s}
    options |= case.registration(slots, whole_batches=node_batching)
    if node_batching:
        options["node_batching"] = bench_node_batching(case)
    return options | ({} if url is None else {"url": url})


def bench_node_batching(case: ModelCase) -> NodeBatching:
    """The node batching of the bench's runs: its defaults, forced on the example models
    (:data:`FORCED`)."""
    return NodeBatching(force=case.model.removesuffix(DYNAMIC_SUFFIX) in FORCED)


def connect(backend: Backend, arg: Any, case: ModelCase) -> tuple[_Call, Callable[[], None]]:
    """A call sending one request's inputs through ``backend``, and the close of what it
    holds: :attr:`~Backend.SERVE` (``arg``: a ``DeploymentHandle``), :attr:`~Backend.SHM_MODEL`
    and :attr:`~Backend.SHM_MODEL_NB` (``arg``: node slots, or :data:`~.._config.ELASTIC`: no
    ``pool_size``, on a node actor with its defaults; or :data:`NodeSlots`) or
    :attr:`~Backend.GRPC` (``arg``: the URL)."""
    if backend == Backend.SERVE:
        return (lambda inputs: arg.remote(inputs).result()), (lambda: None)
    if backend in _SHM_MODELS:
        batching = backend == Backend.SHM_MODEL_NB
        model = ShmModel(case.model, **shm_model_options(case, arg, node_batching=batching))
        return model.infer, model.close
    client = tritonclient_for(arg)
    return (lambda inputs: infer(client, case, inputs)), client.close


def connect_stream(backend: Backend, arg: Any, case: ModelCase) -> tuple[_Open, Callable[[], None]]:
    """:func:`connect` for a streaming model: what opens one stream of a request's inputs
    (its responses' outputs, as they come), and the close of what it holds; through
    :attr:`~Backend.SERVE` (``arg``: a streaming ``DeploymentHandle``),
    :attr:`~Backend.SHM_MODEL` (``ShmModel.stream``) or :attr:`~Backend.GRPC` (tritonclient's
    streaming client, :class:`~._clients.GrpcStreamer`; ``arg``: the URL)."""
    if backend == Backend.SERVE:
        return arg.remote, (lambda: None)
    if backend == Backend.SHM_MODEL:
        model = ShmModel(case.model, **shm_model_options(case, arg))
        return model.stream, model.close
    streamer = GrpcStreamer(arg)
    return (lambda inputs: streamer.stream(case, inputs)), streamer.close


class Caller:
    """A Ray actor (a process of its own) sending one request at a time; it holds a target per
    (path, run): a call and its inputs (resolved once from the object store), or of a
    streaming model, its streams (:meth:`add_stream`)."""

    def __init__(self) -> None:
        self._targets: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {}
        self._streams: dict[str, Callable[[int], StreamTimes]] = {}
        self._checked: dict[str, int] = {}

    @errors_reach_the_driver
    def add(
        self,
        key: str,
        backend: Backend,
        arg: Any,
        case: ModelCase,
        inputs: Any,
        reference: Mapping[str, np.ndarray] | None = None,
    ) -> int:
        """Sends ``inputs`` as ``key`` through ``backend`` (:func:`connect`); binds, connects,
        warms up. With a ``reference`` (the answer to ``inputs``), every answer is checked
        against it (``AssertionError`` at the first wrong one) and counted
        (:meth:`checked`). Returns this process's id."""
        call, close = connect(backend, arg, case)
        if reference is None:
            self._targets[key] = (lambda: call(inputs)), close
        else:
            self._checked[key] = 0

            def checked() -> Mapping[str, np.ndarray]:
                answer = call(inputs)
                check_outputs(answer, reference)
                self._checked[key] += 1
                return answer

            self._targets[key] = checked, close
        self._targets[key][0]()
        return os.getpid()

    def checked(self, key: str) -> int:
        """The answers of ``key`` checked so far (``0``: none are)."""
        return self._checked.get(key, 0)

    @errors_reach_the_driver
    def once(self, key: str) -> dict[str, np.ndarray]:
        """One request; returns its outputs."""
        return dict(self._targets[key][0]())

    @errors_reach_the_driver
    def loop(self, key: str, start_at: float, duration_s: float) -> tuple[np.ndarray, float]:
        """Requests back to back from ``start_at`` (``time.time()``) for ``duration_s`` (at
        least one); returns their latencies, and the seconds from the start to the last."""
        time.sleep(max(0.0, start_at - time.time()))
        start = time.perf_counter()
        latencies = run_until(self._targets[key][0], start + duration_s)
        return latencies, time.perf_counter() - start

    @errors_reach_the_driver
    def open_loop(
        self, key: str, start_at: float, due: np.ndarray, threads: int, give_up_s: float
    ) -> OpenLoop:
        """Requests at ``start_at`` (``time.time()``) plus each of ``due``: see
        :func:`run_open_loop`."""
        time.sleep(max(0.0, start_at - time.time()))
        return run_open_loop(self._targets[key][0], due, time.perf_counter(), threads, give_up_s)

    @errors_reach_the_driver
    def add_stream(
        self,
        key: str,
        backend: Backend,
        arg: Any,
        case: ModelCase,
        requests: tuple[StreamRequest, ...],
    ) -> int:
        """Streams ``requests`` in turn as ``key`` through ``backend`` (:func:`connect_stream`),
        every response checked; binds, connects, warms up (a stream). Returns this process's
        id."""
        open_stream, close = connect_stream(backend, arg, case)

        def stream(index: int) -> StreamTimes:
            request = requests[index % len(requests)]
            return time_stream(open_stream(request.inputs), request)

        self._targets[key] = (lambda: {}), close
        self._streams[key] = stream
        stream(0)
        return os.getpid()

    @errors_reach_the_driver
    def stream_once(self, key: str) -> StreamTimes:
        """One stream, every response checked: its times."""
        return self._streams[key](0)

    @errors_reach_the_driver
    def stream_loop(self, key: str, start_at: float, duration_s: float) -> StreamSlice:
        """Streams back to back from ``start_at`` (``time.time()``) for ``duration_s`` (at
        least one), each timed and checked (:func:`~.._load.run_streams_until`)."""
        time.sleep(max(0.0, start_at - time.time()))
        return run_streams_until(self._streams[key], time.perf_counter() + duration_s)

    def remove(self, key: str) -> None:
        """Forgets ``key``, closing what it held."""
        self._streams.pop(key, None)
        self._checked.pop(key, None)
        self._targets.pop(key, (None, lambda: None))[1]()


class ChurnCaller:
    """A caller process of the churn runs: ``ShmModel`` on inputs of its own, every answer
    checked against plain gRPC's answer to them. What it completed can be taken while it runs
    (it may be killed at any time)."""

    def __init__(self) -> None:
        self._lock, self._ready = threading.Lock(), threading.Event()
        self._call: Callable[[], Mapping[str, np.ndarray]] | None = None
        self._close: Callable[[], None] = lambda: None
        self._reference: dict[str, np.ndarray] = {}
        self._latencies: list[float] = []
        self._wrong = 0

    @errors_reach_the_driver
    def start(self, case: ModelCase, url: str, slots: int, inputs: Any) -> int:
        """Sends ``inputs`` (or those of that seed, an ``int``) through ``ShmModel``; binds,
        connects, warms up. Returns this process's id."""
        try:
            if isinstance(inputs, int):
                inputs = case.make_inputs(seed=inputs)
            grpc_call, grpc_close = connect(Backend.GRPC, url, case)
            try:
                self._reference = {name: np.array(a) for name, a in grpc_call(inputs).items()}
            finally:
                grpc_close()
            call, self._close = connect(Backend.SHM_MODEL, slots, case)
            self._call = lambda: call(inputs)
            self.once()
        finally:
            self._ready.set()  # a loop waiting for it returns, if it failed
        return os.getpid()

    @errors_reach_the_driver
    def once(self) -> dict[str, np.ndarray]:
        """One request; returns its outputs, checked (``AssertionError`` if wrong)."""
        assert self._call is not None
        answer = dict(self._call())
        check_outputs(answer, self._reference)
        return answer

    @errors_reach_the_driver
    def loop(self, end_at: float) -> tuple[list[float], int, float | None]:
        """Requests back to back until ``end_at`` (``time.time()``), once started; returns what
        :meth:`take` would, and when the last one completed (``None``: none did)."""
        self._ready.wait()
        last = None
        while self._call is not None and time.time() < end_at:
            sent = time.perf_counter()
            answer = self._call()
            latency = time.perf_counter() - sent
            try:
                check_outputs(answer, self._reference)
                wrong = 0
            except AssertionError:
                wrong = 1
            with self._lock:
                self._latencies.append(latency)
                self._wrong += wrong
            last = time.time()
        return (*self.take(), last)

    def take(self) -> tuple[list[float], int]:
        """The latencies of the requests completed since the last take, and how many of their
        answers were wrong."""
        with self._lock:
            taken = self._latencies, self._wrong
            self._latencies, self._wrong = [], 0
        return taken

    def close(self) -> None:
        """Closes its ``ShmModel``."""
        self._close()


class BenchReplica:
    """The bench's Serve deployment: one replica for every backend, so that the Serve paths
    differ only in it. Each backend is a method named after its :class:`~._clients.Backend`:
    ``grpc`` (``tritonclient.grpc.aio``), ``shm`` (``ShmModel``: the node's slots, straight
    to Triton) and ``inproc`` (a ``TritonSHMClient`` of the replica's own). It serves the case
    last :meth:`prepare` got."""

    def __init__(self, url: str, slots: int) -> None:
        self._url, self._slots = url, slots
        self._case: ModelCase | None = None
        self._clients: dict[Backend | str, Any] = {}

    def prepare(self, case: ModelCase | None) -> int:
        """Serves ``case`` from now on (``None``: nothing); returns the replica's pid."""
        if case != self._case:
            for client in self._clients.values():
                with contextlib.suppress(Exception):
                    client.close()
            self._case, self._clients = case, {}
        return os.getpid()

    def _client(self, backend: Backend | str) -> tuple[ModelCase, Any]:
        """The case, and the backend's client (made on first use, on the replica's loop);
        :data:`STREAM_GRPC`: tritonclient's streaming client."""
        case = self._case
        assert case is not None
        client = self._clients.get(backend)
        if client is None and backend == STREAM_GRPC:
            client = GrpcStreamerAsync(self._url)
        elif client is None and backend in _SHM_MODELS:
            batching = backend == Backend.SHM_MODEL_NB
            options = shm_model_options(case, self._slots, node_batching=batching)
            client = ShmModel(case.model, **options)
        elif client is None and backend == Backend.SHM_CLIENT:
            client, _ = shm_client(
                self._url, case, self._slots, reconnect_timeout_s=reconnect_timeout_s()
            )
        elif client is None:
            client = tritonclient_for(self._url, aio=True)
        self._clients[backend] = client
        return case, client

    def transport(self, backend: Backend) -> dict[str, str]:
        """How ``backend``'s client (one of the library's) reaches Triton: ``transport``
        (``"shm"``, or ``"inline"`` by value) and ``transport_reason``."""
        case, client = self._client(backend)
        stats = client.shm_stats() if backend in _SHM_MODELS else client.shm_stats(case.model)
        return {"transport": stats.transport, "transport_reason": stats.transport_reason}

    @errors_reach_the_driver
    async def shm(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request through ``ShmModel``."""
        _, client = self._client(_SHM_MODEL)
        return await client.infer_async(inputs)  # type: ignore[no-any-return]

    @errors_reach_the_driver
    async def shm_nb(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request through ``ShmModel`` with node batching."""
        _, client = self._client(_SHM_MODEL_NB)
        return await client.infer_async(inputs)  # type: ignore[no-any-return]

    @errors_reach_the_driver
    async def inproc(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request through the replica's own ``TritonSHMClient``."""
        case, client = self._client(_SHM_CLIENT)
        return await client.infer_shm_async(case.model, inputs)  # type: ignore[no-any-return]

    @errors_reach_the_driver
    async def grpc(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request through ``tritonclient.grpc.aio``."""
        import tritonclient.grpc.aio as grpcclient

        case, client = self._client(_GRPC)
        names = [t.name for t in case.outputs]
        infer_inputs, outputs = by_value(grpcclient, inputs, names)
        result = await client.infer(case.model, infer_inputs, outputs=outputs)
        return {name: result.as_numpy(name) for name in names}

    @errors_reach_the_driver
    async def stream_shm(self, inputs: Mapping[str, np.ndarray]) -> AsyncIterator[dict[str, Any]]:
        """One stream through ``ShmModel.stream_async``: each response's outputs, as they
        come (to a streaming handle)."""
        _, client = self._client(_SHM_MODEL)
        async for response in client.stream_async(inputs):
            yield dict(response)

    @errors_reach_the_driver
    async def stream_grpc(self, inputs: Mapping[str, np.ndarray]) -> AsyncIterator[dict[str, Any]]:
        """One stream through tritonclient's streaming client, by value."""
        case, client = self._client(STREAM_GRPC)
        async for response in client.stream(case, inputs):
            yield response


class Predictor:
    """The Ray Data job's predictor, timed, by its ``backend``: ``ShmPredictor``
    (:attr:`~Backend.SHM_MODEL`, ``arg``: its arguments), plain gRPC (:attr:`~Backend.GRPC`,
    ``arg``: the URL) or none (:attr:`~Backend.NOOP`, ``arg``: the outputs to answer,
    computed before)."""

    def __init__(self, backend: Backend, arg: Any, case: ModelCase) -> None:
        if backend == Backend.SHM_MODEL:
            self._predict: _Call = ShmPredictor(**arg)
        elif backend == Backend.GRPC:
            self._predict, _ = connect(Backend.GRPC, arg, case)
        else:
            self._predict = lambda batch: {
                name: array[: len(next(iter(batch.values())))] for name, array in arg.items()
            }

    @errors_reach_the_driver
    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        out = dict(self._predict({n: a for n, a in batch.items() if n != "id"}))
        latency = np.full(len(batch["id"]), np.nan)
        latency[0] = time.perf_counter() - start
        return {**out, LATENCY: latency}
