"""How one streaming request runs over a model's slots, written once for sync and async
callers, in the shape of :mod:`._engine`: :func:`stream` does no network I/O and yields each
thing it needs done as a ``(Step, argument)`` pair, and each response for the caller as
``(Step.DELIVER, response)``.

A streaming (decoupled) model answers one request with any number of responses, only over
Triton's gRPC stream. The rules:

- The inputs go into one slot (a stream is one request: at most ``max_batch_size`` samples),
  which is held until Triton's final response, and freed exactly then. Every request asks
  Triton for a final response even when it answers nothing else, so its end is always seen.
- The outputs come back by value, in the responses. Triton resolves a request's output
  regions once, and writes every response of it into the same place with no flow control:
  response k + 1 could overwrite response k before it is read.
- Before the first response, a request that found Triton away is sent again once Triton is
  back, as a unary request is (its caller saw nothing yet); one that found its region
  forgotten registers it again first. After a response, nothing is sent again (it would
  deliver responses twice): the stream ends with :class:`StreamInterruptedError`, saying how
  many came.
- An error response ends that request's stream alone, with Triton's message.
- A stream ended early (the caller stopped iterating, an error, a deadline) is cancelled in
  Triton by its driver; its slot is abandoned until Triton is proven done with the request
  (see :mod:`.._pools._abandoned`), unless Triton already sent its final response.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from .._exceptions import StreamingModelError, StreamInterruptedError, TritonServerError
from .._wire._http import grpc_answer, not_this_answer
from .._wire._streams import StreamErrorResponse, is_final
from .._wire._triton_errors import (
    is_change_symptom,
    is_missing_region,
    is_restart_symptom,
    status_and_message,
)
from ._bytes import decode
from ._engine import Chunk, Step, unary_refusal
from ._inputs import Batch
from ._model_pool import ModelPool
from ._options import RequestOptions

__all__ = ["StreamChunk", "StreamResponse", "stream"]

StreamSteps = Generator[tuple[Step, Any], Any, None]


class StreamResponse(dict):  # type: ignore[type-arg]
    """One response of a stream: ``{output name: array}``, as ``infer_shm`` returns them
    (read-only arrays over the response's bytes), with where it stands in the stream.

    Attributes:
        index: Its place in the stream: 0 for the first response.
        final: Whether Triton flagged it as the request's last (most models end with an
            empty final response instead, which is not delivered: the iteration just ends).
    """

    def __init__(self, outputs: dict[str, Any], *, index: int, final: bool) -> None:
        super().__init__(outputs)
        self.index = index
        self.final = final

    def __repr__(self) -> str:
        return f"StreamResponse(index={self.index}, final={self.final}, {dict.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (dict(self), self.index, self.final)


def _rebuild(outputs: dict[str, Any], index: int, final: bool) -> StreamResponse:
    return StreamResponse(outputs, index=index, final=final)


@dataclass(eq=False)
class StreamChunk(Chunk):
    """A streaming request: its slot, and the gRPC stream carrying it (the driver's)."""

    #: The gRPC stream the request was last sent on (set by the driver on ``OPEN``).
    stream: Any = None
    #: Responses delivered to the caller.
    delivered: int = 0
    #: Whether Triton sent the request's final response: the stream may carry another.
    finished: bool = False
    #: Where the stream hands the request's responses (set by the driver on ``OPEN``).
    responses: Any = None
    #: Triton's id of the request, which each of its responses carries.
    request_id: str = ""

    def final(self) -> None:
        """Triton is done with the request: counts it and frees its slot."""
        self.finished = True
        self.in_triton = False
        latency_ns = time.monotonic_ns() - self.started_ns
        self.pool.header.count(self.slot, self.rows, self.bytes_in, 0, latency_ns)
        self.pool.slots.release(self.slot)

    def interrupted(self, exc: BaseException) -> StreamInterruptedError:
        """The error of a stream cut off after a response (counted as the slot's error)."""
        self.pool.header.count_error(self.slot)
        status, message = status_and_message(exc)
        return StreamInterruptedError(
            f"the stream of model {self.pool.spec.name!r}{_id(self)} ended after "
            f"{self.delivered} response(s), before Triton's final one: {message}. "
            "It is not sent again (that would deliver its responses twice): send a new "
            "request to start over",
            delivered=self.delivered,
            status=status,
            server_message=message,
            model=self.pool.spec.name,
        )

    def timed_out(self, timeout_s: float) -> StreamInterruptedError:
        """The error of a stream whose next response did not come within ``timeout_s``
        (counted as the slot's error); the driver cancels the request in Triton."""
        self.pool.header.count_error(self.slot)
        return StreamInterruptedError(
            f"the stream of model {self.pool.spec.name!r}{_id(self)} got no response within "
            f"client_timeout_s={timeout_s} s after {self.delivered} response(s); it was "
            "cancelled in Triton",
            delivered=self.delivered,
            status=str(grpc.StatusCode.DEADLINE_EXCEEDED),
            server_message="Deadline Exceeded",
            model=self.pool.spec.name,
        )

    def answered_error(self, exc: StreamErrorResponse) -> TritonServerError:
        """The error of a request Triton answered with an error response."""
        self.pool.header.count_error(self.slot)
        message = exc.details()
        return TritonServerError(
            f"model {self.pool.spec.name!r} answered the stream{_id(self)} with an error after "
            f"{self.delivered} response(s): {message}",
            server_message=message,
            model=self.pool.spec.name,
        )


def _id(chunk: StreamChunk) -> str:
    request_id = chunk.request_id
    return f" of request id {request_id!r}" if request_id else ""


def stream(
    pool: ModelPool,
    batch: Batch,
    *,
    slot_timeout_s: float | None,
    request_id: str,
    options: RequestOptions | None = None,
) -> StreamSteps:
    """The steps of one streaming request of ``batch``; delivers each response with outputs
    as a :class:`StreamResponse`."""
    refusal = unary_refusal(pool, streaming=True)
    if refusal is not None:
        raise refusal
    spec = pool.spec
    if not 0 < batch.size <= spec.batch_capacity:
        raise StreamingModelError(
            f"model {spec.name!r}: a stream is one request, of 1 to {spec.batch_capacity} "
            f"sample(s) (max_batch_size), got {batch.size}",
            model=spec.name,
            expected=f"1 to {spec.batch_capacity} samples",
            actual=batch.size,
        )
    names = None if options is None else options.outputs
    started = time.monotonic_ns()
    slot = pool.take((yield Step.SLOT, slot_timeout_s))
    waited = time.monotonic_ns() - started
    chunk = StreamChunk.write(
        pool, slot, batch, 0, batch.size, request_id, options, started, waited
    )
    assert isinstance(chunk, StreamChunk)
    chunk.request_id = request_id
    try:
        yield from _responses(chunk, names)
    except BaseException:
        if not chunk.finished:
            chunk.abandon()  # free at once if Triton is done with it, else once proven done
        raise


def _responses(chunk: StreamChunk, names: tuple[str, ...] | None) -> StreamSteps:
    """Sends the request, and delivers its responses until Triton's final one (sending it
    again while nothing was delivered and :meth:`Chunk.recovery` finds a way)."""
    request_id = chunk.request_id
    while True:
        chunk.sending()
        yield Step.OPEN, chunk
        try:
            while not chunk.finished:
                message = yield Step.NEXT, chunk
                response = message.infer_response
                final = is_final(response)
                if message.error_message:
                    raise StreamErrorResponse(message.error_message, answered=_done(response))
                if response.outputs and response.id != request_id:
                    raise not_this_answer(request_id, response.id)
                if final:
                    chunk.final()
                if response.outputs:
                    outputs = _outputs(chunk.pool, response, names)
                    delivered = StreamResponse(outputs, index=chunk.delivered, final=final)
                    chunk.delivered += 1
                    yield Step.DELIVER, delivered
            return
        except grpc.RpcError as exc:
            chunk.answered(exc)
            yield _remedy(chunk, exc)


def _done(response: service_pb2.ModelInferResponse) -> bool:
    """Whether Triton is done with the request an error response answers: it was its final
    response, or Triton refused it before running it (such an error carries no flag)."""
    return "triton_final_response" not in response.parameters or is_final(response)


def _remedy(chunk: StreamChunk, exc: grpc.RpcError) -> tuple[Step, Any]:
    """What may save a request whose stream failed with ``exc`` before its final response:
    only while nothing was delivered (see :meth:`Chunk.recovery`). Else raises the caller's
    error."""
    if isinstance(exc, StreamErrorResponse):
        if chunk.delivered == 0 and exc.answered:  # Triton is done with it: it may go again
            if is_change_symptom(exc):
                raise chunk.failed(exc) from None
            if is_restart_symptom(exc) or (is_missing_region(exc) and not chunk.reregistered):
                return chunk.recovery(exc)  # a Triton shutting down, a region it forgot
        raise chunk.answered_error(exc) from None
    if chunk.delivered:
        raise chunk.interrupted(exc) from exc
    return chunk.recovery(exc)


def _outputs(
    pool: ModelPool, response: service_pb2.ModelInferResponse, names: tuple[str, ...] | None
) -> dict[str, Any]:
    """One response's outputs, read-only arrays over its bytes (the outputs asked for)."""
    spec = pool.spec
    outputs = {}
    for name, datatype, shape, contents in grpc_answer(response):
        tensor = spec.outputs_by_name.get(name)
        if tensor is None:
            raise TritonServerError(
                f"model {spec.name!r} answered an output {name!r} it does not declare "
                f"(its outputs: {sorted(spec.outputs_by_name)})",
                model=spec.name,
            )
        if datatype != tensor.datatype:
            raise TritonServerError(
                f"model {spec.name!r} answered output {name!r} as {datatype}, declared as "
                f"{tensor.datatype}",
                model=spec.name,
            )
        if names is not None and name not in names:
            continue
        outputs[name] = _values(spec.name, tensor.dtype, name, shape, contents)
    return outputs


def _values(model: str, dtype: np.dtype, name: str, shape: tuple[int, ...], contents: bytes) -> Any:
    """An output's values, checked against its shape."""
    count = math.prod(shape)
    if dtype.kind == "O":
        decoded = decode(np.frombuffer(contents, np.uint8), count)
        if decoded is not None:
            return decoded[0].reshape(shape)
        size = f"{len(contents)} bytes"
    elif len(contents) == count * dtype.itemsize:
        return np.frombuffer(contents, dtype, count).reshape(shape)
    else:
        size = f"{len(contents)} bytes, not the {count * dtype.itemsize} of {count} {dtype}"
    raise TritonServerError(
        f"model {model!r}: output {name!r} of shape {shape} came back as {size}",
        model=model,
    )
