"""Where a call goes on when it is stopped where it runs: its pool was retired or closed, the
model changed on Triton, or its inputs no longer fit the spec (and the model may have changed).

The rule is written once, in :func:`follow_model`: the call goes on with the model's newer
layout, unless the error says it must not. Only the layout's owner knows that layout: the
client that owns the pool (the core's registry reads Triton's config), or the Ray node actor
(asked by ``ShmModel``). That is the rule's one variable part, a :class:`LayoutOwner`.

:class:`Moves` counts the moves of one call, immutably (as urllib3's ``Retry.increment``): each
move is a new value with the error that caused it in its history, and the error the caller
finally gets names every move before it. Its drivers, :meth:`Moves.run` (blocking) and
:meth:`Moves.run_async`, differ only in how they wait (:meth:`Moves.stream` and
:meth:`Moves.stream_async` for a stream, which moves only until its first response); a
sans-I/O step generator (a lease taking its slot) calls :meth:`Moves.increment` itself. Each
layer's own recoveries (new keys after a rotation, a new binding after the node actor
restarted) come before the rule, in its ``recover``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import Generic, Protocol, TypeVar

from .._exceptions import ClientClosedError, ForeignRegionError, InvalidInputError
from .._inference._engine import SuspectedChange
from .._inference._model_pool import PoolRetired
from .._slots._header import LAYOUT_VERSION, foreign_region_error

__all__ = [
    "INPUT_RECHECK_S",
    "MAX_MOVES",
    "MOVED",
    "RETIRED",
    "LayoutOwner",
    "Moves",
    "follow_model",
    "surfaced",
]

#: The most times one call goes on elsewhere.
MAX_MOVES = 2
#: The pool a call waited on was replaced meanwhile (a new layout), or closed.
RETIRED = (PoolRetired, ClientClosedError)
#: What may send a call to another layout of its model: :data:`RETIRED`, a change of the model
#: on Triton (suspected from a refusal or an answer), or inputs the layout's spec refuses.
MOVED = (*RETIRED, SuspectedChange, InvalidInputError)
#: Inputs the spec refuses make the owner read Triton's config again at most this often.
INPUT_RECHECK_S = 1.0

T = TypeVar("T")
R = TypeVar("R")


def surfaced(exc: BaseException) -> BaseException:
    """What the caller gets for ``exc``: Triton's own error for a suspected change."""
    return exc.error if isinstance(exc, SuspectedChange) else exc


class LayoutOwner(Protocol[T]):
    """Who knows a model's current layout (a pool, or a binding of the Ray layer)."""

    def replacement(self, target: T, exc: BaseException) -> T | None:
        """The layout that replaced ``target`` after ``exc`` (one of :data:`RETIRED`), or
        ``None`` if none did (the client itself was closed, or ``target``'s ``retired`` word
        is none of the owner's: :func:`follow_model` tells which)."""

    def newer(
        self, target: T, exc: BaseException, since: float, *, deadline: float | None = None
    ) -> T | None:
        """The model's layout after ``exc`` suggested it changed: a new one if Triton's config
        (read unless it was read after ``since``, a ``time.monotonic()``) differs from
        ``target``'s, else ``None``. Where ``exc`` proves the change, the config is read
        again until it shows it, for a while, never past ``deadline`` (a
        ``time.monotonic()``; ``None``: the owner's own limit). Raises the config's own error
        (a model given by hand that no longer matches, or no longer loaded)."""


def follow_model(
    target: T,
    exc: BaseException,
    owner: LayoutOwner[T],
    *,
    follows: bool,
    sequence: bool,
    started: float,
    deadline: float | None = None,
) -> T:
    """Where a call goes on after ``exc`` (one of :data:`MOVED`) stopped it on ``target``, or
    raises what the caller should get.

    Args:
        target: Where the call ran.
        exc: What stopped it.
        owner: Who knows the model's current layout.
        follows: Whether the layout follows Triton's config (specs left out): only then can
            inputs the spec refuses be a change of the model.
        sequence: Whether the call is a step of a sequence: one that Triton ran is never sent
            again, since that would apply it twice.
        started: When the call started (a ``time.monotonic()``): a config read after it
            already shows any change the call ran into.
        deadline: When the call waits no more for Triton's config to show a change its
            answer proved (a ``time.monotonic()``; ``None``: only the owner's own limit).
    """
    if isinstance(exc, RETIRED):
        replaced = owner.replacement(target, exc)
        if replaced is None:
            raise _unreplaced(exc)
        return replaced
    if isinstance(exc, InvalidInputError):
        if not follows or exc.model is None:
            raise exc
        since = time.monotonic() - INPUT_RECHECK_S
    else:
        since = started
    if deadline is None:  # asked as before: an owner need not take one (a test's scripted one)
        newer = owner.newer(target, exc, since)
    else:
        newer = owner.newer(target, exc, since, deadline=deadline)
    if newer is None:
        raise surfaced(exc)
    if isinstance(exc, SuspectedChange) and exc.executed and sequence:
        raise exc.error
    return newer


def _unreplaced(exc: BaseException) -> BaseException:
    """What the caller gets when no layout replaced the one ``exc`` (one of :data:`RETIRED`)
    stopped: a closed pool's :class:`ClientClosedError` as it is; for a retired pool, what
    its owner said (it knows no layout after it) against what the pool knows of its own
    retirement.

    A ``retired`` word is believed only where the pool's owner laid the model out anew: a
    pool whose owner is this process records the layout that replaced it before it sets the
    word, and a node actor tells its callers its newer layout. So a retired pool that
    records a successor its owner no longer has was retired, then its client was closed or
    the model unregistered (:class:`ClientClosedError`); one that records none, and whose
    owner knows no newer layout, bears a word nobody of ours wrote (something wrote over the
    header, its stamp kept): the region is refused by name (:class:`ForeignRegionError`).
    """
    if not isinstance(exc, PoolRetired):
        return exc
    pool, name = exc.pool, exc.pool.spec.name
    if pool.following.successor is not None:
        return ClientClosedError(
            f"model {name!r}: its pool was laid out anew, and the client was closed or the "
            "model unregistered since",
            model=name,
        )
    try:
        pool.header.check(model=name)
    except ForeignRegionError as foreign:
        return foreign  # its stamp is gone too: that, first
    return foreign_region_error(
        pool.region.name,
        LAYOUT_VERSION,
        model=name,
        why="its 'retired' word is set, and its owner knows no layout that replaced it",
    )


class Moves(Generic[T]):
    """Where one call runs, and the moves that brought it there: a value (a move makes a new
    one). Slots, not a frozen dataclass: one is made per call, in a third of the time.

    Args:
        target: Where the call runs now (a pool, or a binding of the Ray layer).
        handled: The errors after which the call may go on elsewhere; any other is raised.
        recover: ``recover(target, exc)``: where the call goes on after ``exc`` stopped it on
            ``target``, or raises what the caller should get. It may block (it may ask Triton
            or the node actor): :meth:`run_async` runs it in a thread.
        limit: The most moves; past them the last error is raised (:func:`surfaced`).
        history: The errors that moved the call so far, oldest first.
    """

    __slots__ = ("handled", "history", "limit", "recover", "target")

    def __init__(
        self,
        target: T,
        handled: tuple[type[BaseException], ...],
        recover: Callable[[T, BaseException], T],
        limit: int = MAX_MOVES,
        history: tuple[BaseException, ...] = (),
    ) -> None:
        self.target = target
        self.handled = handled
        self.recover = recover
        self.limit = limit
        self.history = history

    def increment(self, exc: BaseException) -> Moves[T]:
        """The moves after ``exc`` (one of :attr:`handled`): where the call goes on, with
        ``exc`` in the history. Raises what the caller should get when no move is left or
        ``recover`` says so; after moves, that error names them."""
        if len(self.history) >= self.limit:
            raise self._named(surfaced(exc)) from None
        try:
            target = self.recover(self.target, exc)
        except BaseException as final:
            self._named(final)
            raise
        return Moves(target, self.handled, self.recover, self.limit, (*self.history, exc))

    def _named(self, final: BaseException) -> BaseException:
        if self.history:
            tried = "; ".join(f"{type(e).__name__}: {surfaced(e)}" for e in self.history)
            note = f"ray-triton-shm: the call moved {len(self.history)} time(s) before: {tried}"
            # The same error object may be raised to several calls (a model's config error).
            notes = getattr(final, "__notes__", [])
            if note not in notes:
                final.__notes__ = [*notes, note]  # type: ignore[attr-defined]  # add_note(): 3.11
        return final

    def run(
        self,
        attempt: Callable[[T], R],
        *,
        failed: Callable[[T, BaseException], None] | None = None,
    ) -> R:
        """``attempt(target)`` until it answers, moving after each handled error.

        Args:
            attempt: One try on a target.
            failed: Told of the error the call ends with, and where it last ran.
        """
        moves = self
        try:
            while True:
                try:
                    return attempt(moves.target)
                except moves.handled as exc:
                    moves = moves.increment(exc)
        except BaseException as exc:
            if failed is not None:
                failed(moves.target, exc)
            raise

    def stream(
        self,
        attempt: Callable[[T], Generator[R, None, None]],
        *,
        failed: Callable[[T, BaseException], None] | None = None,
    ) -> Generator[R, None, None]:
        """:meth:`run` for a call that yields (a stream): the items of ``attempt(target)``,
        moving after each handled error until the first item; after one, nothing is tried
        again (it would deliver items twice). Each attempt is closed as soon as it ends, or
        its caller stops reading (that cancels a stream's request)."""
        moves = self
        try:
            while True:
                delivered = False
                try:
                    with contextlib.closing(attempt(moves.target)) as items:
                        for item in items:
                            delivered = True
                            yield item
                    return
                except moves.handled as exc:
                    if delivered:
                        raise
                    moves = moves.increment(exc)
        except Exception as exc:
            if failed is not None:
                failed(moves.target, exc)
            raise

    async def stream_async(
        self,
        attempt: Callable[[T], AsyncGenerator[R, None]],
        *,
        failed: Callable[[T, BaseException], None] | None = None,
    ) -> AsyncGenerator[R, None]:
        """:meth:`stream` for coroutines: ``recover`` runs in a thread."""
        moves = self
        try:
            while True:
                delivered = False
                try:
                    # Closed now: an async generator left to the collector is closed later.
                    async with contextlib.aclosing(attempt(moves.target)) as items:
                        async for item in items:
                            delivered = True
                            yield item
                    return
                except moves.handled as exc:
                    if delivered:
                        raise
                    moves = await asyncio.to_thread(moves.increment, exc)
        except Exception as exc:
            if failed is not None:
                failed(moves.target, exc)
            raise

    async def run_async(
        self,
        attempt: Callable[[T], Awaitable[R]],
        *,
        failed: Callable[[T, BaseException], None] | None = None,
    ) -> R:
        """:meth:`run` for coroutines: ``recover`` runs in a thread."""
        moves = self
        try:
            while True:
                try:
                    return await attempt(moves.target)
                except moves.handled as exc:
                    moves = await asyncio.to_thread(moves.increment, exc)
        except BaseException as exc:
            if failed is not None:
                failed(moves.target, exc)
            raise
