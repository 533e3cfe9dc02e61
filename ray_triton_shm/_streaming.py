"""One streaming call's transport side: the steps of a stream (see :mod:`._inference._stream`)
carried out blocking or on an event loop, over a gRPC stream of the client's (see
:mod:`._wire._streams`), with the call's keys, deadline and reconnect budget, and where it goes
on when its pool stops it before its first response.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from ._calls import Call, count_failure
from ._drive import drive_stream, drive_stream_async
from ._exceptions import TritonSHMError
from ._inference._engine import Step
from ._inference._inputs import InputValue, prepare_batch
from ._inference._model_pool import ModelPool
from ._inference._options import select_outputs
from ._inference._stream import StreamChunk, StreamResponse, StreamSteps, stream
from ._wire._streams import Responses, Streams

__all__ = ["StreamCall"]


class StreamCall(Call):
    """One streaming call of a model's pool (see :class:`Call` for its arguments), over the
    client's ``streams``."""

    def __init__(self, *args: Any, streams: Streams, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._streams = streams
        self._chunk: StreamChunk | None = None

    def stream(self, inputs: Mapping[str, InputValue]) -> Iterator[StreamResponse]:
        """The responses of a request of ``inputs``, blocking (see ``stream``)."""
        moves = self._moves()
        while True:
            delivered = False
            try:
                steps = self._stream_steps(moves.target, inputs)
                with contextlib.closing(drive_stream(steps, self._do, Step.DELIVER)) as driven:
                    for response in driven:
                        delivered = True
                        yield response
                return
            except moves.handled as exc:
                if delivered:
                    raise
                moves = self._moved(moves, exc)
            except TritonSHMError as exc:
                count_failure(self.pool, exc)
                raise
            finally:
                self._release_stream()

    async def stream_async(self, inputs: Mapping[str, InputValue]) -> AsyncIterator[StreamResponse]:
        """:meth:`stream` on the running event loop."""
        moves = self._moves()
        while True:
            delivered = False
            try:
                steps = self._stream_steps(moves.target, inputs)
                driven = drive_stream_async(steps, self._do_async, Step.DELIVER)
                async with contextlib.aclosing(driven):  # closed now, not when collected
                    async for response in driven:
                        delivered = True
                        yield response
                return
            except moves.handled as exc:
                if delivered:
                    raise
                moves = await asyncio.to_thread(self._moved, moves, exc)
            except TritonSHMError as exc:
                count_failure(self.pool, exc)
                raise
            finally:
                self._release_stream()

    def _moved(self, moves: Any, exc: BaseException) -> Any:
        """Where the call goes on after ``exc`` stopped it before its first response."""
        try:
            return moves.increment(exc)
        except TritonSHMError as final:
            count_failure(self.pool, final)
            raise

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

    def _next(self, chunk: StreamChunk, item: Any) -> Any:
        if isinstance(item, BaseException):
            raise item
        return item

    def _do(self, step: Step, arg: Any) -> Any:
        """Carries out one step, blocking."""
        timeout_s = self._client_timeout_s
        match step:
            case Step.NEXT:
                try:
                    return self._next(arg, arg.responses.get(timeout_s))
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
                    return self._next(arg, await arg.responses.get_async(timeout_s))
                except TimeoutError:
                    raise arg.timed_out(timeout_s) from None
            case Step.OPEN:
                self._open(arg, asyncio.get_running_loop())
            case _:
                return await self.do_async(step, arg)
        return None
