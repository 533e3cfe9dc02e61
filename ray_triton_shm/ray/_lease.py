"""Slots a process leases from its node actor, behind the interface of a slot pool.

A process's :class:`LeasedSlots` for a model hands the client engine one slot per request,
exactly like the :class:`~ray_triton_shm._pool.SlotPool` of an owned region. Behind it:

* a request takes one of the process's ``size`` local tokens (waiting locally if all are busy);
  a token holds a slot leased from the node actor, or gets one with a ``lease`` call (the only
  Ray call, made when the process needs more slots than it holds);
* after each request the slot stays leased for the next one, unless the region's header says
  other callers wait for a slot: then it goes back to the actor at once;
* a slot left unused for ``idle_release_s`` goes back to the actor (a sweeper thread per
  process), so idle processes never starve busy ones;
* a process that dies loses its leases to the actor's sweeper.

Every call to the actor is made from a thread of this module (:func:`_control`), never from the
caller's Ray task: a Ray cancellation of the caller (Serve cancelling a request, ``ray.cancel``
with ``recursive=True``) then never cancels a lease or a release, which would hold up the
caller's later calls on an actor that executes in order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import ray

from .._exceptions import SlotTimeoutError
from .._header import RegionHeader
from .._pool import PoolStats, SlotPool
from ._actor import ModelRegistration

__all__ = ["LeasedSlots", "control_call"]

#: Longest a single lease call waits in the actor before the caller asks again.
_LEASE_WAIT_S = 1.0
#: How long closing waits for the actor to take the leases back.
_RELEASE_WAIT_S = 10.0

_T = TypeVar("_T")
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _control() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=16, thread_name_prefix="ray-triton-shm-control"
            )
        return _executor


def _submit(fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
    try:
        return _control().submit(fn)
    except RuntimeError:  # the interpreter is shutting down: no new threads
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)
        return future


def control_call(fn: Callable[[], _T]) -> _T:
    """Runs ``fn`` (which calls the node actor) on a control thread and returns its result."""
    return _submit(fn).result()


def get(ref: Any, timeout_s: float | None = None) -> Any:
    """``ray.get`` that raises our own errors raised inside the actor as themselves."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        raise (cause if isinstance(cause, BaseException) else exc) from None


class LeasedSlots:
    """The slots one process leased for one model; a ``SlotSource`` for the client engine.

    Args:
        actor: The node actor.
        registration: The model's registration.
        header: The region's header (for the number of callers waiting).
        size: Most slots this process leases at once.
        idle_release_s: A slot unused this long goes back to the actor.
    """

    def __init__(
        self,
        actor: Any,
        registration: ModelRegistration,
        header: RegionHeader,
        *,
        size: int,
        idle_release_s: float,
    ) -> None:
        self.size = size
        self._actor = actor
        self._model = registration.spec.name
        self._incarnation = registration.incarnation
        self._header = header
        self._idle_release_s = idle_release_s
        self._tokens = SlotPool(size, name=self._model, max_waiting=registration.max_waiting)
        self._lock = threading.Lock()
        self._held: list[int | None] = [None] * size  # token -> leased slot
        self._token_of: dict[int, int] = {}  # leased slot -> token
        self._last_used = [0.0] * size
        self._closed = False
        _sweeper.add(self)

    # ---------------------------------------------------------------- SlotSource

    def acquire(self, timeout_s: float | None = None) -> int:
        """A leased slot, leasing one more if this process needs it (blocks up to
        ``timeout_s`` in all).

        Raises:
            SlotTimeoutError: no slot within ``timeout_s``.
            OverloadedError: too many callers already wait on this node.
            StaleLeaseError: the node actor restarted.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        token = self._tokens.acquire(timeout_s)
        slot = self._held[token]
        if slot is not None:
            return slot
        future = _submit(lambda: self._lease(deadline))
        try:
            slot = future.result()
        except BaseException:
            self._abandon(token, future)
            raise
        return self._hold(token, slot)

    def try_acquire(self) -> int | None:
        """A leased slot if one is free here or on the node, without waiting."""
        token = self._tokens.try_acquire()
        if token is None:
            return None
        slot = self._held[token]
        if slot is not None:
            return slot
        future = _submit(lambda: self._lease(time.monotonic()))
        try:
            slot = future.result()
        except SlotTimeoutError:
            self._tokens.release(token, cold=True)
            return None
        except BaseException:
            self._abandon(token, future)
            raise
        return self._hold(token, slot)

    async def acquire_async(self, timeout_s: float | None = None) -> int:
        """:meth:`acquire` for coroutines: blocks no thread of the event loop; cancelling it
        never loses a slot."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        token = await self._tokens.acquire_async(timeout_s)
        slot = self._held[token]
        if slot is not None:
            return slot
        future = _submit(lambda: self._lease(deadline))
        try:
            slot = await asyncio.wrap_future(future)
        except BaseException:
            self._abandon(token, future)
            raise
        return self._hold(token, slot)

    def release(self, slot: int) -> None:
        """Ends a request on ``slot``; gives the slot back to the actor if others wait."""
        with self._lock:
            token = self._token_of[slot]
            self._last_used[token] = time.monotonic()
            yield_slot = self._header.waiting > 0 and not self._closed
            if yield_slot:
                self._unhold(token)
        if yield_slot:
            self._give_back([slot])
        self._tokens.release(token, cold=yield_slot)

    def stats(self) -> PoolStats:
        """This process's tokens: in use, and requests waiting for one."""
        return self._tokens.stats()

    def close(self, *, wait_s: float | None = None) -> bool:
        """Waits for the requests in flight, then gives every leased slot back."""
        _sweeper.discard(self)
        all_free = self._tokens.close(wait_s=wait_s)
        with self._lock:
            self._closed = True
            slots = [self._unhold(t) for t, slot in enumerate(self._held) if slot is not None]
        if slots:
            done = self._give_back(slots)
            if not _on_event_loop():  # an event loop (a Serve replica) is never blocked
                concurrent.futures.wait([done], timeout=_RELEASE_WAIT_S)
        return all_free

    # ---------------------------------------------------------------- leases

    def give_back_idle(self, now: float) -> None:
        """Gives back the free slots unused for ``idle_release_s``, or all of them while other
        callers wait for a slot."""
        idle_since = now if self._header.waiting > 0 else now - self._idle_release_s

        def idle(token: int) -> bool:
            return self._held[token] is not None and self._last_used[token] <= idle_since

        tokens = self._tokens.take_free(idle)
        if not tokens:
            return
        with self._lock:
            slots = [self._unhold(token) for token in tokens]
        self._give_back(slots)
        for token in tokens:
            self._tokens.release(token, cold=True)

    def _lease(self, deadline: float | None) -> int:
        """Asks the actor for a slot until one comes or ``deadline`` passes (control thread)."""
        while True:
            wait_s = _LEASE_WAIT_S
            if deadline is not None:
                wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
            slot = get(
                self._actor.lease.remote(self._model, os.getpid(), self._incarnation, wait_s)
            )
            if slot is not None:
                return int(slot)
            if deadline is not None and time.monotonic() >= deadline:
                raise SlotTimeoutError(
                    f"no free slot for model {self._model!r} on this node in time: every slot is "
                    "leased and busy",
                    model=self._model,
                )

    def _hold(self, token: int, slot: int) -> int:
        with self._lock:
            self._held[token] = slot
            self._token_of[slot] = token
            self._last_used[token] = time.monotonic()
        return slot

    def _unhold(self, token: int) -> int:
        slot = self._held[token]
        assert slot is not None
        self._held[token] = None
        del self._token_of[slot]
        return slot

    def _abandon(self, token: int, future: concurrent.futures.Future[int]) -> None:
        """The caller gave up on a lease (error, cancellation): a slot leased anyway goes back."""
        self._tokens.release(token, cold=True)

        def give_back_late(done: concurrent.futures.Future[int]) -> None:
            if not done.cancelled() and done.exception() is None:
                self._give_back([done.result()])

        future.add_done_callback(give_back_late)

    def _give_back(self, slots: Sequence[int]) -> concurrent.futures.Future[None]:
        actor, model, incarnation = self._actor, self._model, self._incarnation

        def release() -> None:
            if ray.is_initialized():  # else Ray is gone, and the actor's sweeper takes them
                get(actor.release.remote(model, list(slots), incarnation), _RELEASE_WAIT_S)

        return _submit(release)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Sweeper:
    """One daemon thread per process giving idle leases back."""

    _INTERVAL_S = 0.1

    def __init__(self) -> None:
        self._pools: weakref.WeakSet[LeasedSlots] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, pool: LeasedSlots) -> None:
        with self._lock:
            self._pools.add(pool)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="ray-triton-shm-leases", daemon=True
                )
                self._thread.start()

    def discard(self, pool: LeasedSlots) -> None:
        with self._lock:
            self._pools.discard(pool)

    def _run(self) -> None:
        while True:
            time.sleep(self._INTERVAL_S)
            with self._lock:
                pools = list(self._pools)
            now = time.monotonic()
            for pool in pools:
                try:
                    pool.give_back_idle(now)
                except Exception:
                    pass  # closed meanwhile; the actor's sweeper is the backstop


_sweeper = _Sweeper()
