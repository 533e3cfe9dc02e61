"""A blocking pool of slot indices, usable from threads and from asyncio at once.

``acquire`` hands out a free slot (LIFO, so the most recently used, cache-warm slot goes first)
or waits for one. A released slot is handed straight to the longest-waiting caller, thread or
coroutine, so no waiter starves and no wake-up is lost. Waiting coroutines block no thread.

The pool's size can change while it is used (:meth:`SlotPool.resize`, by the owner's scaler,
see :mod:`.._pools._scaling`): slots ``0 .. size-1`` are handed out; a slot beyond the size is kept
out of use (*parked*) as soon as nobody holds it, and comes back when the pool grows again.

A slot whose holder is done with Triton, and which only arrays of a lease keep (see
:mod:`.._lease`), is *kept* (:meth:`SlotPool.keep`): closing the pool does not wait for it, and a
caller that waits while slots are kept is warned after :data:`KEPT_WARNING_S`, naming where
each kept slot's lease was made (as is a :class:`SlotTimeoutError`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from .._exceptions import ClientClosedError, ModelSpecError, SlotTimeoutError
from ._header import ROWS_BUCKET_BOUNDS

__all__ = ["KEPT_WARNING_S", "PoolStats", "SlotPool", "SlotSource", "kept_note", "warn_kept"]

#: How long a caller waits for a slot while others are kept by arrays only, before a warning.
KEPT_WARNING_S = 3.0


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool.

    Attributes:
        size: Slots in the pool now.
        in_use: Slots handed out and not yet released (abandoned ones included).
        waiting: Callers waiting for a slot.
        abandoned: Slots out of use until Triton is done with a request given up on them.
        min_size: The smallest size the pool shrinks to (``size`` for a fixed pool).
        max_size: The largest size the pool grows to (``size`` for a fixed pool).
        limited_by: Why the pool did not grow although callers waited lately (``""``:
            nothing): ``"upscale_delay_s"`` (their waits ended before that delay did),
            ``"max_slots"``, ``"shm_budget"`` (the client's or node's share of ``/dev/shm``)
            or ``"shm_full"`` (``/dev/shm`` itself had no room).
        shm_bytes: Bytes of ``/dev/shm`` the pool's region holds now, the same in every process
            that maps it (``0``: its file is gone).
        protocol: What carries the requests that point Triton at a slot: ``"http"``
            (Triton's HTTP endpoint, proven the same Triton) or ``"grpc"``.
        protocol_reason: Why (``"http_url=None"``, ``"no Triton HTTP endpoint at ..."``...).
        transport: How the tensors reach Triton: ``"shm"`` (shared memory Triton maps) or
            ``"inline"`` (by value, in the requests).
        transport_reason: Why: what proved it, or that it was asked for.
        node_batching: Whether the model's calls of a few rows join the node's batches (it was
            registered with ``node_batching``, and its slots can hold a batch's rows: not on a
            GPU), each batch one Triton request.
        rows_per_request: The mean rows (samples) per request Triton answered: above 1 where
            callers batch, or node batching merged their calls (``0.0``: none answered yet).
        rows_histogram: The answered requests by their rows: per bucket, its upper bound
            (``1, 2, 4, ..., 1024``, then ``math.inf``: any more) -> the requests of more rows
            than the bound before it and at most this one.
        company_waits: Node batches whose sender waited for company (other callers' rows)
            while the model's earlier batches were in Triton; a caller alone never waits.
        company_wait_mean_us: Their mean wait, in microseconds (bounded by the policy's
            ``max_delay_s``; ``0.0``: none waited).

    The counters (``rows_*``, ``company_*``) are the region's: over every process that takes
    its slots (the node's, for a ``ShmModel``), since the pool's current layout.
    """

    size: int
    in_use: int
    waiting: int
    abandoned: int = 0
    min_size: int = 0
    max_size: int = 0
    limited_by: str = ""
    shm_bytes: int = 0
    protocol: str = "grpc"
    protocol_reason: str = ""
    transport: str = "shm"
    transport_reason: str = ""
    node_batching: bool = False
    rows_per_request: float = 0.0
    rows_histogram: dict[float, int] = field(
        default_factory=lambda: dict.fromkeys(ROWS_BUCKET_BOUNDS, 0)
    )
    company_waits: int = 0
    company_wait_mean_us: float = 0.0


class SlotSource(Protocol):
    """Where a model's requests get their slots: a :class:`SlotPool` of the slots one client
    uses alone, or (in the Ray layer) the :class:`~ray_triton_shm._slots._shared_slots.SharedSlots`
    of a region that every process on the node takes slots of."""

    @property
    def size(self) -> int:
        """Slots in use now (``0 .. size-1``)."""

    @property
    def capacity(self) -> int:
        """Slots there is room for: the most the pool grows to."""

    def acquire(self, timeout_s: float | None = None) -> int: ...

    def try_acquire(self) -> int | None: ...

    async def acquire_async(self, timeout_s: float | None = None) -> int: ...

    def release(self, slot: int) -> None: ...

    def keep(self, slot: int, site: str) -> None:
        """The holder of ``slot`` is done with Triton: only arrays of a lease made at ``site``
        (``file:line``) keep it, until :meth:`release`. Closing does not wait for it."""

    def abandon(self, slot: int) -> None:
        """Gives up a held slot whose request Triton may still run: nobody gets it before
        :meth:`settled` (its header says since when it waits, see :mod:`.._pools._abandoned`)."""

    def settled(self, slot: int) -> None:
        """Triton is done with an abandoned slot: back in use."""

    def stats(self) -> PoolStats: ...

    def close(self, *, wait_s: float | None = None) -> bool:
        """Refuses new callers and waits (up to ``wait_s``) for the slots held, but not for
        kept ones; whether no slot is held any more (kept ones included)."""

    # The owner's settler (see :mod:`.._pools._abandoned`):

    @property
    def shared(self) -> bool:
        """Whether other processes take slots too: their holders may die unseen."""

    def sweep(self) -> None:
        """Abandons the slots of holders that died mid-request (in other processes)."""

    # The owner's scaler (see :mod:`.._pools._scaling`):

    def demand(self) -> tuple[int, int]:
        """Slots held and callers waiting, over every process using the slots."""

    def resize(self, size: int) -> None:
        """Hands out slots ``0 .. size-1`` from now on (at most the slots there is room for);
        slots beyond it leave the pool as their holders give them back."""

    def each_idle(self, slots: Iterable[int], fn: Callable[[int], None]) -> None:
        """Calls ``fn(slot)`` for each of ``slots`` that is out of the pool (beyond its size),
        held by nobody and not abandoned, nobody able to take it meanwhile."""

    def exclusive(self) -> AbstractContextManager[None]:
        """Held by one caller at a time over every process using the slots: for the header
        words any of them writes (failures)."""


class _ThreadWaiter:
    __slots__ = ("event", "slot")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.slot: int | None = None

    def give(self, slot: int) -> None:
        self.slot = slot
        self.event.set()

    def fail(self) -> None:
        self.event.set()


class _AsyncWaiter:
    __slots__ = ("future", "loop", "pool")

    def __init__(self, pool: SlotPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.future: asyncio.Future[int] = loop.create_future()

    def give(self, slot: int) -> None:
        try:
            self.loop.call_soon_threadsafe(self._deliver, slot)
        except RuntimeError:  # the loop is closed: nobody will ever take this slot
            self.pool.release(slot)

    def fail(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._deliver, None)
        except RuntimeError:
            pass

    def _deliver(self, slot: int | None) -> None:
        if self.future.done():  # cancelled or timed out after the slot was handed over
            if slot is not None:
                self.pool.release(slot)
        elif slot is None:
            self.future.set_exception(ClientClosedError("the slot pool was closed"))
        else:
            self.future.set_result(slot)


class SlotPool:
    """Slots ``0 .. size-1`` of a region with room for ``capacity``.

    Args:
        size: Number of slots.
        name: Used in error messages (usually the model name).
        capacity: Slots the pool may grow to (default: ``size``).
    """

    def __init__(self, size: int, *, name: str = "", capacity: int | None = None) -> None:
        if size < 1:
            raise ModelSpecError(
                f"slot pool {name!r} needs at least one slot, got {size}", model=name
            )
        self.name = name
        self.capacity = max(size, capacity or size)
        self._size = size
        self._free = list(range(size - 1, -1, -1))  # pop() gives slot 0 first
        self._held: set[int] = set()
        self._kept: dict[int, str] = {}  # slot -> where its lease was made
        self._abandoned: set[int] = set()
        self._parked = set(range(size, self.capacity))
        self._waiters: deque[_ThreadWaiter | _AsyncWaiter] = deque()
        self._lock = threading.Lock()
        self._all_back = threading.Condition(self._lock)
        self._closed = False

    @property
    def size(self) -> int:
        """Slots handed out now (``0 .. size-1``)."""
        return self._size

    def acquire(self, timeout_s: float | None = None) -> int:
        """Takes a slot, waiting up to ``timeout_s`` seconds (``None``: forever).

        Raises:
            SlotTimeoutError: no slot came free in time.
            ClientClosedError: the pool was closed.
        """
        with self._lock:
            self._check_open()
            if self._free:
                return self._hold(self._free.pop())
            waiter = _ThreadWaiter()
            self._waiters.append(waiter)
        first_s = KEPT_WARNING_S if timeout_s is None else min(timeout_s, KEPT_WARNING_S)
        if not waiter.event.wait(first_s):
            if first_s == KEPT_WARNING_S:
                self._warn_if_kept(KEPT_WARNING_S)
            if timeout_s is None or timeout_s > first_s:
                waiter.event.wait(None if timeout_s is None else timeout_s - first_s)
        with self._lock:
            if waiter.slot is not None:
                return waiter.slot
            self._dequeue(waiter)
            self._check_open()
        raise self._timeout(timeout_s)

    def try_acquire(self) -> int | None:
        """Takes a free slot if there is one, without waiting.

        Raises:
            ClientClosedError: the pool was closed.
        """
        with self._lock:
            self._check_open()
            return self._hold(self._free.pop()) if self._free else None

    async def acquire_async(self, timeout_s: float | None = None) -> int:
        """Like :meth:`acquire`, for coroutines: waits without blocking a thread.

        Cancelling the awaiting task never loses a slot.
        """
        with self._lock:
            self._check_open()
            if self._free:
                return self._hold(self._free.pop())
            waiter = _AsyncWaiter(self, asyncio.get_running_loop())
            self._waiters.append(waiter)
        started = time.monotonic()
        try:
            first_s = KEPT_WARNING_S if timeout_s is None else min(timeout_s, KEPT_WARNING_S)
            await asyncio.wait({waiter.future}, timeout=first_s)  # leaves the future pending
            if not waiter.future.done() and first_s == KEPT_WARNING_S:
                self._warn_if_kept(KEPT_WARNING_S)
            left_s = None if timeout_s is None else timeout_s - (time.monotonic() - started)
            return await asyncio.wait_for(waiter.future, left_s)
        except asyncio.TimeoutError:
            self._forget(waiter)
            raise self._timeout(timeout_s) from None
        except asyncio.CancelledError:
            waiter.future.cancel()  # a slot delivered later goes back (see _deliver)
            self._forget(waiter)
            raise

    def _forget(self, waiter: _AsyncWaiter) -> None:
        # Still queued: nobody gave it a slot. Otherwise a slot is on its way and _deliver,
        # seeing the future done, puts it back.
        with self._lock:
            if self._dequeue(waiter):
                return
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self.release(future.result())  # delivered, but our caller gave up in between

    def release(self, slot: int) -> None:
        """Returns a slot, handing it to the longest waiter if there is one."""
        with self._lock:
            self._held.discard(slot)
            self._kept.pop(slot, None)
            self._put_back(slot)

    def keep(self, slot: int, site: str) -> None:
        """Marks a held slot as kept by a lease's arrays only (made at ``site``)."""
        with self._lock:
            if slot in self._held:
                self._kept[slot] = site
                self._all_back.notify_all()

    def abandon(self, slot: int) -> None:
        """Keeps a held slot out of use until :meth:`settled`."""
        with self._lock:
            self._held.discard(slot)
            self._abandoned.add(slot)
            if self._held <= self._kept.keys():
                self._all_back.notify_all()

    def settled(self, slot: int) -> None:
        """Puts an abandoned slot back in use."""
        with self._lock:
            self._abandoned.discard(slot)
            self._put_back(slot)

    def stats(self) -> PoolStats:
        """A consistent snapshot of the pool."""
        with self._lock:
            in_use = len(self._held) + len(self._abandoned)
            return PoolStats(self._size, in_use, len(self._waiters), len(self._abandoned))

    def close(self, *, wait_s: float | None = None) -> bool:
        """Refuses new acquires, fails the waiters, and waits for the slots callers hold to
        come back (not for abandoned ones, which no caller reads any more).

        Slots kept by a lease's arrays only (:meth:`keep`) are not waited for: Triton is done
        with them, and their memory stays mapped while the arrays live.

        Args:
            wait_s: How long to wait for slots in use (``None``: forever).

        Returns:
            Whether no caller holds a slot, kept ones included (so the memory behind them can
            be unmapped).
        """
        with self._lock:
            self._closed = True
            while self._waiters:
                self._waiters.popleft().fail()
            self._all_back.wait_for(lambda: self._held <= self._kept.keys(), wait_s)
            return not self._held

    # ---------------------------------------------------------------- the owner's settler

    #: Only this process takes its slots: the holders it loses are its own to see.
    shared = False

    def sweep(self) -> None:
        """Nothing to do: a holder of this process that ends gives its slot back itself."""

    # ---------------------------------------------------------------- the owner's scaler

    def demand(self) -> tuple[int, int]:
        """Slots held (abandoned ones included) and callers waiting."""
        with self._lock:
            return len(self._held) + len(self._abandoned), len(self._waiters)

    def resize(self, size: int) -> None:
        """Hands out slots ``0 .. size-1`` from now on; a slot beyond that leaves the pool
        once given back. Slots that come back in are handed to waiters first."""
        size = max(1, min(size, self.capacity))
        with self._lock:
            old, self._size = self._size, size
            if size < old:
                kept = [slot for slot in self._free if slot < size]
                self._parked.update(slot for slot in self._free if slot >= size)
                self._free = kept
                return
            for slot in range(old, size):
                if slot in self._parked:
                    self._parked.discard(slot)
                    self._put_back(slot)

    def each_idle(self, slots: Iterable[int], fn: Callable[[int], None]) -> None:
        """Calls ``fn(slot)`` for each of ``slots`` out of the pool and idle (only
        :meth:`resize`, from the same caller, could bring one back meanwhile)."""
        with self._lock:
            idle = [slot for slot in slots if slot in self._parked]
        for slot in idle:
            fn(slot)

    def exclusive(self) -> AbstractContextManager[None]:
        """Its lock: the pool's only users are this process's threads."""
        return self._lock  # type: ignore[return-value]

    def _hold(self, slot: int) -> int:
        self._held.add(slot)
        return slot

    def _put_back(self, slot: int) -> None:
        """With the lock: a slot nobody holds goes to the longest waiter, or is free (parked
        if it is beyond the pool's size)."""
        if slot >= self._size:
            self._parked.add(slot)
        elif self._waiters and not self._closed:
            self._waiters.popleft().give(self._hold(slot))
        else:
            self._free.append(slot)
        if self._held <= self._kept.keys():
            self._all_back.notify_all()

    def _dequeue(self, waiter: _ThreadWaiter | _AsyncWaiter) -> bool:
        if waiter not in self._waiters:
            return False
        self._waiters.remove(waiter)
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"the slot pool of {self.name!r} is closed", model=self.name)

    def _kept_now(self) -> dict[int, str]:
        with self._lock:
            return {slot: site for slot, site in self._kept.items() if slot < self._size}

    def _warn_if_kept(self, waited_s: float) -> None:
        warn_kept(self.name, waited_s, self._kept_now())

    def _timeout(self, timeout_s: float | None) -> SlotTimeoutError:
        return SlotTimeoutError(
            f"no free slot for model {self.name!r} within {timeout_s} s "
            f"(all {self._size} slots busy){kept_note(self._kept_now())}",
            model=self.name,
            timeout_s=timeout_s,
        )


def kept_note(kept: Mapping[int, str]) -> str:
    """What a caller waiting for a slot is told of slots kept by a lease's arrays only
    (``""`` for none)."""
    if not kept:
        return ""
    sites = sorted(set(kept.values()))
    return (
        f"; {len(kept)} of them held only by arrays kept from a lease made at "
        f"{', '.join(sites)} (Triton is done with them): drop those arrays (del outputs), or "
        "copy what you keep (np.array(view)), to give the slots back"
    )


def warn_kept(model: str, waited_s: float, kept: Mapping[int, str]) -> None:
    """Warns a caller that waited ``waited_s`` for a slot of ``model`` while slots are kept by
    a lease's arrays only (nothing if none are)."""
    if kept:
        warnings.warn(
            f"ray_triton_shm: waited {waited_s:g} s for a slot of model {model!r}{kept_note(kept)}",
            RuntimeWarning,
            stacklevel=2,
        )
