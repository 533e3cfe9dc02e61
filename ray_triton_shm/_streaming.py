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
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Generator, Mapping
from typing import Any

from ._calls import Call, count_failure
from ._drive import drive_stream, drive_stream_async
from ._inference._engine import Step
from ._inference._inputs import InputValue, prepare_batch
from ._inference._model_pool import ModelPool
from ._inference._options import select_outputs
from ._inference._stream import StreamChunk, StreamResponse, StreamSteps, stream
from ._wire._streams import Responses, Streams

__all__ = ["StreamCall"]

logger = logging.getLogger(__name__)

#: How long the interpreter's exit waits for the gRPC streams' reading threads to end.
_EXIT_WAIT_S = 2.0


class StreamCall(Call):
    """One streaming call of a model's pool (see :class:`Call` for its arguments), over the
    client's ``streams``."""

    def __init__(self, *args: Any, streams: Streams, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._streams = streams
        self._chunk: StreamChunk | None = None
        _AT_EXIT.owner(self._owner, streams)

    def stream(self, inputs: Mapping[str, InputValue]) -> Generator[StreamResponse, None, None]:
        """The responses of a request of ``inputs``, blocking (see ``stream``)."""
        return _AT_EXIT.unfinished(self._stream(inputs))

    def stream_async(
        self, inputs: Mapping[str, InputValue]
    ) -> AsyncGenerator[StreamResponse, None]:
        """:meth:`stream` on the running event loop."""
        return _AT_EXIT.unfinished(self._stream_async(inputs))

    def _stream(self, inputs: Mapping[str, InputValue]) -> Generator[StreamResponse, None, None]:
        def attempt(pool: ModelPool) -> Generator[StreamResponse, None, None]:
            return drive_stream(self._stream_steps(pool, inputs), self._do, Step.DELIVER)

        try:
            yield from self._moves().stream(attempt, failed=count_failure)
        finally:
            self._release_stream()

    async def _stream_async(
        self, inputs: Mapping[str, InputValue]
    ) -> AsyncGenerator[StreamResponse, None]:
        def attempt(pool: ModelPool) -> AsyncGenerator[StreamResponse, None]:
            steps = self._stream_steps(pool, inputs)
            return drive_stream_async(steps, self._do_async, Step.DELIVER)

        streamed = self._moves().stream_async(attempt, failed=count_failure)
        try:
            async with contextlib.aclosing(streamed):  # closed now, not when collected
                async for response in streamed:
                    yield response
        finally:
            self._release_stream()

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
        self._unfinished: weakref.WeakSet[Any] = weakref.WeakSet()
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

    def unfinished(self, responses: Any) -> Any:
        """Closes the stream ``responses`` (a generator, or an async one) at exit."""
        self._unfinished.add(responses)
        return responses

    def close(self) -> None:
        """Closes every stream not finished, ends every gRPC stream, closes every owner."""
        if self._hooked_in != os.getpid():
            return  # a forked child's exit, with the hook of its parent
        for responses in list(self._unfinished):
            _close_stream(responses)
        deadline = time.monotonic() + _EXIT_WAIT_S
        for streams in list(self._streams):
            streams.close(wait_s=max(0.0, deadline - time.monotonic()))
        for owner in list(self._owners):
            try:
                owner.close()
            except Exception:
                logger.exception("ray-triton-shm: closing %r at exit failed", owner)


def _close_stream(responses: Any) -> None:
    """Closes ``responses`` now, as its caller's ``close()`` or ``aclose()`` would; one that
    runs meanwhile (another thread's, a task's) is left to end with its gRPC stream."""
    try:
        if not isinstance(responses, AsyncGenerator):
            responses.close()
            return
        closing = responses.aclose()
        try:
            closing.send(None)  # its loop is not needed: nothing in its way out waits on it
        except StopIteration:
            return
        closing.close()  # it waited on its loop after all: left to end with its gRPC stream
    except (RuntimeError, ValueError):  # running now
        pass
    except Exception:
        logger.exception("ray-triton-shm: closing a stream at exit failed")


_AT_EXIT = _AtExit()
os.register_at_fork(after_in_child=_AT_EXIT.forget)
