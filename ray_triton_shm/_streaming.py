"""One streaming call's transport side: the steps of a stream (see :mod:`._inference._stream`)
carried out blocking or on an event loop, over a gRPC stream of the client's (see
:mod:`._wire._streams`), with the call's keys, deadline and reconnect budget, and where it goes
on when its pool stops it before its first response.

A script may exit without closing its client, a stream unfinished (never exhausted, or read
by a daemon thread). The interpreter's exit then closes, in this order, the streams not
finished (as their callers' ``close()`` would: each request is cancelled in Triton, its slot
abandoned), every gRPC stream, and each client that streamed: its pools unregistered and
unlinked, then its channel, while gRPC's threads still run. Left to the interpreter's end,
tritonclient's ``__del__`` would close the channel after those threads stopped, and wait
forever for a call that one of them owed an event.

A stream can be ended from outside its caller: by its client's ``close()``, or by that exit.
One suspended between two responses (its caller stopped reading without closing it) is
closed there and then, from the thread that ends it; one taking a step (waiting for a
response, a slot) is woken by the cancellation of its gRPC stream, and closes itself. Either
way its caller gets :class:`ClientClosedError` next, but a daemon thread reading a stream the
exit ended: it waits for the interpreter's end, which stops it, printing nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Generator, Mapping
from typing import Any

from ._calls import Call, count_failure
from ._drive import drive_stream, drive_stream_async
from ._exceptions import ClientClosedError
from ._inference._engine import Step
from ._inference._inputs import InputValue, prepare_batch
from ._inference._model_pool import ModelPool
from ._inference._options import select_outputs
from ._inference._stream import StreamChunk, StreamResponse, StreamSteps, stream
from ._wire._streams import Responses, Streams

__all__ = ["StreamCall", "end_streams"]

logger = logging.getLogger(__name__)

#: How long the interpreter's exit waits for the gRPC streams' reading threads to end.
_EXIT_WAIT_S = 2.0

#: Why a stream was ended from outside its caller: its client closed, or the interpreter exits.
_CLIENT_CLOSED = "its TritonSHMClient was closed"
_EXITING = "the interpreter exits"

_Streamed = Generator[StreamResponse, None, None] | AsyncGenerator[StreamResponse, None]


class StreamCall(Call):
    """One streaming call of a model's pool (see :class:`Call` for its arguments), over the
    client's ``streams``."""

    def __init__(self, *args: Any, streams: Streams, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._streams = streams
        self._chunk: StreamChunk | None = None
        #: The responses still to come, while the stream runs.
        self._streamed: _Streamed | None = None
        #: Held while the stream takes a step: :meth:`end` closes it only between two.
        self._stepping = threading.Lock()
        #: Why the stream was ended from outside its caller (``None``: it was not).
        self._ended_by: str | None = None
        self._delivered = 0
        _AT_EXIT.owner(self._owner, streams)

    def stream(self, inputs: Mapping[str, InputValue]) -> Generator[StreamResponse, None, None]:
        """The responses of a request of ``inputs``, blocking (see ``stream``)."""
        _AT_EXIT.unfinished(self)
        return self._stream(inputs)

    def stream_async(
        self, inputs: Mapping[str, InputValue]
    ) -> AsyncGenerator[StreamResponse, None]:
        """:meth:`stream` on the running event loop."""
        _AT_EXIT.unfinished(self)
        return self._stream_async(inputs)

    def end(self, why: str) -> None:
        """Ends the stream from outside its caller (``why``: its client closes, or the
        interpreter exits): closed now if suspended between two responses (its request
        cancelled in Triton, its slot abandoned), else by the step it takes, once its gRPC
        stream is cancelled. Its caller gets :class:`ClientClosedError` next."""
        if self._ended_by is None:
            self._ended_by = why
        if not self._stepping.acquire(blocking=False):
            return  # it takes a step: the cancellation of its gRPC stream ends it
        try:
            self._close_streamed()
        except Exception:
            logger.exception("ray-triton-shm: closing a stream of model %r failed", self._model)
        finally:
            self._stepping.release()

    def owned_by(self, owner: object) -> bool:
        """Whether the stream is one of ``owner``'s (a client)."""
        return self._owner is owner

    def _stream(self, inputs: Mapping[str, InputValue]) -> Generator[StreamResponse, None, None]:
        def attempt(pool: ModelPool) -> Generator[StreamResponse, None, None]:
            return drive_stream(self._stream_steps(pool, inputs), self._do, Step.DELIVER)

        self._streamed = self._moves().stream(attempt, failed=count_failure)
        try:
            while (response := self._next()) is not None:
                yield response
        finally:
            with self._stepping:
                self._close_streamed()
            _AT_EXIT.finished(self)

    async def _stream_async(
        self, inputs: Mapping[str, InputValue]
    ) -> AsyncGenerator[StreamResponse, None]:
        def attempt(pool: ModelPool) -> AsyncGenerator[StreamResponse, None]:
            steps = self._stream_steps(pool, inputs)
            return drive_stream_async(steps, self._do_async, Step.DELIVER)

        self._streamed = self._moves().stream_async(attempt, failed=count_failure)
        try:
            while (response := await self._next_async()) is not None:
                yield response
        finally:
            with self._stepping:
                streamed, self._streamed = self._streamed, None
                try:
                    if isinstance(streamed, AsyncGenerator):
                        await streamed.aclose()  # closed now, not when collected
                finally:
                    self._release_stream()
            _AT_EXIT.finished(self)

    def _next(self) -> StreamResponse | None:
        """The next response (``None``: the stream is over), unless the stream was ended
        from outside (see :meth:`end`).

        Raises:
            ClientClosedError: it was.
        """
        with self._stepping:
            if self._ended_by is None:
                streamed = self._streamed
                assert isinstance(streamed, Generator)
                try:
                    response = next(streamed, None)
                except Exception:
                    if self._ended_by is None:
                        raise
                else:
                    self._delivered += response is not None
                    return response
            self._close_streamed()
        if self._parks():
            threading.Event().wait()  # for ever: the interpreter's end stops this thread
        raise self._ended_error()

    async def _next_async(self) -> StreamResponse | None:
        """:meth:`_next` on the running event loop."""
        with self._stepping:
            if self._ended_by is None:
                streamed = self._streamed
                assert isinstance(streamed, AsyncGenerator)
                try:
                    response = await anext(streamed, None)
                except Exception:
                    if self._ended_by is None:
                        raise
                else:
                    self._delivered += response is not None
                    return response
            self._close_streamed()
        if self._parks():
            await asyncio.get_running_loop().create_future()  # for ever, as in _next
        raise self._ended_error()

    def _close_streamed(self) -> None:
        """Closes the responses still to come now, as the caller's ``close()`` would: the
        request is cancelled in Triton, its slot abandoned (see :func:`stream`)."""
        streamed, self._streamed = self._streamed, None
        try:
            if isinstance(streamed, AsyncGenerator):
                _close_without_loop(streamed)
            elif streamed is not None:
                streamed.close()
        finally:
            self._release_stream()

    def _parks(self) -> bool:
        """Whether the caller waits for the interpreter's end instead of an error: a daemon
        thread reading a stream the exit ended (the interpreter stops the thread anyway;
        the error would print its traceback as the interpreter exits)."""
        return self._ended_by == _EXITING and threading.current_thread().daemon

    def _ended_error(self) -> ClientClosedError:
        """The error of a stream ended from outside its caller."""
        request_id = f" of request id {self.request_id!r}" if self.request_id else ""
        return ClientClosedError(
            f"the stream of model {self._model!r}{request_id} was cancelled after "
            f"{self._delivered} response(s): {self._ended_by}",
            model=self._model,
        )

    @property
    def _model(self) -> str:
        return self.pool.spec.name

    def _stream_steps(self, pool: ModelPool, inputs: Mapping[str, InputValue]) -> StreamSteps:
        """The steps of the stream on ``pool``, its inputs and options checked against it.

        Raises:
            StreamingModelError: the model answers each request once.
            InvalidInputError: naming what does not match (nothing was written).
        """
        spec = pool.spec
        batch = prepare_batch(spec, inputs, pool.memory.device)
        chosen = None if self.options is None else select_outputs(spec, self.options)
        self.pools.maybe_check(pool)
        return stream(
            pool,
            batch,
            slot_timeout_s=self.slot_timeout_s,
            request_id=self.request_id,
            options=chosen,
        )

    def _open(self, chunk: StreamChunk, loop: asyncio.AbstractEventLoop | None) -> None:
        """Sends the request on a stream of its own (the one it was sent on before, if any,
        is given up)."""
        self._release_stream()
        self._chunk = chunk
        chunk.stream = self._streams.take(self._metadata)
        chunk.responses = Responses(loop)
        chunk.stream.send(chunk.request, chunk.responses)

    def _release_stream(self) -> None:
        """Gives the stream of the request back (Triton is done with it), or cancels it (and
        the request with it) if Triton is not."""
        chunk, self._chunk = self._chunk, None
        if chunk is None or chunk.stream is None:
            return
        stream, chunk.stream = chunk.stream, None
        if chunk.finished:
            self._streams.give_back(stream)
        else:
            self._streams.discard(stream)

    def _do(self, step: Step, arg: Any) -> Any:
        """Carries out one step, blocking."""
        timeout_s = self._client_timeout_s
        match step:
            case Step.NEXT:
                try:
                    return _received(arg.responses.get(timeout_s))
                except TimeoutError:
                    raise arg.timed_out(timeout_s) from None
            case Step.OPEN:
                self._open(arg, None)
            case _:
                return self.do(step, arg)
        return None

    async def _do_async(self, step: Step, arg: Any) -> Any:
        """Carries out one step on the running event loop."""
        timeout_s = self._client_timeout_s
        match step:
            case Step.NEXT:
                try:
                    return _received(await arg.responses.get_async(timeout_s))
                except TimeoutError:
                    raise arg.timed_out(timeout_s) from None
            case Step.OPEN:
                self._open(arg, asyncio.get_running_loop())
            case _:
                return await self.do_async(step, arg)
        return None


def _received(item: Any) -> Any:
    """A response handed over by the stream, or the error that ended it, raised."""
    if isinstance(item, BaseException):
        raise item
    return item


class _AtExit:
    """What the interpreter's exit closes (see the module's docstring), held weakly."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Forgets every owner and stream (in a child just forked: they are its parent's)."""
        self._owners: weakref.WeakSet[Any] = weakref.WeakSet()
        self._streams: weakref.WeakSet[Streams] = weakref.WeakSet()
        self._unfinished: weakref.WeakSet[StreamCall] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._hooked_in: int | None = None  # the process whose exit hook closes them

    def owner(self, owner: Any, streams: Streams) -> None:
        """Closes ``owner`` (a client) and its gRPC ``streams`` at exit."""
        self._owners.add(owner)
        self._streams.add(streams)
        with self._lock:
            if self._hooked_in == os.getpid():
                return
            # Registered now, after the client's pools registered their finalizers (with
            # weakref's exit hook), it runs before them: releasing a pool waits for the slot
            # an unfinished stream holds.
            atexit.register(self.close)
            self._hooked_in = os.getpid()

    def unfinished(self, call: StreamCall) -> None:
        """Ends the stream of ``call`` at exit, or when its owner closes, unless it finished."""
        self._unfinished.add(call)

    def finished(self, call: StreamCall) -> None:
        """The stream of ``call`` ended: nothing to end any more."""
        self._unfinished.discard(call)

    def end(self, owner: object | None, why: str) -> None:
        """Ends the unfinished streams of ``owner`` (``None``: every one), saying ``why``."""
        for call in list(self._unfinished):
            if owner is None or call.owned_by(owner):
                call.end(why)

    def close(self) -> None:
        """Ends every stream not finished and every gRPC stream, then closes every owner."""
        if self._hooked_in != os.getpid():
            return  # a forked child's exit, with the hook of its parent
        self.end(None, _EXITING)
        deadline = time.monotonic() + _EXIT_WAIT_S
        for streams in list(self._streams):
            streams.close(wait_s=max(0.0, deadline - time.monotonic()))
        for owner in list(self._owners):
            try:
                owner.close()
            except Exception:
                logger.exception("ray-triton-shm: closing %r at exit failed", owner)


def end_streams(owner: object, streams: Streams) -> None:
    """Ends the streams of ``owner`` (a client that closes) and its gRPC ``streams``, before
    its pools close: they wait for the slots that streams hold. Each stream's caller gets
    :class:`ClientClosedError` next."""
    _AT_EXIT.end(owner, _CLIENT_CLOSED)
    streams.close()


def _close_without_loop(streamed: AsyncGenerator[Any, None]) -> None:
    """Closes ``streamed`` at once, off its event loop: nothing on its way out waits on it."""
    closing = streamed.aclose()
    try:
        closing.send(None)
    except StopIteration:
        return
    closing.close()  # it waited on its loop after all: left to end with its gRPC stream
    logger.warning("ray-triton-shm: a stream could not be closed off its event loop")


_AT_EXIT = _AtExit()
os.register_at_fork(after_in_child=_AT_EXIT.forget)
