"""The two drivers of a sans-I/O rule: a generator that yields ``(step, argument)`` for what it
needs done and is sent the result (or thrown the error) back, so that one rule serves blocking
callers and coroutines, and only the waiting differs (as httpx drives its auth flows).

The inference engine (:mod:`._inference._engine`), streams (:mod:`._inference._stream`, whose
rule also hands values out to its caller as it goes: :func:`drive_stream`) and waiting for
Triton while it restarts (:mod:`._wire._reconnect`) are written this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import grpc

__all__ = ["as_asyncio_future", "drive", "drive_async", "drive_stream", "drive_stream_async"]

S = TypeVar("S")
T = TypeVar("T")


def drive(steps: Generator[tuple[S, Any], Any, T], do: Callable[[S, Any], Any]) -> T:
    """Runs ``steps`` to the end, doing each step with ``do`` (which blocks)."""
    result: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                step, argument = steps.send(result) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                result, error = do(step, argument), None
            except BaseException as exc:  # the generator decides what to do with it
                result, error = None, exc
    finally:
        steps.close()  # an interrupt between two steps: the generator cleans up (slots back)


async def drive_async(
    steps: Generator[tuple[S, Any], Any, T], do: Callable[[S, Any], Awaitable[Any]]
) -> T:
    """:func:`drive` for coroutines: ``do`` returns an awaitable."""
    result: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                step, argument = steps.send(result) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                result, error = await do(step, argument), None
            except BaseException as exc:  # the generator decides what to do with it
                result, error = None, exc
    finally:
        steps.close()


def drive_stream(
    steps: Generator[tuple[S, Any], Any, None], do: Callable[[S, Any], Any], out: S
) -> Generator[Any, None, None]:
    """:func:`drive` for a rule that hands values to its caller: the argument of each step
    ``out`` is yielded. A caller that stops iterating closes the rule (it cleans up, and
    must not yield again)."""
    result: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                step, argument = steps.send(result) if error is None else steps.throw(error)
            except StopIteration:
                return
            if step == out:
                result, error = None, None
                yield argument
                continue
            try:
                result, error = do(step, argument), None
            except BaseException as exc:  # the generator decides what to do with it
                result, error = None, exc
    finally:
        steps.close()


async def drive_stream_async(
    steps: Generator[tuple[S, Any], Any, None], do: Callable[[S, Any], Awaitable[Any]], out: S
) -> AsyncGenerator[Any, None]:
    """:func:`drive_stream` for coroutines: ``do`` returns an awaitable."""
    result: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                step, argument = steps.send(result) if error is None else steps.throw(error)
            except StopIteration:
                return
            if step == out:
                result, error = None, None
                yield argument
                continue
            try:
                result, error = await do(step, argument), None
            except BaseException as exc:  # the generator decides what to do with it
                result, error = None, exc
    finally:
        steps.close()


def as_asyncio_future(call: grpc.Future, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    """An asyncio future that completes with a gRPC future, without a thread waiting on it."""
    result: asyncio.Future[Any] = loop.create_future()

    def transfer(done: grpc.Future) -> None:
        if result.done():
            return
        if done.cancelled():
            result.cancel()
            return
        error = done.exception()
        if error is not None:
            result.set_exception(error)
        else:
            result.set_result(done.result())

    def on_done(done: grpc.Future) -> None:
        try:
            loop.call_soon_threadsafe(transfer, done)
        except RuntimeError:
            pass  # the loop is closed; nobody is waiting any more

    call.add_done_callback(on_done)
    return result
