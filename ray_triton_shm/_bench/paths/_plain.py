"""The paths without shared memory, and without Ray: plain gRPC and HTTP by value, and the
floor of any shared-memory client's CPU (a copy in and out). Their callers are threads."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ray_triton_shm._bench.paths._base import BenchPath, SkipPath
from ray_triton_shm._bench.paths._clients import infer
from ray_triton_shm._wire._plain_client import tritonclient_for

__all__ = ["PATHS", "GrpcPath", "HttpPath", "MemcpyFloorPath"]


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


#: The plain paths, in table order (see ``_config.DEFAULT_PATHS``).
PATHS: tuple[type[BenchPath], ...] = (GrpcPath, HttpPath, MemcpyFloorPath)
