"""How one inference call runs over a model's slots, written once for sync and async callers.

:func:`run` is a generator that does no network I/O. It decides which chunk of the batch goes
into which slot, when a slot may be reused and what may save a failed request, and it yields
each thing it needs done as a ``(Step, argument)`` pair. ``TritonSHMClient.infer_shm`` does the
steps by blocking and ``infer_shm_async`` by awaiting, with :func:`drive` and
:func:`drive_async`, which send each step's result back into the generator (or throw what it
raised). The rules below therefore exist once:

- Up to ``pool_size`` chunks are in flight; a caller holding a slot never waits for another
  (it collects its oldest chunk first), so callers cannot deadlock each other.
- A slot is reused only once Triton is done with the request that used it: Triton answered
  it, or, for a request given up without its answer, Triton is proven done with it (see
  :mod:`.._pools._abandoned`). After an error (an ``Exception``) the call waits for its other
  chunks in flight (up to each one's ``client_timeout_s``), so that usually every slot is free when
  the error reaches the caller. After an interrupt (any other ``BaseException``: Ctrl-C, a
  cancelled coroutine) it waits for nothing. A request given up whose gRPC call lives on (a
  deadline, a cancelled coroutine) frees its slot when Triton's answer arrives; one whose call
  is gone (an interrupted blocking call, a connection lost) is **abandoned**: its slot stays
  out of use until the region's owner proves Triton done with it.
- ``client_timeout_s`` is the caller's deadline, not gRPC's: the request goes to Triton with
  no deadline, so its answer still arrives (and frees the slot) after the caller gave up.
- A request that finds Triton unreachable waits for it and is sent again; one that finds its
  region forgotten registers the region again and is sent again, once per chunk and Triton
  restart.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2

from .._exceptions import StreamingModelError, TritonServerError, TritonSHMError
from .._wire._http import Answer
from .._wire._triton_errors import (
    answered_or_never_sent,
    is_change_symptom,
    is_missing_region,
    is_restart_symptom,
    translate_error,
)
from ._gpu_tensors import DeviceOutputs
from ._inputs import Batch
from ._model_change import answer_mismatch
from ._model_pool import ModelPool
from ._options import RequestOptions
from ._outputs import OutputAssembler, empty_outputs, overflow_message, overflowed_output


class Step(enum.Enum):
    """What :func:`run` needs done, with the argument it yields and the result it expects."""

    #: ``slot_timeout_s`` -> a slot (or ``SlotTimeoutError``...).
    SLOT = enum.auto()
    #: A :class:`Chunk` -> ``None``; sends its request without waiting for the answer.
    SEND = enum.auto()
    #: A :class:`Chunk` -> its :data:`~.._wire._http.Answer`, or the ``grpc.RpcError`` raised (an
    #: :class:`~.._wire._http.HttpError` over HTTP), or :meth:`Chunk.deadline_exceeded` past its
    #: deadline. A chunk not sent yet may be sent as a blocking call when it has no deadline
    #: (one-chunk calls: less CPU than a gRPC future), over Triton's HTTP endpoint where the
    #: client has one.
    ANSWER = enum.auto()
    #: The ``grpc.RpcError`` -> ``None`` once Triton is ready (or ``ServerUnreachableError``).
    RECONNECT = enum.auto()
    #: A :class:`Chunk` -> ``None`` once its region is registered again.
    REREGISTER = enum.auto()
    #: A :class:`Chunk` -> ``None`` once its call ended, or its deadline passed (its error is
    #: not raised: the call already failed for another reason).
    SETTLE = enum.auto()
    #: A stream's (see :mod:`._stream`): its :class:`Chunk` -> ``None``; sends the request on
    #: a gRPC stream of its own.
    OPEN = enum.auto()
    #: A stream's: its :class:`Chunk` -> Triton's next response to it, or the
    #: ``grpc.RpcError`` that ended the stream, or :meth:`Chunk.deadline_exceeded` past the
    #: deadline since the request or its last response.
    NEXT = enum.auto()
    #: A stream's: a response for the caller -> ``None`` once the caller asks for the next.
    DELIVER = enum.auto()
    #: A node batch's (see :mod:`._batching`): a :class:`~.._slots._board.LockWait` -> whether
    #: its byte came free before its timeout.
    LOCK = enum.auto()
    #: A node batch's: seconds -> ``None`` once they passed (its leader looks again).
    PAUSE = enum.auto()


Steps = Generator[tuple[Step, Any], Any, dict[str, Any]]
T = TypeVar("T")


class SuspectedChange(Exception):
    """Triton refused a request, or answered it, in a way a change of the model's config
    explains. The client compares Triton's config with the pool's spec: the pool follows the
    model, or the caller gets :class:`ModelChangedError` if the specs were given by hand, or
    :attr:`error` if nothing changed after all.

    Attributes:
        error: What the caller gets if the model did not change.
        executed: Whether Triton ran the request (it answered): a sequence step is then not
            sent again.
        proven: Whether the failure proves the model changed, as an answer that fits no spec
            does: an output of a fixed size that came from Triton's config came out larger.
            While Triton reloads a model its config may still read as before: it is read
            again until it shows the change.
    """

    def __init__(
        self, error: TritonServerError, *, executed: bool, proven: bool | None = None
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.executed = executed
        self.proven = executed if proven is None else proven


@dataclass(eq=False)
class Chunk:
    """One request: the slot it owns and, once sent as a gRPC future, the call using it."""

    pool: ModelPool
    slot: int
    start: int
    #: The request: a message pointing at the slot, or a pool by value's serialized bytes.
    request: service_pb2.ModelInferRequest | bytes
    epoch: int
    rows: int
    bytes_in: int
    #: When the call began, its first wait for a slot (``time.monotonic_ns``).
    started_ns: int
    #: ``None`` until sent as a gRPC future, or an asyncio task over HTTP (a blocking call
    #: leaves it ``None``); either has ``add_done_callback``, ``cancelled`` and ``exception``.
    call: Any = None
    #: Whether this chunk already had its region registered again.
    reregistered: bool = False
    #: Whether Triton may be running the request: sent, and not answered yet.
    in_triton: bool = False
    #: When the request was last sent (``time.monotonic_ns``).
    sent_ns: int = 0

    @classmethod
    def write(
        cls,
        pool: ModelPool,
        slot: int,
        batch: Batch,
        start: int,
        stop: int,
        request_id: str,
        options: RequestOptions | None,
        started_ns: int,
        wait_ns: int,
    ) -> Chunk:
        """Writes rows ``start:stop`` into a slot, waited for ``wait_ns``, and prepares their
        request; the slot is the chunk's now (released here if writing fails)."""
        try:
            request, written = pool.requests.write(
                slot, pool.views[slot], batch, start, stop, request_id, options
            )
        except BaseException:
            pool.slots.release(slot)
            raise
        pool.header.count_take(slot, wait_ns)
        return cls(pool, slot, start, request, pool.epoch, stop - start, sum(written), started_ns)

    def sending(self) -> None:
        """Marks the slot as written by Triton from now on (each time the request is sent):
        should this process die, the slot stays out of use until Triton is proven done with
        the request (see :mod:`.._slots._shared_slots`)."""
        self.sent_ns = time.monotonic_ns()
        self.in_triton = True
        self.pool.header.set_busy_since(self.slot, self.sent_ns)

    def answered(self, exc: grpc.RpcError | None = None) -> None:
        """Notes how the request's call ended: with Triton's answer (a response, or an error
        Triton sent), or without it (``exc`` from the connection: Triton may still run it)."""
        self.in_triton = exc is not None and not answered_or_never_sent(exc)
        if not self.in_triton:  # not in Triton any more (node batching counts those that are)
            self.pool.header.set_busy_since(self.slot, 0)

    def abandon(self) -> None:
        """Gives the slot up: freed once Triton is done with the request (at once if it is).

        A live gRPC call frees it when its answer arrives; a request whose call is gone (a
        blocking call cut short by Ctrl-C or a Ray cancellation, a lost connection) is
        abandoned until Triton is proven done with it.
        """
        pool, slot, sent_ns = self.pool, self.slot, self.sent_ns
        if self.call is not None:
            done = self.call
            done.add_done_callback(lambda call: pool.finish(slot, _call_answered(call), sent_ns))
        else:
            pool.finish(slot, not self.in_triton, sent_ns)

    def deadline_exceeded(self, timeout_s: float) -> TritonServerError:
        """The caller's deadline passed before Triton answered (counted as the slot's error);
        the request goes on in Triton, and its answer frees the slot."""
        self.pool.header.count_error(self.slot)
        return TritonServerError(
            f"inference for model {self.pool.spec.name!r} got no answer within "
            f"client_timeout_s={timeout_s} s (Triton still runs the request; its slot is used "
            "again once Triton answers it)",
            status=str(grpc.StatusCode.DEADLINE_EXCEEDED),
            server_message="Deadline Exceeded",
            model=self.pool.spec.name,
        )

    def time_left(self, timeout_s: float | None) -> float | None:
        """Seconds left before the deadline of the request's last send (``None``: none)."""
        if timeout_s is None:
            return None
        return max(0.0, timeout_s - (time.monotonic_ns() - self.sent_ns) / 1e9)

    def collect(self, outputs: OutputAssembler | DeviceOutputs, answered: Answer) -> None:
        """Copies the outputs out of the slot, counts the request, then frees the slot."""
        pool, slot = self.pool, self.slot
        try:
            mismatch = answer_mismatch(pool.spec, answered)
            if mismatch is not None:
                pool.header.count_error(slot)
                error = TritonServerError(
                    f"model {pool.spec.name!r} answered outputs that do not fit the specs it "
                    f"was registered with: {mismatch}",
                    model=pool.spec.name,
                )
                raise SuspectedChange(error, executed=True)
            bytes_out = outputs.add(pool.views[slot], self.start, answered)
            latency_ns = time.monotonic_ns() - self.started_ns
            pool.header.count(slot, self.rows, self.bytes_in, bytes_out, latency_ns)
        finally:
            pool.slots.release(slot)

    def failed(self, exc: BaseException) -> TritonServerError | SuspectedChange:
        """Counts the failed request; returns Triton's error as ours (wrapped in
        :class:`SuspectedChange` if a change of the model's config explains it)."""
        self.pool.header.count_error(self.slot)
        error = translate_error(exc, model=self.pool.spec.name, action="inference")
        overflow = overflow_message(self.pool.spec, error.server_message)
        if overflow is not None:
            error = TritonServerError(
                overflow,
                status=error.status,
                server_message=error.server_message,
                model=error.model,
            )
        if is_change_symptom(exc):
            grown = overflowed_output(self.pool.spec, error.server_message)
            fixed = grown is not None and not grown.is_variable and not grown.is_bytes
            return SuspectedChange(error, executed=False, proven=fixed and self.pool.follows)
        return error

    def recovery(self, exc: BaseException) -> tuple[Step, Any]:
        """What may save the chunk after its call failed with ``exc``: waiting for Triton (it
        may be restarting), or registering the region again (Triton forgot it, and this chunk
        has not done that yet since Triton last restarted).

        Raises:
            TritonServerError: nothing can (counted as the slot's error).
        """
        if is_restart_symptom(exc):
            # A Triton that restarted forgot every region again: the chunk, sent on through
            # two restarts, may register it again once in each.
            self.reregistered = False
            return Step.RECONNECT, exc
        if is_missing_region(exc) and not self.reregistered:
            self.reregistered = True
            return Step.REREGISTER, self
        raise self.failed(exc) from exc


def unary_refusal(pool: ModelPool, *, streaming: bool) -> StreamingModelError | None:
    """The error of a call that does not fit how the model answers (``streaming``: a
    stream's), or ``None`` if it fits."""
    spec = pool.spec
    if spec.decoupled == streaming:
        return None
    if spec.decoupled:
        message = (
            f"model {spec.name!r} is a streaming model (decoupled: Triton answers it only "
            f"over a stream, with any number of responses): call stream({spec.name!r}, "
            f"inputs) or stream_async(), which yield each response as it comes"
        )
    else:
        message = (
            f"model {spec.name!r} answers each request once (it is not decoupled): call "
            f"infer_shm({spec.name!r}, inputs) or infer_shm_async()"
        )
    return StreamingModelError(
        message,
        model=spec.name,
        expected="decoupled" if streaming else "unary",
        actual="decoupled" if spec.decoupled else "unary",
    )


def run(
    pool: ModelPool,
    batch: Batch,
    *,
    slot_timeout_s: float | None,
    request_id: str,
    options: RequestOptions | None = None,
    outputs_as: str = "numpy",
) -> Steps:
    """The steps of one inference call of ``batch``; returns the outputs (NumPy arrays, or
    GPU tensors of ``outputs_as`` for a pool in GPU memory)."""
    refusal = unary_refusal(pool, streaming=False)
    if refusal is not None:
        raise refusal
    names = None if options is None else options.outputs
    if batch.size == 0:
        return empty_outputs(pool.spec, names)
    outputs: OutputAssembler | DeviceOutputs
    if outputs_as == "numpy" or pool.memory.device is None:
        outputs = OutputAssembler(pool.spec, batch.size, names, by_value=pool.by_value)
    else:
        outputs = DeviceOutputs(pool.spec, batch.size, names, outputs_as, pool.memory.device)
    started = time.monotonic_ns()
    if batch.size <= pool.spec.batch_capacity:  # one chunk, the common case
        only = pool.take((yield Step.SLOT, slot_timeout_s))
        waited = time.monotonic_ns() - started
        chunk = Chunk.write(pool, only, batch, 0, batch.size, request_id, options, started, waited)
        try:
            response = yield from answer_steps(chunk)
        except BaseException:
            chunk.abandon()
            raise
        chunk.collect(outputs, response)
        return outputs.result()
    pending: deque[Chunk] = deque()
    try:
        for start, stop in batch.chunks():
            waiting = time.monotonic_ns()
            slot = pool.slots.try_acquire()
            while slot is None and pending:  # never wait for a slot while holding one
                response = yield from answer_steps(pending[0])
                pending.popleft().collect(outputs, response)
                slot = pool.slots.try_acquire()
            if slot is None:
                slot = yield Step.SLOT, slot_timeout_s
            slot = pool.take(slot)
            waited = time.monotonic_ns() - waiting
            chunk = Chunk.write(
                pool, slot, batch, start, stop, request_id, options, started, waited
            )
            pending.append(chunk)
            yield from _send(pending[-1])
        while pending:
            response = yield from answer_steps(pending[0])
            pending.popleft().collect(outputs, response)
    except BaseException as exc:
        try:
            # An error waits for the other chunks, freeing each slot as soon as it may be
            # reused, so that every slot is free when the error reaches the caller. An
            # interrupt waits for nothing: the finally leaves each slot to its call's callback.
            while pending and isinstance(exc, Exception):
                yield Step.SETTLE, pending[0]
                pending.popleft().abandon()
        finally:
            for chunk in pending:
                chunk.abandon()
        raise
    return outputs.result()


def answer_steps(chunk: Chunk) -> Generator[tuple[Step, Any], Any, Answer]:
    """Waits for a chunk's answer, sending it again while :meth:`Chunk.recovery` finds a way.

    A request sent again after Triton was unreachable goes on the same slot: Triton answers
    nothing while unreachable, so the first send either never reached it or died with it.
    """
    while True:
        if chunk.call is None:  # sent now, by a blocking call or a future
            chunk.sending()
        try:
            response = yield Step.ANSWER, chunk
        except grpc.RpcError as exc:
            chunk.answered(exc)
            remedy = chunk.recovery(exc)
            try:
                yield remedy
            except TritonSHMError:
                chunk.pool.header.count_error(chunk.slot)
                raise
        else:
            chunk.answered()
            return response  # type: ignore[no-any-return]
        yield from _send(chunk)


def _send(chunk: Chunk) -> Generator[tuple[Step, Any], Any, None]:
    """Sends a chunk's request as a gRPC future."""
    chunk.sending()
    try:
        yield Step.SEND, chunk
    except Exception:
        chunk.in_triton = False  # refused before it left (a closed channel)
        raise


def _call_answered(call: Any) -> bool:
    """Whether a finished call (a gRPC future, an asyncio task over HTTP) ended with Triton's
    answer."""
    if call.cancelled():
        return False
    error = call.exception()
    return error is None or (isinstance(error, grpc.RpcError) and answered_or_never_sent(error))
