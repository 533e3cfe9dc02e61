"""The one loop of a call stopped where it runs: its pool was retired, the model changed on
Triton, its keys rotated, or (in the Ray layer) its node actor restarted. The call goes on
where :class:`Moves`' ``recover`` says (the model's new pool, a new binding), at most
:data:`MAX_MOVES` times, or ends with what the caller should get.

What to do after each error is the layer's own rule (``Registry.next_pool`` for the
core, ``ShmModel._recover`` for the Ray layer); the counting, the limit and what is raised at
it are written here once, with a blocking and an asyncio driver (``run``, ``run_async``); a
sans-I/O step generator (a lease taking its slot) calls :meth:`Moves.after` itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from ._engine import SuspectedChange

__all__ = ["MAX_MOVES", "Moves", "surfaced"]

#: The most times one call goes on elsewhere.
MAX_MOVES = 2

T = TypeVar("T")
R = TypeVar("R")


def surfaced(exc: BaseException) -> BaseException:
    """What the caller gets for ``exc``: Triton's own error for a suspected change."""
    return exc.error if isinstance(exc, SuspectedChange) else exc


class Moves(Generic[T]):
    """Where one call runs, and where it goes on after an error that may send it elsewhere.

    Args:
        target: Where the call starts (a pool, or a binding of the Ray layer).
        handled: The errors after which the call may go on elsewhere; any other is raised.
        recover: ``recover(target, exc)``: where the call goes on after ``exc`` stopped it on
            ``target``, or raises what the caller should get. It may block (it may ask Triton
            or the node actor): :meth:`run_async` runs it in a thread.
        limit: The most moves; past them the last error is raised (:func:`surfaced`).
    """

    def __init__(
        self,
        target: T,
        handled: tuple[type[BaseException], ...],
        recover: Callable[[T, BaseException], T],
        *,
        limit: int = MAX_MOVES,
    ) -> None:
        self.target = target
        self.handled = handled
        self._recover = recover
        self._left = limit

    def after(self, exc: BaseException) -> T:
        """Where the call goes on after ``exc`` (one of :attr:`handled`); raises what the
        caller should get when no move is left or ``recover`` says so."""
        if not self._left:
            raise surfaced(exc) from None
        self._left -= 1
        self.target = self._recover(self.target, exc)
        return self.target

    def run(self, attempt: Callable[[T], R]) -> R:
        """``attempt(target)`` until it answers, moving after each handled error."""
        while True:
            try:
                return attempt(self.target)
            except self.handled as exc:
                self.after(exc)

    async def run_async(self, attempt: Callable[[T], Awaitable[R]]) -> R:
        """:meth:`run` for coroutines: ``recover`` runs in a thread."""
        while True:
            try:
                return await attempt(self.target)
            except self.handled as exc:
                await asyncio.to_thread(self.after, exc)
