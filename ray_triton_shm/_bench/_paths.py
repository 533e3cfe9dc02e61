"""The ways of getting a request to Triton that the benchmark compares, without Ray: each a
:class:`BenchPath`, whose callers are threads here (processes in :mod:`._ray_paths`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._config import ELASTIC
from ray_triton_shm._client import TritonSHMClient
from ray_triton_shm._defaults import DEFAULT_RECONNECT_TIMEOUT_S
from ray_triton_shm._keys import Keys
from ray_triton_shm._plain_client import tritonclient_for
from ray_triton_shm._specs import SlotLayout

__all__ = ["PATHS", "SHM_KEY_PREFIX", "BenchPath", "BenchTarget", "OpenLoop", "SkipPath", "infer"]
__all__ += ["SliceSummary", "arrival_times", "run_open_loop", "run_until"]

#: Prefix of the shared-memory keys and region names the hand-written shm path creates
#: (followed by the process id).
SHM_KEY_PREFIX = "rtsbench_"


class SkipPath(Exception):
    """Raised by ``BenchPath.setup`` when the path cannot run here (e.g. no HTTP endpoint):
    like ``unittest.SkipTest``, the runner records why, and it never leaves the bench."""


def check_outputs(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> None:
    """Raises ``AssertionError``, saying how, if the outputs are not the reference's."""
    for name, expected in reference.items():
        got = _on_host(outputs.get(name))  # a missing output: shape (), dtype object
        if got.shape != expected.shape or got.dtype != expected.dtype:
            wanted = f"{expected.shape} {expected.dtype}"
            raise AssertionError(f"output {name}: got {got.shape} {got.dtype}, not {wanted}")
        if not np.array_equal(got, expected, equal_nan=np.issubdtype(expected.dtype, np.floating)):
            raise AssertionError(f"output {name}: values differ from the gRPC reference")


def _on_host(value: Any) -> np.ndarray:
    """An output as a NumPy array: a GPU tensor (torch, cupy) is copied to the host."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "cpu"):  # torch
        return np.asarray(value.cpu().numpy())
    if hasattr(value, "get"):  # cupy
        return np.asarray(value.get())
    return np.asarray(value)


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


def run_until(call: Callable[[], Any], deadline: float) -> np.ndarray:
    """Calls ``call`` back to back until ``deadline`` (``time.perf_counter()``; at least
    once); returns the latency of each call in seconds."""
    clock = time.perf_counter
    latencies = []
    while True:
        sent = clock()
        call()
        done = clock()
        latencies.append(done - sent)
        if done >= deadline:
            return np.array(latencies)


def arrival_times(rate: float, duration_s: float, arrivals: str, seed: int) -> np.ndarray:
    """When each request of an open loop at ``rate`` requests per second is due, in seconds
    from its start, over ``duration_s``: evenly spaced (``"constant"``) or with exponential
    gaps (``"poisson"``, from ``seed``); at least one."""
    count = max(1, round(rate * duration_s))
    if arrivals == "constant":
        return np.arange(count) / rate
    gaps = np.random.default_rng(seed).exponential(1 / rate, size=2 * count + 16)
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    return times[times < duration_s] if count > 1 else times[:1]


@dataclasses.dataclass
class OpenLoop:
    """One slice of an open loop: each request's latency in seconds, from when it was due
    (not when it went out: a request waiting for a free thread counts its wait, so a server
    that falls behind cannot hide its queue), in the order they were due; the requests
    ``dropped`` (still unsent when the slice gave up on them); the seconds from the start to
    the last answer; and the median latency of the first quarter of the requests, before any
    queue could build up (``first_s``)."""

    latencies: np.ndarray
    dropped: int
    wall_s: float
    first_s: float


def run_open_loop(
    call: Callable[[], Any], due: np.ndarray, start: float, threads: int, give_up_s: float
) -> OpenLoop:
    """Sends ``call`` at ``start + due[i]`` (``time.perf_counter()``) each, up to ``threads``
    at once; a request still unsent ``give_up_s`` after the last is due is dropped."""
    clock, order, lock = time.perf_counter, iter(range(len(due))), threading.Lock()
    give_up_at = start + float(due[-1]) + give_up_s
    latencies = np.full(len(due), np.nan)

    def worker() -> float:
        last = start
        while True:
            with lock:
                index = next(order, None)
            if index is None:
                return last
            when = start + float(due[index])
            now = clock()
            if now < when:
                time.sleep(when - now)
            elif now > give_up_at:
                continue  # dropped: its latency stays NaN
            call()
            last = clock()
            latencies[index] = last - when

    count = min(threads, len(due))
    with ThreadPoolExecutor(count) as pool:
        lasts = [future.result() for future in [pool.submit(worker) for _ in range(count)]]
    answered = latencies[~np.isnan(latencies)]
    first = answered[: max(1, len(answered) // 4)]
    return OpenLoop(
        answered,
        len(due) - len(answered),
        max(lasts) - start,
        float(np.median(first)) if len(first) else 0.0,
    )


@dataclasses.dataclass(frozen=True)
class SliceSummary:
    """A slice that a load generator of its own timed (perf_analyzer), not request by request
    here: the requests it completed in its measurement windows, their seconds, and the
    percentiles of their latency (``"p50"``, ``"p90"``, ``"p99"``, in ms)."""

    requests: int
    wall_s: float
    latency_ms: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class BenchTarget:
    """The server being benchmarked: its gRPC and HTTP (``None``: unknown, the HTTP path is
    then skipped) endpoints, ``"host:port"``, its process (group) when it runs here, and how
    long the paths' requests wait for it while it is unreachable."""

    grpc_url: str
    http_url: str | None = None
    server_pid: int | None = None
    reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S


class BenchPath:
    """One way of sending the ``inputs`` of ``case`` to the ``target``, by ``concurrency``
    callers at once (on ``slots`` slots, for the shm paths: default one per caller,
    :data:`~._config.ELASTIC` a pool that follows its load); its outputs must be the
    ``reference`` (a plain gRPC request's). The Ray paths get the run's Ray ``session``."""

    #: The path's name (``--paths``, tables, the JSON output).
    name: ClassVar[str]
    #: What it is, in a few words.
    label: ClassVar[str]
    #: Whether the path uses the Ray node actor (which then starts afresh for its runs).
    uses_node_actor: ClassVar[bool] = False
    #: Its slices last this many ``--slice-s`` (for requests of hundreds of ms under load).
    slice_factor: ClassVar[float] = 1.0
    #: Its runs take part in at most this many rounds (``None``: all of them).
    max_rounds: ClassVar[int | None] = None
    #: Why its answers are not checked against the reference (``None``: its first one is,
    #: before its numbers count), as the reports say it.
    unchecked: ClassVar[str | None] = None
    _client: Any = None

    def __init__(
        self,
        *,
        target: BenchTarget,
        case: ModelCase,
        inputs: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray],
        concurrency: int = 1,
        slots: int | None = None,
        session: Any = None,
    ) -> None:
        self.target, self.case, self.session = target, case, session
        self.inputs, self.reference = dict(inputs), dict(reference)
        self.concurrency = concurrency
        self.slots = concurrency if slots is None else slots

    def setup(self) -> None:
        """Connects, creates and registers regions...; raises ``SkipPath`` if it cannot here."""
        raise NotImplementedError

    def run_once(self) -> Mapping[str, np.ndarray]:
        """Sends one request; returns its outputs by name (arrays the caller may keep)."""
        raise NotImplementedError

    def warm_up(self, seconds: float) -> None:
        """Load for ``seconds`` (a slice, untimed; ``0``: none) once the runs of its group are
        set up, before the rounds."""
        if seconds > 0:
            self.run_slice(seconds)

    def teardown(self) -> None:
        """Releases what ``setup`` acquired, even in part (here: ``_client``); never raises."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def run_slice(self, slice_s: float) -> tuple[list[np.ndarray], float]:
        """Every caller sends requests back to back for about ``slice_s`` (at least one);
        returns each caller's request latencies in seconds, and the slice's wall time."""
        start = time.perf_counter()
        if self.concurrency == 1:
            return [run_until(self.run_once, start + slice_s)], time.perf_counter() - start
        with ThreadPoolExecutor(self.concurrency) as threads:
            deadlines = [time.perf_counter() + slice_s] * self.concurrency
            latencies = list(threads.map(run_until, [self.run_once] * self.concurrency, deadlines))
        return latencies, time.perf_counter() - start

    def run_rate(self, due: np.ndarray, threads: int, give_up_s: float) -> OpenLoop:
        """An open loop (:func:`run_open_loop`) of :meth:`run_once`, from now on."""
        return run_open_loop(self.run_once, due, time.perf_counter(), threads, give_up_s)

    def cpu_time(self) -> float:
        """CPU seconds used so far by the processes doing this path's client work."""
        return time.process_time()

    def side_cpu_time(self) -> float | None:
        """CPU seconds used so far by the Ray node actor, for paths that use one."""
        return None

    def stats(self) -> dict[str, Any]:
        """Numbers of the path's own for its run, read after the rounds."""
        return {}


class GrpcPath(BenchPath):
    """``tritonclient.grpc``: ``InferInput.set_data_from_numpy`` and ``as_numpy``; one client
    shared by the callers (threads)."""

    name, label = "grpc", "gRPC"

    def setup(self) -> None:
        self._client = tritonclient_for(self.target.grpc_url)

    def run_once(self) -> Mapping[str, np.ndarray]:
        return infer(self._client, self.case, self.inputs)


class HttpPath(BenchPath):
    """``tritonclient.http`` with ``binary_data=True`` for inputs and outputs (one caller)."""

    name, label = "http", "HTTP (binary)"

    def setup(self) -> None:
        if self.target.http_url is None:
            raise SkipPath("no HTTP endpoint given: pass Triton's as --http-url HOST:PORT")
        import tritonclient.http as httpclient  # in the bench extra, with rich

        self._http = httpclient
        self._client = httpclient.InferenceServerClient(
            self.target.http_url, connection_timeout=60.0, network_timeout=120.0
        )

    def run_once(self) -> Mapping[str, np.ndarray]:
        return infer(self._client, self.case, self.inputs, self._http, binary_data=True)


class ShmManualPath(BenchPath):
    """``tritonclient.utils.shared_memory`` by hand, as in Triton's ``simple_grpc_shm_client``
    (one caller): a region per tensor, registered once; per request the inputs are copied in
    (``set_shared_memory_region``), the outputs read (``get_contents_as_numpy``) and copied out."""

    name, label = "shm-manual", "gRPC + shm utils by hand"

    def setup(self) -> None:
        #: "in:NAME" / "out:NAME" -> (handle, region name, bytes), registered in this order.
        self._regions: dict[str, tuple[Any, str, int]] = {}
        self._client = tritonclient_for(self.target.grpc_url)
        tag = f"{SHM_KEY_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
        for kind, tensors in (("in", self.case.inputs), ("out", self.case.outputs)):
            for t in tensors:
                region = f"{tag}_{kind}_{t.name}"
                # Serialized BYTES: a 4-byte length before each element.
                size = 4 + t.max_element_bytes if t.is_bytes else t.dtype.itemsize
                nbytes = math.prod(self.case.request_shape(t)) * size
                handle = shm.create_shared_memory_region(
                    region, "/" + region, nbytes, create_only=True
                )
                self._regions[f"{kind}:{t.name}"] = (handle, region, nbytes)
                self._client.register_system_shared_memory(region, "/" + region, nbytes)

    def run_once(self) -> Mapping[str, np.ndarray]:
        infer_inputs, outputs = [], []
        for name, array in self.inputs.items():
            handle, region, _ = self._regions[f"in:{name}"]
            if array.dtype.kind == "O":
                data = serialize_byte_tensor(array)
                nbytes = len(data.item())
            else:
                data, nbytes = array, array.nbytes
            shm.set_shared_memory_region(handle, [data])
            datatype = str(np_to_triton_dtype(array.dtype))
            infer_input = grpcclient.InferInput(name, list(array.shape), datatype)
            infer_input.set_shared_memory(region, nbytes)
            infer_inputs.append(infer_input)
        for t in self.case.outputs:
            _, region, nbytes = self._regions[f"out:{t.name}"]
            outputs.append(grpcclient.InferRequestedOutput(t.name))
            outputs[-1].set_shared_memory(region, nbytes)
        result = self._client.infer(self.case.model, infer_inputs, outputs=outputs)
        arrays: dict[str, np.ndarray] = {}
        for t in self.case.outputs:
            output = result.get_output(t.name)
            handle, _, _ = self._regions[f"out:{t.name}"]
            dtype = triton_to_np_dtype(output.datatype)
            arrays[t.name] = shm.get_contents_as_numpy(handle, dtype, list(output.shape)).copy()
        return arrays

    def teardown(self) -> None:
        for handle, region, _ in reversed(getattr(self, "_regions", {}).values()):
            with contextlib.suppress(Exception):
                self._client.unregister_system_shared_memory(region)
            with contextlib.suppress(Exception):
                shm.destroy_shared_memory_region(handle)
        self._regions = {}
        super().teardown()


class ShmClientPath(BenchPath):
    """``TritonSHMClient.infer_shm``: one client with ``slots`` slots, shared by the callers
    (threads)."""

    name, label = "shm-client", "TritonSHMClient.infer_shm"

    def setup(self) -> None:
        self._client = TritonSHMClient(
            self.target.grpc_url,
            headers=Keys(environ=True),
            reconnect_timeout_s=self.target.reconnect_timeout_s,
        )
        self._spec = self._client.register_shm_model(
            self.case.model, **self.case.registration(self.slots)
        )

    def run_once(self) -> Mapping[str, np.ndarray]:
        return self._client.infer_shm(self.case.model, self.inputs)  # type: ignore[no-any-return]

    def stats(self) -> dict[str, Any]:
        """The ``/dev/shm`` its pool takes (``shm_bytes``; an elastic pool's, at the end)."""
        if self.slots == ELASTIC:
            return {"shm_bytes": self._client.shm_stats(self.case.model).shm_bytes}
        return {"shm_bytes": SlotLayout.for_model(self._spec).region_bytes(self.slots)}


class ShmPreparedPath(ShmClientPath):
    """``TritonSHMClient.infer_shm`` of a batch its caller's preprocessing has just written
    (a copy of the case's inputs into the caller's own arrays, standing for the last write of
    decoding or resizing), which ``infer_shm`` then copies into the slot: the plain path that
    :class:`ShmLeasePath` is compared with, the same work on both sides."""

    name, label = "shm-client-prep", "preprocessing, then infer_shm"

    def setup(self) -> None:
        if self.case.has_bytes:
            raise SkipPath("BYTES tensors have no fixed place in a slot to write into")
        super().setup()
        self._batches = threading.local()  # each caller preprocesses into arrays of its own

    def run_once(self) -> Mapping[str, np.ndarray]:
        batch = getattr(self._batches, "arrays", None)
        if batch is None:
            batch = self._batches.arrays = {n: np.empty_like(a) for n, a in self.inputs.items()}
        for name, array in self.inputs.items():
            np.copyto(batch[name], array)
        return self._client.infer_shm(self.case.model, batch)  # type: ignore[no-any-return]


class ShmLeasePath(ShmClientPath):
    """``TritonSHMClient.lease``: the same preprocessing as :class:`ShmPreparedPath`'s writes
    the batch straight into its slot, and the outputs are read where Triton wrote them."""

    name, label = "shm-lease", "preprocessing into a lease"

    def setup(self) -> None:
        if self.case.has_bytes:
            raise SkipPath("BYTES tensors have no fixed place in a slot to write into")
        super().setup()
        spec = self._spec
        first = next(iter(self.inputs.values()))
        self._batch = len(first) if spec.batched else None
        if self._batch is not None and self._batch > spec.batch_capacity:
            raise SkipPath(
                f"a lease is one request of at most max_batch_size ({spec.batch_capacity}) "
                f"samples, and the batch has {self._batch}"
            )
        cut = 1 if spec.batched else 0
        self._shapes = {name: array.shape[cut:] for name, array in self.inputs.items()}

    def run_once(self) -> Mapping[str, np.ndarray]:
        with self._client.lease(self.case.model, batch=self._batch, shapes=self._shapes) as lease:
            for name, array in self.inputs.items():
                np.copyto(lease.inputs[name], array)
            return lease.infer()  # type: ignore[no-any-return]


class MemcpyFloorPath(BenchPath):
    """Copy the input bytes into, and the output bytes out of, preallocated buffers (one
    caller): the least any shared-memory client must do per request, the floor of its CPU."""

    name, label = "memcpy", "memcpy floor"

    def setup(self) -> None:
        if self.case.has_bytes:
            raise SkipPath("BYTES tensors have no fixed-size bytes to copy")
        self._in_bufs = {n: np.empty_like(a) for n, a in self.inputs.items()}
        self._out_src = {n: np.ascontiguousarray(a).copy() for n, a in self.reference.items()}
        self._out_bufs = {n: np.empty_like(a) for n, a in self._out_src.items()}

    def run_once(self) -> Mapping[str, np.ndarray]:
        for name, array in self.inputs.items():
            np.copyto(self._in_bufs[name], array)
        for name, src in self._out_src.items():
            np.copyto(self._out_bufs[name], src)
        return self._out_bufs


#: The paths without Ray, in table order (their names are ``_config.DEFAULT_PATHS``).
PATHS: tuple[type[BenchPath], ...] = (
    GrpcPath,
    HttpPath,
    ShmManualPath,
    ShmClientPath,
    ShmPreparedPath,
    ShmLeasePath,
    MemcpyFloorPath,
)
