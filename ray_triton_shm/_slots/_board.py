"""Batches of several callers' rows in one slot, formed by any process on the machine: each
slot's board (its words in the region's header, see :meth:`.RegionHeader.board`) and the byte
locks that order its members.

A batch lives in one slot. Its **leader** took the slot and opened the batch; **members** join
it while it is open, each reserving the next rows, writing its inputs there and waiting for the
leader to send one request for all the rows and to record Triton's answer. Every word of a
board is written under the board's mutex (a byte lock) or by the batch's leader alone, and read
as possibly another writer's: a number out of its range reads as a lost batch, never past the
board. The locks, each on one byte of the region's file (see :mod:`._locks`):

* **answer** (a slot's): the leader holds it from opening until the answer (or the error) is
  recorded; members wait for it shared. A leader that dies lets them go at once, and they find
  the batch lost, not answered, and send their rows again;
* **readers** (a slot's): each member holds it shared from joining until it has read its rows
  (or given up); the leader takes it before giving the slot back, so that no member reads a
  slot that another batch writes. A member that dies lets go of it;
* **writer** (one per member): a member holds it while it writes its rows; the leader waits for
  each before sending. A member that dies lets go of it with its ``written`` word unset: its
  rows go out as they are, and their answer is dropped.

Join and open happen under the board's mutex, so a batch's rows and members only grow while it
is open, and a batch closed is never joined.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .._exceptions import ClientClosedError
from ._header import BOARD_WORDS, RegionHeader
from ._locks import in_wait_thread, lock_byte, locked_by_another, unlock_byte
from ._shm import SHM_DIR

__all__ = [
    "MAX_MEMBERS",
    "MAX_OUTPUTS",
    "MAX_ROW_DIMS",
    "BatchBoard",
    "BatchState",
    "LockWait",
    "Seat",
]

#: Most members of one batch (besides its leader).
MAX_MEMBERS = 64
#: Most outputs a model may have to be batched on the node.
MAX_OUTPUTS = 16
#: Most dims of one row of an output.
MAX_ROW_DIMS = 7

# Board words.
_STATE, _GENERATION, _KEY, _ROWS, _CAPACITY, _MEMBERS, _OPENED_NS, _SENT_NS = range(8)
_STATUS_BYTES, _MESSAGE_BYTES = 8, 9
_MEMBER0, _MEMBER_WORDS = 16, 3  # start, rows, written
_OUTPUT0 = _MEMBER0 + MAX_MEMBERS * _MEMBER_WORDS
_OUTPUT_WORDS = 1 + MAX_ROW_DIMS  # ndim, dims
_TEXT0 = _OUTPUT0 + MAX_OUTPUTS * _OUTPUT_WORDS
_TEXT_BYTES = (BOARD_WORDS - _TEXT0) * 8
assert _TEXT_BYTES >= 512, "the board has too little room for Triton's error"

# Lock bytes, past the slots', seats' and the region mutex's (see _shared_slots).
_BOARD_MUTEX = 1 << 34
_STRIDE = 2 + MAX_MEMBERS


def _answer_byte(slot: int) -> int:
    return _BOARD_MUTEX + 1 + slot * _STRIDE


class BatchState(enum.IntEnum):
    """Where a slot's batch is (its board's ``state`` word)."""

    IDLE = 0
    #: Members may join.
    OPEN = 1
    #: Its leader waits for its members' rows.
    CLOSED = 2
    #: In Triton.
    SENT = 3
    #: Triton answered: each member reads its rows.
    ANSWERED = 4
    #: Triton refused it: each member gets the error.
    FAILED = 5
    #: Its leader gave it up before an answer: each member sends its rows again.
    LOST = 6


_OPEN = int(BatchState.OPEN)  # compared with a numpy column of words


@dataclass(eq=False)
class Seat:
    """One caller's place in a batch.

    Attributes:
        slot: The batch's slot.
        generation: The batch's generation on the slot (a batch later on it has another).
        start: The caller's first row in the slot.
        rows: Its rows.
        member: Its index among the members; ``-1`` for the leader.
        fd: The descriptor holding its locks.
    """

    slot: int
    generation: int
    start: int
    rows: int
    member: int
    fd: int

    @property
    def leader(self) -> bool:
        """Whether the caller leads the batch (took the slot, sends the request)."""
        return self.member < 0


class _Handoff:
    """Who closes a wait's descriptor: the caller, or the waiting thread if the caller gave
    up while it waits in the kernel (exactly one of them)."""

    __slots__ = ("fd", "finished", "given_up", "guard")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.guard = threading.Lock()
        self.finished = False
        self.given_up = False

    def run(self, wait: Callable[[int], bool]) -> bool:
        try:
            return wait(self.fd)
        finally:
            with self.guard:
                self.finished = True
                if self.given_up:
                    os.close(self.fd)

    def give_up(self, future: concurrent.futures.Future[bool]) -> None:
        with self.guard:
            self.given_up = True
            if self.finished or future.cancel():
                os.close(self.fd)


class LockWait:
    """A wait until a byte is free of conflicting locks (taken, then let go at once), with a
    timeout; on a descriptor of its own, which a wait given up leaves to its thread.

    Args:
        board: The board whose descriptors it uses.
        byte: The lock byte.
        shared: Whether to wait for writers alone (a shared lock), or for every holder.
        timeout_s: How long to wait (``None``: as long as it takes).
    """

    __slots__ = ("_board", "_byte", "_shared", "timeout_s")

    def __init__(
        self, board: BatchBoard, byte: int, *, shared: bool, timeout_s: float | None
    ) -> None:
        self._board = board
        self._byte = byte
        self._shared = shared
        self.timeout_s = timeout_s

    def _through(self, fd: int) -> bool:
        lock_byte(fd, self._byte, wait=True, shared=self._shared)
        unlock_byte(fd, self._byte)
        return True

    def wait(self) -> bool:
        """Blocks until the byte is free; ``False`` if :attr:`timeout_s` passed first."""
        fd = self._board.take_fd()
        if self.timeout_s is None:
            try:
                return self._through(fd)
            finally:
                self._board.put_fd(fd)
        handoff = _Handoff(fd)
        future = in_wait_thread(lambda: handoff.run(self._through))
        try:
            future.result(max(self.timeout_s, 0.0))
        except concurrent.futures.TimeoutError:
            handoff.give_up(future)
            return False
        except BaseException:
            handoff.give_up(future)
            raise
        self._board.put_fd(fd)
        return True

    async def wait_async(self) -> bool:
        """:meth:`wait` on the running event loop (the wait on a thread)."""
        fd = self._board.take_fd()
        handoff = _Handoff(fd)
        future = in_wait_thread(lambda: handoff.run(self._through))
        try:
            timeout_s = None if self.timeout_s is None else max(self.timeout_s, 0.0)
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout_s)
        except asyncio.TimeoutError:
            handoff.give_up(future)
            return False
        except BaseException:
            handoff.give_up(future)
            raise
        self._board.put_fd(fd)
        return True


_boards: weakref.WeakSet[BatchBoard] = weakref.WeakSet()


class BatchBoard:
    """The batch boards of one region's slots, and their locks.

    Args:
        header: The region's header (the boards are its words).
        region_name: The region's name (its file is ``/dev/shm/<region_name>``).
        model: Used in error messages.
    """

    def __init__(self, header: RegionHeader, region_name: str, *, model: str = "") -> None:
        self._header = header
        self._states = header.board_column(_STATE)
        self._keys = header.board_column(_KEY)
        self._model = model
        # Descriptors are opened anew from this one, so they work after the name is unlinked.
        self._base_fd = os.open(SHM_DIR / region_name, os.O_RDWR | os.O_CLOEXEC)
        self._free_fds: list[int] = []
        self._lock = threading.Lock()
        _boards.add(self)

    # ---------------------------------------------------------------- descriptors

    def take_fd(self) -> int:
        """A descriptor of the region's file of this caller's own (locks are per open file
        description).

        Raises:
            ClientClosedError: the board was closed.
        """
        with self._lock:
            if self._base_fd < 0:
                raise ClientClosedError(f"the pool of {self._model!r} is closed", model=self._model)
            if self._free_fds:
                return self._free_fds.pop()
            return os.open(f"/proc/self/fd/{self._base_fd}", os.O_RDWR | os.O_CLOEXEC)

    def put_fd(self, fd: int) -> None:
        """Gives a descriptor back (it holds no lock any more)."""
        with self._lock:
            if self._base_fd >= 0:
                self._free_fds.append(fd)
                return
        os.close(fd)

    def close(self) -> None:
        """Closes the idle descriptors (idempotent); those in use close when given back."""
        with self._lock:
            fds, self._free_fds = [self._base_fd, *self._free_fds], []
            self._base_fd = -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def _forget_after_fork(self) -> None:
        """In a forked child: closes the inherited descriptors (they share the parent's open
        file descriptions, whose locks live on in the parent), and refuses callers."""
        fds = [self._base_fd, *self._free_fds]
        self._lock = threading.Lock()
        self._base_fd, self._free_fds = -1, []
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    @contextlib.contextmanager
    def _mutex(self, fd: int) -> Iterator[None]:
        lock_byte(fd, _BOARD_MUTEX, wait=True)
        try:
            yield
        finally:
            unlock_byte(fd, _BOARD_MUTEX)

    # ---------------------------------------------------------------- joining and opening

    def any_open(self, size: int) -> bool:
        """Whether a batch is open on one of the first ``size`` slots (a look at a word each,
        without the mutex)."""
        return bool((self._states[:size] == _OPEN).any())

    def join(self, key: int, rows: int, size: int) -> Seat | None:
        """Reserves ``rows`` in an open batch of ``key`` with room for them, on one of the
        first ``size`` slots; ``None`` if there is none."""
        # A look without the mutex first: a caller alone takes no lock. Under the mutex the
        # look again (batches opened meanwhile count), and only those seen open are tried:
        # its holder keeps every other caller waiting.
        if not self._open_of(key, size).size:
            return None
        fd = self.take_fd()
        try:
            with self._mutex(fd):
                for slot in self._open_of(key, size).tolist():
                    seat = self._reserve(fd, slot, key, rows)
                    if seat is not None:
                        return seat
        except BaseException:
            self.put_fd(fd)
            raise
        self.put_fd(fd)
        return None

    def _open_of(self, key: int, size: int) -> np.ndarray:
        """The slots among the first ``size`` with an open batch of ``key``, as last written."""
        return np.flatnonzero((self._states[:size] == _OPEN) & (self._keys[:size] == key))

    def _reserve(self, fd: int, slot: int, key: int, rows: int) -> Seat | None:
        word = self._header.board(slot)
        members, start = word[_MEMBERS], word[_ROWS]
        if (
            word[_STATE] != BatchState.OPEN
            or word[_KEY] != key
            or not 0 <= members < MAX_MEMBERS
            or not 0 <= start <= word[_CAPACITY] - rows
            or not locked_by_another(fd, _answer_byte(slot))  # its leader died
        ):
            return None
        answer = _answer_byte(slot)
        if not lock_byte(fd, answer + 2 + members, wait=False):
            return None  # a member of an earlier batch still writes (it cannot: stray words)
        if not lock_byte(fd, answer + 1, wait=False, shared=True):
            unlock_byte(fd, answer + 2 + members)
            return None
        at = _MEMBER0 + members * _MEMBER_WORDS
        word[at], word[at + 1], word[at + 2] = start, rows, 0
        word[_ROWS] = start + rows
        word[_MEMBERS] = members + 1
        return Seat(slot, word[_GENERATION], start, rows, members, fd)

    def open(self, slot: int, key: int, rows: int, capacity: int) -> Seat:
        """Opens a batch of ``key`` on ``slot`` (held by the caller), its first ``rows`` the
        leader's, for at most ``capacity`` rows."""
        fd = self.take_fd()
        word = self._header.board(slot)
        try:
            with self._mutex(fd):
                lock_byte(fd, _answer_byte(slot), wait=True)
                generation = (word[_GENERATION] + 1) % (1 << 62)
                word[_GENERATION] = generation
                word[_KEY], word[_ROWS], word[_CAPACITY], word[_MEMBERS] = key, rows, capacity, 0
                word[_OPENED_NS] = word[_SENT_NS] = time.monotonic_ns()
                word[_STATE] = BatchState.OPEN
        except BaseException:
            unlock_byte(fd, _answer_byte(slot))
            self.put_fd(fd)
            raise
        return Seat(slot, generation, 0, rows, -1, fd)

    # ---------------------------------------------------------------- the leader's

    def opened_ns(self, seat: Seat) -> int:
        """When the seat's batch opened (``time.monotonic_ns``)."""
        return self._header.board(seat.slot)[_OPENED_NS]

    def full(self, seat: Seat) -> bool:
        """Whether nobody can join the seat's batch any more."""
        word = self._header.board(seat.slot)
        return word[_ROWS] >= word[_CAPACITY] or word[_MEMBERS] >= MAX_MEMBERS

    def forming(self, size: int) -> list[tuple[int, int, int]]:
        """The open batches among the first ``size`` slots: each one's slot, rows and members
        (besides its leader), as last written."""
        boards = [(slot, self._header.board(slot)) for slot in range(size)]
        return [
            (slot, word[_ROWS], word[_MEMBERS])
            for slot, word in boards
            if word[_STATE] == BatchState.OPEN
        ]

    def answer_wait(self, slot: int, timeout_s: float | None) -> LockWait:
        """A wait for the batch on ``slot`` to be answered (or given up)."""
        return LockWait(self, _answer_byte(slot), shared=True, timeout_s=timeout_s)

    def seal(self, seat: Seat) -> int:
        """Closes the seat's batch to newcomers; returns its members."""
        word = self._header.board(seat.slot)
        with self._mutex(seat.fd):
            word[_STATE] = BatchState.CLOSED
            return min(max(word[_MEMBERS], 0), MAX_MEMBERS)

    def writer_wait(self, seat: Seat, member: int) -> LockWait:
        """A wait for a member to have written its rows (or died)."""
        byte = _answer_byte(seat.slot) + 2 + member
        return LockWait(self, byte, shared=False, timeout_s=None)

    def members(self, seat: Seat) -> list[tuple[int, int, bool]]:
        """Each member's first row, rows and whether it wrote them."""
        word = self._header.board(seat.slot)
        count = min(max(word[_MEMBERS], 0), MAX_MEMBERS)
        return [
            (word[at], word[at + 1], word[at + 2] == 1)
            for at in range(_MEMBER0, _MEMBER0 + count * _MEMBER_WORDS, _MEMBER_WORDS)
        ]

    def rows(self, seat: Seat) -> int:
        """Rows reserved in the seat's batch."""
        return self._header.board(seat.slot)[_ROWS]

    def sent(self, seat: Seat) -> None:
        """Records that the batch is in Triton."""
        word = self._header.board(seat.slot)
        word[_SENT_NS] = time.monotonic_ns()
        word[_STATE] = BatchState.SENT

    def answered(self, seat: Seat, row_shapes: Sequence[tuple[int, ...] | None]) -> None:
        """Records the shape of one row of each output (``None``: not answered), in the
        model's order, and lets the members read."""
        word = self._header.board(seat.slot)
        for index, shape in enumerate(row_shapes):
            at = _OUTPUT0 + index * _OUTPUT_WORDS
            word[at] = -1 if shape is None else len(shape)
            for d, dim in enumerate(shape or ()):
                word[at + 1 + d] = dim
        self._end(seat, BatchState.ANSWERED)

    def failed(self, seat: Seat, status: str, message: str) -> None:
        """Records Triton's error for the batch, for each member to raise."""
        word = self._header.board(seat.slot)
        status_bytes = status.encode()[:64]
        message_bytes = message.encode()[: _TEXT_BYTES - len(status_bytes)]
        raw = (status_bytes + message_bytes).ljust(_TEXT_BYTES, b"\0")
        words = memoryview(raw).cast("q")
        for i in range(len(words)):
            word[_TEXT0 + i] = words[i]
        word[_STATUS_BYTES], word[_MESSAGE_BYTES] = len(status_bytes), len(message_bytes)
        self._end(seat, BatchState.FAILED)

    def lost(self, seat: Seat) -> None:
        """Gives the batch up before its answer: each member sends its rows again."""
        self._end(seat, BatchState.LOST)

    def _end(self, seat: Seat, state: BatchState) -> None:
        self._header.board(seat.slot)[_STATE] = state
        unlock_byte(seat.fd, _answer_byte(seat.slot))

    def readers_wait(self, seat: Seat) -> LockWait:
        """A wait for every member to have read its rows (or given up, or died)."""
        return LockWait(self, _answer_byte(seat.slot) + 1, shared=False, timeout_s=None)

    def done(self, seat: Seat) -> None:
        """The leader is done with the batch (its slot is given back next)."""
        self.put_fd(seat.fd)

    # ---------------------------------------------------------------- the members'

    def written(self, seat: Seat, ok: bool) -> None:
        """A member wrote its rows (``ok``), or failed to: the leader may send them."""
        word = self._header.board(seat.slot)
        if ok and word[_GENERATION] == seat.generation:
            word[_MEMBER0 + seat.member * _MEMBER_WORDS + 2] = 1
        unlock_byte(seat.fd, _answer_byte(seat.slot) + 2 + seat.member)

    def outcome(self, seat: Seat) -> BatchState:
        """How the member's batch ended (:attr:`BatchState.LOST` for anything but an answer
        or an error of this batch)."""
        word = self._header.board(seat.slot)
        state = word[_STATE]
        if word[_GENERATION] != seat.generation or state not in (
            BatchState.ANSWERED,
            BatchState.FAILED,
        ):
            return BatchState.LOST
        return BatchState(state)

    def row_shapes(self, seat: Seat, count: int) -> list[tuple[int, ...] | None] | None:
        """The shape of one row of each of the model's ``count`` outputs, as the leader
        recorded them; ``None`` if the words are out of range (read as a lost batch)."""
        word = self._header.board(seat.slot)
        shapes: list[tuple[int, ...] | None] = []
        for index in range(min(count, MAX_OUTPUTS)):
            at = _OUTPUT0 + index * _OUTPUT_WORDS
            ndim = word[at]
            if ndim == -1:
                shapes.append(None)
                continue
            if not 0 <= ndim <= MAX_ROW_DIMS:
                return None
            dims = tuple(word[at + 1 : at + 1 + ndim].tolist())
            if any(d < 0 for d in dims):
                return None
            shapes.append(dims)
        return shapes

    def error(self, seat: Seat) -> tuple[str, str]:
        """Triton's status and message for the member's failed batch."""
        word = self._header.board(seat.slot)
        raw = word[_TEXT0:].tobytes()
        status_len = min(max(word[_STATUS_BYTES], 0), len(raw))
        message_len = min(max(word[_MESSAGE_BYTES], 0), len(raw) - status_len)
        status = raw[:status_len].decode(errors="replace")
        message = raw[status_len : status_len + message_len].decode(errors="replace")
        return status, message

    def leave(self, seat: Seat) -> None:
        """The member is done with the batch: the slot may be used again."""
        with contextlib.suppress(OSError):
            unlock_byte(seat.fd, _answer_byte(seat.slot) + 1)
        self.put_fd(seat.fd)


def _after_fork_in_child() -> None:
    for board in list(_boards):
        board._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
