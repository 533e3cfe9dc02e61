"""Triton's gRPC streams (``ModelStreamInfer``), the only way to a streaming (decoupled) model:
one request in, any number of responses out.

A :class:`GrpcStream` carries one request at a time, and is used again, one request after
the other, for as long as it lives: Triton cancels every request of a gRPC stream together, so
a request that its caller gives up is cancelled in Triton by cancelling its stream, which must
then carry no other. :class:`Streams` keeps a client's idle streams, per set of headers (gRPC
sends them once, when a stream opens): concurrent requests, from threads or tasks, each take
one, and a client never needs more than it has requests in flight. Each open stream has a
thread that reads its responses and hands them to the request's :class:`Responses`, which a
blocking caller or a coroutine waits on.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from .._exceptions import ClientClosedError
from ._keys import Metadata

__all__ = [
    "STREAM_METHOD",
    "GrpcStream",
    "Responses",
    "StreamErrorResponse",
    "Streams",
    "is_final",
]

#: Triton's gRPC method of streaming inference.
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"

#: Appended to every request sent on a stream (a protobuf map entry merges into the message):
#: Triton then ends each request with a response of its own flagged final, even one that
#: answers nothing, so that its end is always seen.
_EMPTY_FINAL = service_pb2.ModelInferRequest(
    parameters={"triton_enable_empty_final_response": service_pb2.InferParameter(bool_param=True)}
).SerializeToString()

#: What tells a stream's request iterator that no request follows.
_END = object()
#: The error of a stream asked of closed streams.
_CLOSED = "the TritonSHMClient is closed"


def is_final(response: service_pb2.ModelInferResponse) -> bool:
    """Whether Triton flagged ``response`` as its request's last."""
    flag = response.parameters.get("triton_final_response")
    return flag is not None and flag.bool_param


class StreamErrorResponse(grpc.RpcError):
    """An error Triton sent on a stream, for one request, in gRPC's terms (a stream's errors
    carry a message but no status: that of the unary call that fails alike is guessed).

    Attributes:
        answered: Whether Triton is done with the request (the error was its final response).
    """

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self._message = message
        self.answered = answered
        unknown = "unknown model" in message or "no available versions" in message
        self._code = grpc.StatusCode.NOT_FOUND if unknown else grpc.StatusCode.INTERNAL

    def code(self) -> grpc.StatusCode:
        """gRPC's status code of the unary call that fails alike."""
        return self._code

    def details(self) -> str:
        """Triton's message."""
        return self._message

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_error, (self._message, self.answered)


def _rebuild_error(message: str, answered: bool) -> StreamErrorResponse:
    return StreamErrorResponse(message, answered=answered)


class Responses:
    """The responses of one request on a stream, as they come, for the one caller that waits
    for them: blocking (:meth:`get`) or on its event loop (:meth:`get_async`).

    Each item is a ``ModelStreamInferResponse``, or the ``grpc.RpcError`` that ended the
    stream under it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._items: collections.deque[Any] = collections.deque()
        self._ready = threading.Event() if loop is None else None
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Any) -> None:
        """Hands over one item (from the stream's reading thread)."""
        self._items.append(item)
        if self._loop is None:
            assert self._ready is not None
            self._ready.set()
        else:
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:
                pass  # the caller's loop is closed: nobody waits any more

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get(self, timeout_s: float | None) -> Any:
        """The next item, waited for at most ``timeout_s`` (``None``: no limit).

        Raises:
            TimeoutError: none came in time.
        """
        assert self._ready is not None
        while not self._items:
            if not self._ready.wait(timeout_s):
                raise TimeoutError
            self._ready.clear()
        return self._items.popleft()

    async def get_async(self, timeout_s: float | None) -> Any:
        """:meth:`get` on the event loop."""
        assert self._loop is not None
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError from None
        return self._items.popleft()


class GrpcStream:
    """One ``ModelStreamInfer`` call, carrying one request at a time.

    Args:
        channel: The gRPC channel to Triton.
        metadata: The stream's headers (the keys, the call's own).
    """

    def __init__(self, channel: grpc.Channel, metadata: Metadata) -> None:
        self.metadata = metadata
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        method = channel.stream_stream(
            STREAM_METHOD,
            request_serializer=_serialize,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        self._call = method(iter(self._requests.get, _END), metadata=metadata)
        self._responses: Responses | None = None
        #: Why the stream ended (``None`` while it is open).
        self.ended: grpc.RpcError | None = None
        self._lock = threading.Lock()
        self._reader = threading.Thread(
            target=self._read, name="ray-triton-shm-stream", daemon=True
        )
        self._reader.start()

    def send(self, request: Any, responses: Responses) -> None:
        """Sends ``request`` (a ``ModelInferRequest``, or one serialized): its responses go
        to ``responses``, or the error that ends the stream."""
        with self._lock:
            self._responses = responses
            ended = self.ended
        if ended is not None:
            responses.put(ended)
            return
        self._requests.put(request)

    def done(self) -> None:
        """The request's final response came: the stream carries no request now."""
        with self._lock:
            self._responses = None

    def cancel(self) -> None:
        """Cancels the stream, and with it its request in Triton."""
        self._call.cancel()
        self._requests.put(_END)  # else gRPC's thread that sends them waits for one forever

    def close(self) -> None:
        """Ends the stream once Triton answered what it carries."""
        self._requests.put(_END)

    def join(self, timeout_s: float) -> None:
        """Waits up to ``timeout_s`` for the stream to have ended."""
        self._reader.join(timeout_s)

    def _read(self) -> None:
        error: grpc.RpcError
        try:
            for message in self._call:
                with self._lock:
                    responses = self._responses
                if responses is not None:  # else: a cancelled request's, nobody reads it
                    responses.put(message)
            error = _Ended()
        except grpc.RpcError as exc:
            error = exc
        with self._lock:
            self.ended, responses = error, self._responses
        if responses is not None:
            responses.put(error)


class _Ended(grpc.RpcError):
    """The stream ended without an error (the client closed it)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return "the stream was closed"


def _serialize(request: Any) -> bytes:
    body = request if isinstance(request, bytes) else request.SerializeToString()
    return body + _EMPTY_FINAL


class Streams:
    """A client's gRPC streams to Triton: each request takes an idle one with its headers (or
    opens one), and gives it back after its final response.

    Args:
        channel: A callable returning the gRPC channel to Triton now (a channel that reads
            its TLS files again may be replaced).
    """

    def __init__(self, channel: Callable[[], grpc.Channel]) -> None:
        self._channel = channel
        self._idle: dict[Metadata, list[GrpcStream]] = {}
        self._open: set[GrpcStream] = set()
        self._lock = threading.Lock()
        self._closed = False

    def take(self, metadata: Metadata) -> GrpcStream:
        """An open stream with ``metadata`` that carries no request.

        Raises:
            ClientClosedError: the streams are closed (the client, or the interpreter's exit).
        """
        with self._lock:
            if self._closed:
                raise ClientClosedError(_CLOSED)
            idle = self._idle.get(metadata, [])
            while idle:
                stream = idle.pop()
                if stream.ended is None:
                    return stream
                self._open.discard(stream)
        stream = GrpcStream(self._channel(), metadata)
        with self._lock:
            if not self._closed:
                self._open.add(stream)
                return stream
        stream.cancel()  # closed meanwhile
        raise ClientClosedError(_CLOSED)

    def give_back(self, stream: GrpcStream) -> None:
        """Puts a stream whose request had its final response back among the idle ones."""
        stream.done()
        with self._lock:
            if not self._closed and stream.ended is None:
                self._idle.setdefault(stream.metadata, []).append(stream)
                return
            self._open.discard(stream)
        stream.close()

    def discard(self, stream: GrpcStream) -> None:
        """Cancels a stream whose request was given up (cancelling the request in Triton)."""
        stream.cancel()
        with self._lock:
            self._open.discard(stream)

    def close(self, *, wait_s: float = 0.0) -> None:
        """Ends every stream (idle ones at once), waiting up to ``wait_s`` for them to have
        ended; idempotent."""
        with self._lock:
            self._closed = True
            streams, self._open, self._idle = list(self._open), set(), {}
        for stream in streams:
            stream.close()
            stream.cancel()
        deadline = time.monotonic() + wait_s
        for stream in streams:
            stream.join(max(0.0, deadline - time.monotonic()))
