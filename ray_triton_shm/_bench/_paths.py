"""The ways of getting a request to Triton that the benchmark compares, without Ray.

Each way is a :class:`BenchPath`: ``setup()`` once per model, ``run_once()`` for one request
carrying one full batch (returning the outputs as arrays the caller may keep), and
``teardown()``, which must be safe after a partial ``setup()`` and must never raise.
:data:`PATHS` lists them; the Ray paths are in :mod:`~ray_triton_shm._bench._ray_paths`.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from ray_triton_shm._bench._cases import ModelCase

__all__ = [
    "PATHS",
    "SHM_KEY_PREFIX",
    "BenchPath",
    "BenchTarget",
    "GrpcPath",
    "HttpPath",
    "MemcpyFloorPath",
    "ShmClientPath",
    "ShmManualPath",
    "check_outputs",
]

#: Prefix of the shared-memory keys and region names the hand-written shm path creates
#: (followed by the process id).
SHM_KEY_PREFIX = "rtsbench_"


class SkipPath(Exception):
    """Raised by ``BenchPath.setup`` when the path cannot run here (e.g. no HTTP endpoint).

    Control flow inside the bench, like ``unittest.SkipTest``: the runner records the path
    as skipped with this message, and it never leaves the bench.
    """


class OutputMismatch(AssertionError):
    """A path's outputs differ from the plain gRPC reference (the path then fails)."""


def check_outputs(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> None:
    """Check a path's outputs against the reference.

    Raises:
        OutputMismatch: Saying which output differs and how.
    """
    for name, expected in reference.items():
        got = outputs.get(name)
        if got is None:
            raise OutputMismatch(f"output {name} missing (got {sorted(outputs)})")
        got = np.asarray(got)
        if got.shape != expected.shape or got.dtype != expected.dtype:
            raise OutputMismatch(
                f"output {name}: got {got.shape} {got.dtype}, "
                f"expected {expected.shape} {expected.dtype}"
            )
        if not np.array_equal(got, expected, equal_nan=np.issubdtype(expected.dtype, np.floating)):
            raise OutputMismatch(f"output {name}: values differ from the gRPC reference")


@dataclasses.dataclass(frozen=True)
class BenchTarget:
    """The server being benchmarked.

    Attributes:
        grpc_url: gRPC endpoint, ``"host:port"``.
        http_url: HTTP endpoint, ``"host:port"``; ``None`` if unknown (the HTTP path is
            then skipped).
    """

    grpc_url: str
    http_url: str | None = None


class BenchPath(abc.ABC):
    """One way of sending a request.

    Args:
        target: The server.
        case: The workload.
        inputs: One request's inputs (the same arrays for every request).
        reference: The expected outputs for ``inputs`` (from a plain gRPC request).
    """

    #: The path's name (``--paths``, tables, the JSON output).
    name: ClassVar[str]
    #: Human-readable description for tables and plots.
    label: ClassVar[str]

    def __init__(
        self,
        *,
        target: BenchTarget,
        case: ModelCase,
        inputs: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray],
    ) -> None:
        self.target = target
        self.case = case
        self.inputs = dict(inputs)
        self.reference = dict(reference)

    @abc.abstractmethod
    def setup(self) -> None:
        """Prepare (connect, create and register regions, ...).

        Raises:
            SkipPath: If the path cannot run here (it is skipped).
        """

    @abc.abstractmethod
    def run_once(self) -> Mapping[str, np.ndarray]:
        """Send one request and return its outputs by name."""

    @abc.abstractmethod
    def teardown(self) -> None:
        """Release everything ``setup`` acquired; never raises."""

    def _close_client(self) -> None:
        """Closes the ``_client`` that ``setup`` made, if any; never raises."""
        client = getattr(self, "_client", None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
            setattr(self, "_client", None)  # noqa: B010  # subclasses type _client their way

    def run_slice(self, slice_s: float) -> int:
        """Send requests for about ``slice_s`` (at least one); returns how many completed.

        Paths with concurrent callers override this (each caller runs the whole slice).
        """
        requests = 0
        run_once = self.run_once
        deadline = time.perf_counter() + slice_s
        while True:
            run_once()
            requests += 1
            if time.perf_counter() >= deadline:
                return requests

    def cpu_time(self) -> float:
        """CPU seconds used so far by the processes doing this path's client work."""
        return time.process_time()

    def side_cpu_time(self) -> float | None:
        """CPU seconds used so far by the Ray node actor, for paths that use one."""
        return None


def _requested_nbytes(case: ModelCase, name: str, specs: Mapping[str, Any]) -> int:
    spec = specs[name]
    if spec.is_bytes:  # serialized: a 4-byte length before each element
        return int(np.prod(case.batched_shape(spec))) * (4 + case.element_bytes)
    return int(np.prod(case.batched_shape(spec))) * np.dtype(spec.dtype).itemsize


# --------------------------------------------------------------------------------------
# (a) plain gRPC
# --------------------------------------------------------------------------------------


class GrpcPath(BenchPath):
    """``tritonclient.grpc``: ``InferInput.set_data_from_numpy`` and ``as_numpy``."""

    name = "grpc"
    label = "gRPC"

    def setup(self) -> None:
        import tritonclient.grpc as grpcclient

        self._client = grpcclient.InferenceServerClient(self.target.grpc_url)

    def run_once(self) -> Mapping[str, np.ndarray]:
        infer_inputs, outputs = grpc_request(self.inputs, self.case.outputs)
        result = self._client.infer(self.case.model, infer_inputs, outputs=outputs)
        return {name: result.as_numpy(name) for name in self.case.outputs}

    def teardown(self) -> None:
        self._close_client()


# --------------------------------------------------------------------------------------
# (b) plain HTTP with binary tensors
# --------------------------------------------------------------------------------------


class HttpPath(BenchPath):
    """``tritonclient.http`` with ``binary_data=True`` for inputs and outputs."""

    name = "http"
    label = "HTTP (binary)"

    def setup(self) -> None:
        if self.target.http_url is None:
            raise SkipPath("no HTTP endpoint given (--http-url)")
        try:
            import tritonclient.http as httpclient
        except ImportError as exc:
            raise SkipPath(
                f"tritonclient[http] is not installed ({exc}); pip install 'ray-triton-shm[bench]'"
            ) from exc
        self._http = httpclient
        self._client = httpclient.InferenceServerClient(
            self.target.http_url, connection_timeout=60.0, network_timeout=120.0
        )

    def run_once(self) -> Mapping[str, np.ndarray]:
        httpclient = self._http
        infer_inputs = []
        for name, array in self.inputs.items():
            infer_input = httpclient.InferInput(
                name, list(array.shape), self.case.inputs[name].triton_datatype
            )
            infer_input.set_data_from_numpy(array, binary_data=True)
            infer_inputs.append(infer_input)
        outputs = [
            httpclient.InferRequestedOutput(name, binary_data=True) for name in self.case.outputs
        ]
        result = self._client.infer(self.case.model, infer_inputs, outputs=outputs)
        return {name: result.as_numpy(name) for name in self.case.outputs}

    def teardown(self) -> None:
        self._close_client()


# --------------------------------------------------------------------------------------
# (c) tritonclient's shared-memory utilities, used by hand as the docs show
# --------------------------------------------------------------------------------------


class ShmManualPath(BenchPath):
    """``tritonclient.utils.shared_memory`` by hand, as in Triton's ``simple_grpc_shm_client``.

    One region per tensor, created and registered once; per request the inputs are copied
    in with ``set_shared_memory_region``, and each output is read with
    ``get_contents_as_numpy`` and copied out (the region is reused by the next request).
    """

    name = "shm-manual"
    label = "gRPC + shm utils by hand"

    def setup(self) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.utils.shared_memory as shm
        from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

        self._serialize = serialize_byte_tensor
        self._np_dtype = triton_to_np_dtype
        self._grpc = grpcclient
        self._shm = shm
        self._handles: dict[str, Any] = {}
        self._registered: list[str] = []
        self._region_of: dict[str, tuple[str, int]] = {}
        self._client = grpcclient.InferenceServerClient(self.target.grpc_url)
        tag = f"{SHM_KEY_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
        tensors = [
            ("in", n, _requested_nbytes(self.case, n, self.case.inputs)) for n in self.case.inputs
        ]
        tensors += [
            ("out", n, _requested_nbytes(self.case, n, self.case.outputs))
            for n in self.case.outputs
        ]
        for kind, tensor, nbytes in tensors:
            region = f"{tag}_{kind}_{tensor}"
            self._handles[f"{kind}:{tensor}"] = shm.create_shared_memory_region(
                region, "/" + region, nbytes, create_only=True
            )
            self._client.register_system_shared_memory(region, "/" + region, nbytes)
            self._registered.append(region)
            self._region_of[f"{kind}:{tensor}"] = (region, nbytes)

    def run_once(self) -> Mapping[str, np.ndarray]:
        grpcclient, shm = self._grpc, self._shm
        infer_inputs = []
        for name, array in self.inputs.items():
            handle = self._handles[f"in:{name}"]
            region, _ = self._region_of[f"in:{name}"]
            if self.case.inputs[name].is_bytes:
                serialized = self._serialize(array)
                shm.set_shared_memory_region(handle, [serialized])
                nbytes = len(serialized.item())
            else:
                shm.set_shared_memory_region(handle, [array])
                nbytes = array.nbytes
            infer_input = grpcclient.InferInput(
                name, list(array.shape), self.case.inputs[name].triton_datatype
            )
            infer_input.set_shared_memory(region, nbytes)
            infer_inputs.append(infer_input)
        outputs = []
        for name in self.case.outputs:
            region, nbytes = self._region_of[f"out:{name}"]
            requested = grpcclient.InferRequestedOutput(name)
            requested.set_shared_memory(region, nbytes)
            outputs.append(requested)
        result = self._client.infer(self.case.model, infer_inputs, outputs=outputs)
        arrays: dict[str, np.ndarray] = {}
        for name in self.case.outputs:
            output = result.get_output(name)
            view = shm.get_contents_as_numpy(
                self._handles[f"out:{name}"],
                self._np_dtype(output.datatype),
                list(output.shape),
            )
            arrays[name] = view.copy()
        return arrays

    def teardown(self) -> None:
        client = getattr(self, "_client", None)
        for region in reversed(getattr(self, "_registered", [])):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.unregister_system_shared_memory(region)
        self._registered = []
        for handle in getattr(self, "_handles", {}).values():
            with contextlib.suppress(Exception):
                self._shm.destroy_shared_memory_region(handle)
        self._handles = {}
        self._close_client()


# --------------------------------------------------------------------------------------
# (d) this library
# --------------------------------------------------------------------------------------


class ShmClientPath(BenchPath):
    """``TritonSHMClient.infer_shm``: one full batch per call."""

    name = "shm-client"
    label = "TritonSHMClient.infer_shm"

    def setup(self) -> None:
        from ray_triton_shm._client import TritonSHMClient

        self._client: TritonSHMClient | None = TritonSHMClient(self.target.grpc_url)
        self._client.register_shm_model(
            self.case.model,
            max_batch_size=self.case.batch_size,
            max_shapes=dict(self.case.max_shapes) if self.case.max_shapes else None,
            max_element_bytes=self.case.max_element_bytes,
        )

    def run_once(self) -> Mapping[str, np.ndarray]:
        assert self._client is not None
        return self._client.infer_shm(self.case.model, self.inputs)

    def teardown(self) -> None:
        self._close_client()


# --------------------------------------------------------------------------------------
# (e) the floor: copying the bytes, no server
# --------------------------------------------------------------------------------------


class MemcpyFloorPath(BenchPath):
    """Copy the input bytes into, and the output bytes out of, preallocated buffers.

    The least any shared-memory client must do per request; its CPU time per GB is the
    floor the shm client is measured against.
    """

    name = "memcpy"
    label = "memcpy floor"

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

    def teardown(self) -> None:
        self._in_bufs = {}
        self._out_src = {}
        self._out_bufs = {}


#: The paths without Ray, in table order (their names are ``_config.DEFAULT_PATHS``).
PATHS: tuple[type[BenchPath], ...] = (
    GrpcPath,
    HttpPath,
    ShmManualPath,
    ShmClientPath,
    MemcpyFloorPath,
)


def grpc_request(
    inputs: Mapping[str, np.ndarray], outputs: Iterable[str]
) -> tuple[list[Any], list[Any]]:
    """tritonclient's by-value inputs and requested outputs for one gRPC request: the gRPC
    path's, the reference request's and the Ray gRPC callers' (sync and aio share them)."""
    import tritonclient.grpc as grpcclient  # here: importing the bench must not load it
    from tritonclient.utils import np_to_triton_dtype

    infer_inputs = []
    for name, array in inputs.items():
        infer_input = grpcclient.InferInput(
            name, list(array.shape), np_to_triton_dtype(array.dtype)
        )
        infer_input.set_data_from_numpy(np.ascontiguousarray(array))
        infer_inputs.append(infer_input)
    return infer_inputs, [grpcclient.InferRequestedOutput(name) for name in outputs]
