"""A slot pool shared by every process that maps a region, through the region's file locks.

:class:`SharedSlots` hands out the slots of one region to callers in any process on the machine
(in the Ray layer: every Serve replica and Ray Data worker on the node), with no message to
anyone. A slot is held by an open-file-description lock (``F_OFD_SETLK``) on one byte of the
region's file: byte ``i`` for slot ``i``. Such a lock belongs to one open file description, so
every caller takes one of its process's descriptors for as long as it holds a slot, and the
kernel drops the lock when the process dies however it dies. So:

* taking a free slot is a non-blocking lock, and giving it back an unlock: a few system calls;
* a caller that finds no free slot takes a **seat** (a lock on one of ``max_waiting`` seat
  bytes; none free: :class:`OverloadedError`), records in the header which slot it queues on
  (the slot with the fewest callers queued), and sleeps in the kernel on that slot's lock
  (``F_OFD_SETLKW``), behind the callers that queued there before it. A slot with callers
  queued on it is only taken by them, so no newcomer overtakes a waiting caller;
* a holder that dies is seen by the next one to lock its slot (or by the owner's sweep): the
  slot's ``busy_since`` word is still set. The engine sets it right before it sends a request
  on the slot, and :meth:`SharedSlots.release` clears it before unlocking. A holder that died
  before sending leaves it clear, and its slot is free at once. One that died after sending
  left a request that Triton may still be working on, and Triton writes the outputs into the
  slot whenever it is done, so the finder **abandons** the slot: it stays out of use until the
  region's owner proves Triton done with that request (:mod:`.._pools._abandoned`), which a live
  holder that gives a request up without its answer does too (:meth:`SharedSlots.abandon`).

The pool's size is a word of the header that only the region's owner writes (its scaler, see
:mod:`.._pools._scaling`): callers take and queue on slots ``0 .. size-1`` only, and a caller that
locks a slot beyond the size (it queued there before the pool shrank) gives it back and
queues again. The owner frees a slot's memory only while it holds the slot's lock itself.

Waiting with a timeout, or from a coroutine, happens on a daemon thread: a lock wait in the
kernel cannot be interrupted. A caller that gives up frees its seat at once and leaves the
thread in the kernel's queue, to hand the slot straight back when it comes. A forked child
closes its copies of the descriptors (they share the parent's locks) and binds anew.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from .._exceptions import ClientClosedError, OverloadedError, RegionReplacedError, SlotTimeoutError
from ._header import RegionHeader
from ._locks import in_wait_thread, lock_byte, locked_by_another, unlock_byte
from ._shm import DEAD, SHM_DIR, owner_state
from ._slot_pool import KEPT_WARNING_S, PoolStats, kept_note, warn_kept

__all__ = ["NodeSlotStats", "SharedSlots"]

# Lock bytes: slot i is byte i; seat s is byte _SEAT0 + s; _MUTEX serialises taking seats (so
# that "every seat taken" is seen at one instant) and rare header updates.
_SEAT0 = 1 << 20
_MUTEX = 1 << 30
#: How often a caller looks again when every slot waits for Triton (rare: see _pick).
_ALL_ABANDONED_POLL_S = 0.01


_instances: weakref.WeakSet[SharedSlots] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The child's descriptors share the parent's open file descriptions, and so its locks:
    # using them would take the parent's slots. Closing them leaves the parent's locks alone.
    for slots in list(_instances):
        slots._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class NodeSlotStats:
    """What every process using a region does with its slots, right now.

    Attributes:
        in_use: Slots held.
        waiting: Callers queued for a slot.
        abandoned: Slots out of use until Triton is done with a request given up on them
            (its caller's deadline passed, or its caller died mid-request).
    """

    __slots__ = ("abandoned", "in_use", "waiting")

    def __init__(self, in_use: int, waiting: int, abandoned: int) -> None:
        self.in_use = in_use
        self.waiting = waiting
        self.abandoned = abandoned


class _Wait:
    """A wait on a thread of :class:`_WaitThreads`, which its caller may give up.

    ``guard`` orders the waiter's and the caller's moves: whoever comes second sees what the
    first did (a slot delivered, the caller gone, the seat already given back).
    """

    __slots__ = ("abandoned", "fd", "guard", "seat", "seat_left", "slot")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.guard = threading.Lock()
        self.abandoned = False
        self.seat: int | None = None
        self.seat_left = False
        self.slot: int | None = None


class SharedSlots:
    """The slots of one region, shared with every process that maps it; a ``SlotSource``.

    Args:
        region_name: The region's name (its file is ``/dev/shm/<region_name>``).
        header: The region's header.
        capacity: Slots the region has room for (the pool's size is the header's).
        model: Used in error messages.
    """

    def __init__(
        self, region_name: str, header: RegionHeader, capacity: int, *, model: str = ""
    ) -> None:
        self.capacity = capacity
        self.name = model
        self._region_name = region_name
        self._header = header
        # Descriptors are opened anew from this one, so they work after the name is unlinked.
        self._base_fd = os.open(SHM_DIR / region_name, os.O_RDWR | os.O_CLOEXEC)
        self._free_fds: list[int] = []
        self._held: dict[int, int] = {}  # slot -> the descriptor holding its lock
        self._kept: dict[int, str] = {}  # held slots only a lease's arrays keep -> its site
        self._mutex = threading.Lock()
        self._all_back = threading.Condition(self._mutex)
        self._waiting = 0
        self._next = os.getpid()  # where this process starts looking: spreads processes
        self._closed = False
        #: The takes counted when every slot was last seen free and no caller queued (``-1``:
        #: not so at the last look), see :meth:`node_stats`.
        self._quiet_at = -1
        _instances.add(self)

    @property
    def size(self) -> int:
        """Slots in use now, over every process (the header's word)."""
        return self._header.size

    def region_removed(self) -> bool:
        """Whether the region's file is gone from ``/dev/shm``: its owner released it, or
        died and was reclaimed (callers by value, whom Triton never tells, ask this)."""
        return os.fstat(self._base_fd).st_nlink == 0

    # ---------------------------------------------------------------- SlotSource

    def acquire(self, timeout_s: float | None = None) -> int:
        """Takes a slot, waiting up to ``timeout_s`` seconds (``None``: as long as it takes).

        Raises:
            SlotTimeoutError: no slot came free in time.
            OverloadedError: ``max_waiting`` callers already wait.
            ForeignRegionError: no slot was taken, and the header lost this layout's stamp
                (something wrote over it): checked before either error above, which its words
                could have caused.
            ClientClosedError: the pool was closed.
        """
        fd, slot = self._fd_and_free_slot()
        if slot is not None:
            return slot
        if timeout_s is None and not self._kept:
            slot = self._queue(fd, None)
            assert slot is not None  # only a wait given up returns none
            return slot
        # On a thread: a wait in the kernel cannot be interrupted, to time out or to warn.
        wait = _Wait(fd)
        future = in_wait_thread(lambda: self._queue_for(wait))
        first_s = KEPT_WARNING_S if timeout_s is None else min(timeout_s, KEPT_WARNING_S)
        try:
            try:
                return future.result(first_s)
            except concurrent.futures.TimeoutError:
                if first_s != KEPT_WARNING_S:
                    raise
                self._warn_if_kept()
            return future.result(None if timeout_s is None else timeout_s - first_s)
        except concurrent.futures.TimeoutError:
            self._abandon(wait, future)
            raise self._timeout(timeout_s) from None
        except BaseException:
            self._abandon(wait, future)
            raise

    def try_acquire(self) -> int | None:
        """Takes a free slot if there is one nobody queues for, without waiting.

        Raises:
            ClientClosedError: the pool was closed.
        """
        fd, slot = self._fd_and_free_slot()
        if slot is None:
            self._put_fd(fd)
        return slot

    async def acquire_async(self, timeout_s: float | None = None) -> int:
        """:meth:`acquire` for coroutines: waits on a thread, never on the event loop.
        Cancelling never loses a slot."""
        fd, slot = self._fd_and_free_slot()
        if slot is not None:
            return slot
        wait = _Wait(fd)
        future = in_wait_thread(lambda: self._queue_for(wait))
        started = time.monotonic()
        try:
            waited = asyncio.wrap_future(future)
            first_s = KEPT_WARNING_S if timeout_s is None else min(timeout_s, KEPT_WARNING_S)
            await asyncio.wait({waited}, timeout=first_s)  # leaves it pending
            if not waited.done() and first_s == KEPT_WARNING_S:
                self._warn_if_kept()
            left_s = None if timeout_s is None else timeout_s - (time.monotonic() - started)
            return await asyncio.wait_for(waited, left_s)
        except asyncio.TimeoutError:
            self._abandon(wait, future)
            raise self._timeout(timeout_s) from None
        except BaseException:
            self._abandon(wait, future)
            raise

    def release(self, slot: int) -> None:
        """Gives a slot back; the first caller queued on it gets it."""
        with self._mutex:
            fd = self._held[slot]
        self._header.set_busy_since(slot, 0)
        unlock_byte(fd, slot)
        with self._mutex:
            if self._held.get(slot) == fd:  # else another thread took the slot just now
                del self._held[slot]
                self._kept.pop(slot, None)
            if self._held.keys() <= self._kept.keys():
                self._all_back.notify_all()
            last = self._closed and not self._held and self._base_fd >= 0
            if last:  # closed while slots were kept: the last one came back
                base, self._base_fd = self._base_fd, -1
        self._put_fd(fd)
        if last:
            os.close(base)

    def keep(self, slot: int, site: str) -> None:
        """Marks a slot this process holds as kept by a lease's arrays only (made at
        ``site``): Triton is done with it, its lock stays until :meth:`release`."""
        self._header.set_busy_since(slot, 0)  # no request of it left in Triton
        with self._mutex:
            if slot in self._held:
                self._kept[slot] = site
                self._all_back.notify_all()

    def abandon(self, slot: int) -> None:
        """Gives a slot back whose header already says it is abandoned: it stays out of use
        until the owner proves Triton done with it."""
        self.release(slot)

    def settled(self, slot: int) -> None:
        """Nothing to do: the header, which the owner cleared, is what callers read."""

    def stats(self) -> PoolStats:
        """This process's share: slots it holds and its callers waiting."""
        with self._mutex:
            held, waiting = len(self._held), self._waiting
        return PoolStats(self.size, held, waiting, len(self._header.abandoned_slots()))

    def close(self, *, wait_s: float | None = None) -> bool:
        """Refuses new callers and waits for this process's slots to come back, but not for
        those only a lease's arrays keep (:meth:`keep`): they come back when the arrays go.

        Callers already asleep in the kernel get :class:`ClientClosedError` once a slot
        reaches them.

        Returns:
            Whether every slot this process held is back, kept ones included.
        """
        with self._mutex:
            self._closed = True
            self._all_back.wait_for(lambda: self._held.keys() <= self._kept.keys(), wait_s)
            all_back = not self._held
            fds, self._free_fds = self._free_fds, []
            if all_back:
                fds.append(self._base_fd)
                self._base_fd = -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)
        return all_back

    # ---------------------------------------------------------------- node-wide view

    def node_stats(self) -> NodeSlotStats:
        """Slots held and callers queued over every process (seen through the locks).

        Raises:
            ClientClosedError: the pool was closed.
        """
        takes = self._header.takes()
        if takes == self._quiet_at:
            # Nobody took a slot since every slot was seen free and nobody queued: still so
            # (a caller queues only behind holders, and holders take first). The owner reads
            # this several times a second: a quiet node costs no lock probes.
            self._check_open()
            return NodeSlotStats(0, 0, len(self._header.abandoned_slots()))
        fd = self._open_fd()
        try:
            in_use = sum(locked_by_another(fd, slot) for slot in range(self.capacity))
            seats = range(self._header.max_waiting)
            waiting = sum(locked_by_another(fd, _SEAT0 + seat) for seat in seats)
        finally:
            os.close(fd)
        self._quiet_at = takes if in_use == waiting == 0 else -1
        return NodeSlotStats(in_use, waiting, len(self._header.abandoned_slots()))

    #: Every process on the machine takes slots: holders may die unseen (the owner sweeps).
    shared = True

    def sweep(self) -> None:
        """Abandons the slots of holders that died mid-request, and clears the seats of waiters
        that died (the owner calls this now and then; callers also find both themselves).

        Raises:
            ClientClosedError: the pool was closed.
        """
        busy, seats = self._header.busy_slots(), self._header.queued_seats()
        if not busy and not seats:
            self._check_open()
            return  # nobody to look for: no lock to try (the owner sweeps a few times a second)
        fd = self._open_fd()
        try:
            for slot in busy:
                if slot < self.capacity and lock_byte(fd, slot, wait=False):
                    self._check_dead_holder(slot)
                    unlock_byte(fd, slot)
            for seat in seats:
                self._clear_if_dead(fd, seat)
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- the owner's scaler

    def demand(self) -> tuple[int, int]:
        """Slots held and callers queued, over every process."""
        now = self.node_stats()
        return now.in_use, now.waiting

    def resize(self, size: int) -> None:
        """Nothing to do: callers read the pool's size in the header, which the owner set."""

    def each_idle(self, slots: Iterable[int], fn: Callable[[int], None]) -> None:
        """Calls ``fn(slot)`` for each of ``slots`` beyond the pool's size that nobody holds
        and that is not abandoned, holding its lock meanwhile: a caller that queued on it
        gets it afterwards, sees it beyond the size, and queues again."""
        fd = self._open_fd()
        try:
            for slot in slots:
                if not lock_byte(fd, slot, wait=False):
                    continue
                try:
                    if self._check_dead_holder(slot) or self._header.abandoned_since(slot):
                        continue  # Triton may still write there: settled first
                    if slot >= self._header.size:
                        fn(slot)
                finally:
                    unlock_byte(fd, slot)
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- taking slots

    def _fd_and_free_slot(self) -> tuple[int, int | None]:
        """A descriptor of this caller's, and a free slot nobody queues for locked on it (or
        ``None``)."""
        fd = self._take_fd()
        try:
            return fd, self._take_free(fd)
        except BaseException:
            self._discard_fd(fd)
            raise

    def _take_free(self, fd: int) -> int | None:
        """A free slot nobody waits for, locked on ``fd``, or ``None``."""
        queued = self._header.queued()
        self._next += 1
        size = self._header.size
        for k in range(size):
            slot = (self._next + k) % size
            if self._header.abandoned_since(slot) or not lock_byte(fd, slot, wait=False):
                continue
            # Free: it is ours, unless a live caller queues for it (it is being woken).
            if queued[slot] and self._live_waiter_on(fd, slot):
                unlock_byte(fd, slot)
                continue
            if self._claim(fd, slot):
                return slot
        return None

    def _live_waiter_on(self, fd: int, slot: int) -> bool:
        """Whether a live caller queues for ``slot``; clears the seats of dead ones."""
        live = False
        for seat in range(self._header.max_waiting):
            if self._header.queued_on(seat) == slot and not self._clear_if_dead(fd, seat):
                live = True
        return live

    def _clear_if_dead(self, fd: int, seat: int) -> bool:
        """Clears ``seat``'s queue entry if its holder is gone; whether it was."""
        if locked_by_another(fd, _SEAT0 + seat):
            return False  # a live waiter: the common case, decided with no lock taken
        # Seats are only taken under _MUTEX (see _take_seat): holding it, a free seat stays
        # free while its stale entry is cleared, and no seat is ever locked by a non-waiter.
        lock_byte(fd, _MUTEX, wait=True)
        try:
            if locked_by_another(fd, _SEAT0 + seat):
                return False
            self._header.queue(seat, None)
        finally:
            unlock_byte(fd, _MUTEX)
        return True

    def _queue(self, fd: int, wait: _Wait | None) -> int | None:
        """Queues for a slot and sleeps in the kernel until it is this caller's; ``None`` if
        ``wait`` was given up before this caller queued."""
        with self._mutex:
            self._waiting += 1
        started = time.monotonic_ns()
        try:
            seat = self._take_seat(fd, wait)
            try:
                while True:
                    slot = self._pick()
                    if not self._record(seat, slot, wait):
                        return None
                    lock_byte(fd, slot, wait=True)
                    self._record(seat, None, wait)
                    if self._claim(fd, slot):
                        self._header.count_wait(slot, time.monotonic_ns() - started)
                        return slot
            finally:
                self._leave_seat(fd, seat, wait)
        except BaseException:
            self._discard_fd(fd)  # closing it drops whatever lock it may hold
            raise
        finally:
            with self._mutex:
                self._waiting -= 1

    def _queue_for(self, wait: _Wait) -> int:
        """:meth:`_queue` on a wait thread; a slot that comes after its caller gave up goes
        straight back."""
        slot = self._queue(wait.fd, wait)
        if slot is None:
            self._put_fd(wait.fd)
            return -1
        with wait.guard:
            if not wait.abandoned:
                wait.slot = slot
                return slot
        self.release(slot)
        return -1

    def _abandon(self, wait: _Wait, future: concurrent.futures.Future[int]) -> None:
        """The caller gives up: its seat goes at once; a slot that comes goes back."""
        if future.cancel():  # never started: its descriptor is ours again
            self._put_fd(wait.fd)
            return
        with wait.guard:
            wait.abandoned = True
            slot, wait.slot = wait.slot, None
            if wait.seat is not None and not wait.seat_left:
                # Locks belong to the descriptor, not the thread: any thread may let go.
                self._header.queue(wait.seat, None)
                unlock_byte(wait.fd, _SEAT0 + wait.seat)
                wait.seat_left = True
        if slot is not None:  # it came just as the caller gave up
            self.release(slot)

    def _take_seat(self, fd: int, wait: _Wait | None) -> int:
        """A seat for a caller about to queue, locked on ``fd``.

        Raises:
            OverloadedError: every seat is taken.
            ForeignRegionError: every seat is taken, and the header lost this layout's stamp.
        """
        seats = self._header.max_waiting
        # Seats are taken only under _MUTEX, and left at any time: so a scan that finds every
        # seat taken saw them all taken at once. Without it, seats checked one after another
        # while waiters come and go could each look taken with fewer than max_waiting waiting.
        lock_byte(fd, _MUTEX, wait=True)
        try:
            for k in range(seats):  # each process starts elsewhere: fewer seats found taken
                seat = (self._next + k) % seats
                if lock_byte(fd, _SEAT0 + seat, wait=False):
                    if wait is not None:
                        with wait.guard:
                            wait.seat = seat
                    return seat
            # Every seat taken: unless these words are not the owner's (written over: their
            # max_waiting is nobody's limit, and nothing is counted into them).
            self._header.check(model=self.name)
            self._header.count_failure("overloaded")
        finally:
            unlock_byte(fd, _MUTEX)
        raise OverloadedError(
            f"{seats} callers already wait for one of the {self.size} slots "
            f"of {self.name!r} on this machine; slow down, or allow more with more slots or a "
            "larger max_waiting",
            model=self.name,
        )

    def _record(self, seat: int, slot: int | None, wait: _Wait | None) -> bool:
        """Records the slot ``seat`` queues on, unless its caller gave the seat up."""
        if wait is None:
            self._header.queue(seat, slot)
            return True
        with wait.guard:
            if wait.seat_left:
                return False
            self._header.queue(seat, slot)
            return True

    def _leave_seat(self, fd: int, seat: int, wait: _Wait | None) -> None:
        if wait is not None:
            with wait.guard:
                if wait.seat_left:
                    return
                wait.seat_left = True
        self._header.queue(seat, None)
        unlock_byte(fd, _SEAT0 + seat)

    def _pick(self) -> int:
        """The slot with the fewest callers queued, among those not abandoned.

        Raises:
            RegionReplacedError: every slot waits for Triton, and the region's owner is gone.
            ForeignRegionError: every slot looks abandoned, and the header is not ours.
        """
        while True:
            queued = self._header.queued()
            best: int | None = None
            size = self._header.size
            for k in range(size):
                slot = (self._next + k) % size
                if self._header.abandoned_since(slot):
                    continue
                if best is None or queued[slot] < queued[best]:
                    best = slot
            if best is not None:
                return best
            # Every slot waits for Triton, until the owner settles them: unless it is gone, or
            # these words are not the owner's (written over: nobody would ever settle them).
            self._header.check(model=self.name)
            if owner_state(self._region_name) == DEAD:
                raise RegionReplacedError(
                    f"the owner of the region of {self.name!r} is gone (the Ray node actor "
                    "restarted?) with every slot waiting for Triton; bind again",
                    model=self.name,
                )
            time.sleep(_ALL_ABANDONED_POLL_S)

    def _claim(self, fd: int, slot: int) -> bool:
        """Makes a slot just locked on ``fd`` this caller's, unless it is abandoned (its last
        holder may have died with a request in flight: then it is unlocked), beyond the pool's
        size (it shrank), or the pool was closed."""
        if self._check_dead_holder(slot) or self._header.abandoned_since(slot):
            unlock_byte(fd, slot)
            return False
        if slot >= self._header.size:
            unlock_byte(fd, slot)
            return False
        with self._mutex:
            closed = self._closed
            if not closed:
                self._held[slot] = fd
        if closed:
            unlock_byte(fd, slot)
            raise ClientClosedError(f"the slot pool of {self.name!r} is closed", model=self.name)
        return True

    def _check_dead_holder(self, slot: int) -> bool:
        """With ``slot`` locked: abandons it if its last holder died with a request sent."""
        since = self._header.busy_since(slot)
        if not since:
            return False
        self._header.abandon(slot, since)
        return True

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The region's mutex, over every process on the node."""
        fd = self._take_fd()
        lock_byte(fd, _MUTEX, wait=True)
        try:
            yield
        finally:
            unlock_byte(fd, _MUTEX)
            self._put_fd(fd)

    # ---------------------------------------------------------------- descriptors

    def _open_fd(self) -> int:
        """A new open file description of the region's file (locks are per description)."""
        with self._mutex:
            self._check_open()
            return os.open(f"/proc/self/fd/{self._base_fd}", os.O_RDWR | os.O_CLOEXEC)

    def _check_open(self) -> None:
        if self._base_fd < 0:
            raise ClientClosedError(f"the slot pool of {self.name!r} is closed", model=self.name)

    def _take_fd(self) -> int:
        with self._mutex:
            if self._closed:
                raise ClientClosedError(
                    f"the slot pool of {self.name!r} is closed", model=self.name
                )
            if self._free_fds:
                return self._free_fds.pop()
        return self._open_fd()

    def _discard_fd(self, fd: int) -> None:
        with self._mutex:
            for slot in [s for s, held in self._held.items() if held == fd]:
                del self._held[slot]
                self._kept.pop(slot, None)
            if self._held.keys() <= self._kept.keys():
                self._all_back.notify_all()
        os.close(fd)

    def _put_fd(self, fd: int) -> None:
        with self._mutex:
            if not self._closed:
                self._free_fds.append(fd)
                return
        os.close(fd)

    def _forget_after_fork(self) -> None:
        """In a forked child: closes every inherited descriptor, and refuses callers."""
        fds = [self._base_fd, *self._free_fds, *self._held.values()]
        self._mutex = threading.Lock()
        self._all_back = threading.Condition(self._mutex)
        self._base_fd, self._free_fds, self._held, self._kept = -1, [], {}, {}
        self._waiting, self._closed = 0, True
        for fd in set(fds):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass  # a wait thread's descriptor, already gone

    def _kept_here(self) -> dict[int, str]:
        with self._mutex:
            return {slot: site for slot, site in self._kept.items() if slot < self.size}

    def _warn_if_kept(self) -> None:
        warn_kept(self.name, KEPT_WARNING_S, self._kept_here())

    def _timeout(self, timeout_s: float | None) -> SlotTimeoutError:
        """The error of a caller that found no free slot in time.

        Raises:
            ForeignRegionError: the header lost this layout's stamp meanwhile (written over:
                its words, not the load, may have kept every slot from this caller).
        """
        self._header.check(model=self.name)
        return SlotTimeoutError(
            f"no free slot for model {self.name!r} within {timeout_s} s (all {self.size} slots "
            f"of this machine busy){kept_note(self._kept_here())}",
            model=self.name,
            timeout_s=timeout_s,
        )
