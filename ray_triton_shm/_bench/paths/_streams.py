"""A streaming (decoupled) model's paths without Ray: the core client's ``stream`` (callers
are threads) and ``stream_async`` (tasks on one event loop), on one ``TritonSHMClient`` whose
pool has a slot per caller (a stream holds its slot until Triton's final response); and
tritonclient's own streaming client, by value, a client (so a gRPC stream) per caller, as
tritonclient allows one stream per client.

Each caller runs one stream at a time on requests of its own (:meth:`~._base.BenchPath.
stream_requests`), and every response of every stream is checked against its own request's
(:class:`~._base.StreamRequest`), so that a response crossing to another stream shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterable, Iterable, Mapping
from typing import Any

import numpy as np

from ray_triton_shm._bench._load import (
    StreamSlice,
    StreamTimes,
    run_stream_loop,
    run_stream_loop_async,
)
from ray_triton_shm._bench.paths._base import (
    BenchPath,
    StreamRequest,
    time_stream,
    time_stream_async,
)
from ray_triton_shm._bench.paths._clients import GrpcStreamer, shm_client

__all__ = ["PATHS", "StreamAsyncPath", "StreamClientPath", "StreamGrpcPath", "StreamPath"]


class StreamPath(BenchPath):
    """A streaming model's path whose callers are threads: :meth:`open` is one stream."""

    streaming = True

    def open(self, caller: int, request: StreamRequest) -> Iterable[Mapping[str, Any]]:
        """The responses of one stream of ``request`` by caller ``caller``."""
        raise NotImplementedError

    def stream_once(self, caller: int, index: int) -> StreamTimes:
        """Stream ``index`` of caller ``caller``, timed and checked."""
        requests = self.stream_requests(caller)
        request = requests[index % len(requests)]
        return time_stream(self.open(caller, request), request)

    def run_once(self) -> Mapping[str, np.ndarray]:
        """One stream by the first caller, every response checked; no outputs to return."""
        self.stream_once(0, 0)
        return {}

    def warm_up(self, seconds: float) -> None:
        """A stream by every caller at once (their clients' first), then ``seconds`` of them."""
        self.run_stream_slice(seconds)

    def run_stream_slice(self, slice_s: float) -> StreamSlice:
        return run_stream_loop(self.stream_once, self.concurrency, slice_s)


class StreamClientPath(StreamPath):
    """``TritonSHMClient.stream``: one client with a slot per caller, shared by the callers
    (threads)."""

    name, label = "stream-client", "TritonSHMClient.stream"

    def setup(self) -> None:
        self._client, _ = shm_client(
            self.target.grpc_url,
            self.case,
            self.slots,
            reconnect_timeout_s=self.target.reconnect_timeout_s,
        )

    def open(self, caller: int, request: StreamRequest) -> Iterable[Mapping[str, Any]]:
        return self._client.stream(self.case.model, request.inputs)  # type: ignore[no-any-return]

    def stats(self) -> dict[str, Any]:
        """How its pool reached Triton (``transport``: ``"shm"``, or ``"inline"`` by value, and
        ``transport_reason``) and the ``/dev/shm`` it takes (``shm_bytes``)."""
        stats = self._client.shm_stats(self.case.model)
        return {
            "transport": stats.transport,
            "transport_reason": stats.transport_reason,
            "shm_bytes": stats.shm_bytes,
        }


class StreamAsyncPath(StreamClientPath):
    """``TritonSHMClient.stream_async``: the same client, its callers tasks on one event loop
    (of a thread of its own, running between the slices too)."""

    name, label = "stream-async", "TritonSHMClient.stream_async"
    _loop: asyncio.AbstractEventLoop | None = None

    def setup(self) -> None:
        super().setup()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="bench-stream-async", daemon=True
        )
        self._thread.start()

    def open_async(self, request: StreamRequest) -> AsyncIterable[Mapping[str, Any]]:
        """The responses of one stream of ``request``."""
        return self._client.stream_async(self.case.model, request.inputs)  # type: ignore[no-any-return]

    async def _stream_once(self, caller: int, index: int) -> StreamTimes:
        requests = self.stream_requests(caller)
        request = requests[index % len(requests)]
        return await time_stream_async(self.open_async(request), request)

    def stream_once(self, caller: int, index: int) -> StreamTimes:
        assert self._loop is not None
        running = asyncio.run_coroutine_threadsafe(self._stream_once(caller, index), self._loop)
        return running.result()

    def run_stream_slice(self, slice_s: float) -> StreamSlice:
        assert self._loop is not None
        loop = run_stream_loop_async(self._stream_once, self.concurrency, slice_s)
        return asyncio.run_coroutine_threadsafe(loop, self._loop).result()

    def teardown(self) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(Exception):
                loop.call_soon_threadsafe(loop.stop)
                self._thread.join(timeout=30)
                loop.close()
            self._loop = None
        super().teardown()


class StreamGrpcPath(StreamPath):
    """tritonclient's streaming client (``start_stream``, ``async_stream_infer``), inputs by
    value: a client, so a gRPC stream, per caller (:class:`~._clients.GrpcStreamer`)."""

    name, label = "stream-grpc", "tritonclient streaming (a client per caller)"
    _streamers: list[GrpcStreamer] = []

    def setup(self) -> None:
        self._streamers = []
        for _ in range(self.concurrency):
            self._streamers.append(GrpcStreamer(self.target.grpc_url))

    def open(self, caller: int, request: StreamRequest) -> Iterable[Mapping[str, Any]]:
        return self._streamers[caller].stream(self.case, request.inputs)

    def teardown(self) -> None:
        for streamer in self._streamers:
            with contextlib.suppress(Exception):
                streamer.close()
        self._streamers = []


#: The streaming paths without Ray but perf_analyzer's, in table order (see
#: ``_config.STREAM_PATHS``).
PATHS: tuple[type[StreamPath], ...] = (StreamClientPath, StreamAsyncPath, StreamGrpcPath)
