"""The header at the start of every region: what every process using the region can see.

A region is shared by its owner and, in the Ray layer, by every process on the node that takes
its slots (see :mod:`._shared_slots`). The header lets them coordinate and count without a
single message. Each word has one writer at a time, so no two processes race on a word:

* the owner's settings: ``max_waiting`` (seats for waiting callers), where the slots' bytes
  live (system or GPU memory, see :mod:`._memory`), and the ``retired`` flag:
  set once the model's pool moved to a new region (the model changed on Triton), after which
  nobody sends a request on this region's slots;
* the pool's size (see :mod:`.._pools._scaling`): the region has room for ``slot_count`` slots, of
which slots ``0 .. size-1`` are in use now; its bounds, what stopped it growing, and how often it
  grew and shrank (written by the owner's scaler);
* failed calls by kind (any process counts one, holding the region's mutex);
* one seat per waiting caller: the slot it queues on (written by the seat's holder);
* per slot, written by the slot's current holder: when it sent a request on it
  (``busy_since``, zero while free), since when the slot waits for Triton to finish a request
  that was abandoned (``abandoned_since``, cleared by whoever proves Triton done, see
  :mod:`.._pools._abandoned`), and the counters (requests, samples, bytes in and out, errors, queued
  waits for the slot and their total, abandoned requests, how long their slots waited for
  Triton, latency) with three histograms (wait, settle, latency).

Counting in the header keeps metrics free of any message per request: the Ray node actor reads
them every second and exports them (see :mod:`..ray._actor`).

Layout, native ``int64`` words: ``[0:16]`` settings and node-wide words, ``[16:32]`` failures,
``[32:32+SEATS]`` seats, then :data:`_WORDS_PER_SLOT` words per slot. Words 9 and 10 stamp the
header as ours: :data:`MAGIC` and :data:`LAYOUT_VERSION` (written by the owner when it makes
the region, before anyone else maps it). A process refuses a region whose stamp is not its own
(:class:`~ray_triton_shm.ForeignRegionError`): another version of the library made it, or
something else wrote over it. Version 1 had no stamp (those words were zero).

Every word is read as possibly wrong (anyone of the same user can write into ``/dev/shm``): a
size, a number of seats or an index out of its range reads as its bound or as nothing, never
past the header, and a counter that would overflow wraps around.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._exceptions import ERROR_KINDS, ForeignRegionError
from ._specs import REGION_HEADER_BYTES

__all__ = [
    "BUCKET_BOUNDS_S",
    "HISTOGRAMS",
    "histogram_quantile_s",
    "LAYOUT_VERSION",
    "LIMITS",
    "MAGIC",
    "MAX_SEATS",
    "MAX_SLOTS",
    "BOARD_WORDS",
    "RegionHeader",
    "ROWS_BUCKET_BOUNDS",
    "ROWS_BUCKETS",
    "SlotCounters",
    "foreign_region_error",
    "header_version",
    "stamp_version",
]

# Settings and node-wide words.
_MAX_WAITING, _RETIRED, _MEMORY = 0, 1, 3
_SIZE, _MIN_SIZE, _LIMITED, _GROWS, _SHRINKS = 4, 5, 6, 7, 8
_MAGIC, _VERSION = 9, 10
#: The header's magic word: ``b"rtshmHDR"`` as a native ``int64`` (word 9).
MAGIC = int.from_bytes(b"rtshmHDR", sys.byteorder, signed=True)
#: The header's layout version (word 10): another is another library's layout, refused.
#: Version 1 (no stamp) was the layout before the stamp; 2 had no batches (see
#: :mod:`._board`); 3 is this one.
LAYOUT_VERSION = 3
#: Why a pool's growth stopped short of its callers, as the header word ``_LIMITED`` stores it.
LIMITS = ("", "max_slots", "shm_budget", "shm_full", "upscale_delay_s")
#: The kinds of memory a region's slots live in, as the header word ``_MEMORY`` stores them
#: (their index: other versions read it; ``"inline"`` is a pool by value's).
_MEMORY_KINDS = ("system", "cuda", "inline")
#: Failed calls by kind (see :func:`.._exceptions.error_kind`), one word each from ``_FAILURES``:
#: written by any process, under the region's mutex.
_FAILURES = 16
_FIRST_SEAT_WORD = _FAILURES + 16
#: Most callers that can wait for a slot of one region at once.
MAX_SEATS = 1024
_FIRST_SLOT_WORD = _FIRST_SEAT_WORD + MAX_SEATS
# Per-slot words.
_REQUESTS, _SAMPLES, _BYTES_IN, _BYTES_OUT, _ERRORS = 0, 1, 2, 3, 4
_WAITS, _WAIT_NS, _BUSY_SINCE, _ABANDONED_SINCE, _ABANDONS, _SETTLE_NS = 5, 6, 7, 8, 9, 10
_LATENCY_NS = 11
#: Histograms: bucket ``b`` counts durations up to ``_BUCKET0_NS * 2 ** (b / 2)``; the last
#: bucket counts every longer one. Of every request's wait for its slot (zero if one was
#: free), of how long abandoned slots waited for Triton, and of requests' latency (from the
#: caller's first wait to the answer read).
_BUCKETS = 40
_BUCKET0_NS = 16_000
_WAIT_BUCKETS = 12
_SETTLE_BUCKETS = _WAIT_BUCKETS + _BUCKETS
_LATENCY_BUCKETS = _SETTLE_BUCKETS + _BUCKETS
#: Rows per answered request: bucket ``b`` counts requests of up to ``2 ** b`` rows (the last,
#: any more).
_ROW_BUCKETS = _LATENCY_BUCKETS + _BUCKETS
ROWS_BUCKETS = 12
#: Node batches that waited for company (the model's earlier ones in Triton), and how long.
_COMPANY_WAITS = _ROW_BUCKETS + ROWS_BUCKETS
_COMPANY_WAIT_NS = _COMPANY_WAITS + 1
_WORDS_PER_SLOT = _COMPANY_WAIT_NS + 1
#: Each rows bucket's upper bound (the last has none).
ROWS_BUCKET_BOUNDS = (*(2**b for b in range(ROWS_BUCKETS - 1)), math.inf)
#: Words of each slot's batch board (see :mod:`._board`), after every slot's words.
BOARD_WORDS = 432
#: The histograms' names, as :meth:`RegionHeader.histograms` gives them.
HISTOGRAMS = {"wait": _WAIT_BUCKETS, "settle": _SETTLE_BUCKETS, "latency": _LATENCY_BUCKETS}
#: Most slots a region can have: as many as the header has words for.
MAX_SLOTS = (REGION_HEADER_BYTES // 8 - _FIRST_SLOT_WORD) // (_WORDS_PER_SLOT + BOARD_WORDS)
_FIRST_BOARD_WORD = _FIRST_SLOT_WORD + MAX_SLOTS * _WORDS_PER_SLOT


@dataclass(frozen=True)
class SlotCounters:
    """Totals over a region's slots.

    Attributes:
        requests: Requests Triton answered (one per chunk).
        samples: Samples in them.
        bytes_in: Input bytes written.
        bytes_out: Output bytes read.
        errors: Requests that failed.
        waits: Requests that had to wait for a slot.
        wait_ns: Nanoseconds they waited, in all.
        abandoned: Requests whose caller gave up (deadline, cancellation, death) while Triton
            may still have run them.
        settle_ns: Nanoseconds their slots waited for Triton to be done with them, in all.
        latency_ns: Nanoseconds answered requests took, from their caller's first wait for a
            slot to the answer read, in all.
    """

    requests: int = 0
    samples: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: int = 0
    waits: int = 0
    wait_ns: int = 0
    abandoned: int = 0
    settle_ns: int = 0
    latency_ns: int = 0


def _slot_word(slot: int, field: int) -> int:
    return _FIRST_SLOT_WORD + slot * _WORDS_PER_SLOT + field


class RegionHeader:
    """Typed access to a region's header.

    Args:
        buffer: The region's mapping (at least ``REGION_HEADER_BYTES`` long).
        slot_count: Slots the region has room for (at most :data:`MAX_SLOTS`).
        region: The region's name, for errors.

    The owner makes a region's header with :meth:`new` (stamped as this layout's), any other
    process with :meth:`open` (refused unless so stamped).
    """

    __slots__ = ("_region", "_slot_count", "_slots", "_word", "_words")

    def __init__(self, buffer: Any, slot_count: int, *, region: str = "") -> None:
        self._region = region
        self._slot_count = slot_count
        # Single words through a memoryview (a request touches a few: numpy's per-call cost
        # would dominate); sums over slots through numpy.
        self._word = memoryview(buffer)[:REGION_HEADER_BYTES].cast("q")
        self._words = np.frombuffer(buffer, np.int64, REGION_HEADER_BYTES // 8, 0)
        end = _FIRST_SLOT_WORD + slot_count * _WORDS_PER_SLOT
        self._slots = self._words[_FIRST_SLOT_WORD:end].reshape(slot_count, _WORDS_PER_SLOT)

    @classmethod
    def new(cls, buffer: Any, slot_count: int, *, region: str = "") -> RegionHeader:
        """The header of a region just made, stamped as this layout's (by its owner, before
        anyone else maps it)."""
        header = cls(buffer, slot_count, region=region)
        header._word[_MAGIC] = MAGIC
        header._word[_VERSION] = LAYOUT_VERSION
        return header

    @classmethod
    def open(
        cls, buffer: Any, slot_count: int, *, region: str, model: str | None = None
    ) -> RegionHeader:
        """The header of a region another process made.

        Raises:
            ForeignRegionError: the region is not of this layout (another version of the
                library made it, or something else wrote over its header), or too small to
                hold a header.
        """
        if len(memoryview(buffer).cast("B")) < REGION_HEADER_BYTES:
            raise foreign_region_error(region, None, model=model, why="it is too small")
        header = cls(buffer, slot_count, region=region)
        header.check(model=model)
        return header

    @property
    def intact(self) -> bool:
        """Whether the header still bears this layout's stamp (cheap: two words)."""
        word = self._word
        return word[_MAGIC] == MAGIC and word[_VERSION] == LAYOUT_VERSION

    @property
    def stopped(self) -> bool:
        """Whether a slot taken here must go back unused: the region is :attr:`retired`, or
        not :attr:`intact` (one read of three words: every call asks)."""
        word = self._word
        return word[_RETIRED] != 0 or word[_MAGIC] != MAGIC or word[_VERSION] != LAYOUT_VERSION

    def check(self, *, model: str | None = None) -> None:
        """Refuses a header that does not bear this layout's stamp.

        Raises:
            ForeignRegionError: naming the region, the version found and this one's.
        """
        if not self.intact:
            raise foreign_region_error(self._region, stamp_version(self._word), model=model)

    # ---------------------------------------------------------------- owner's settings

    def configure(self, *, max_waiting: int) -> None:
        """Sets the region's limits (its owner calls this before anyone else maps it)."""
        self._word[_MAX_WAITING] = min(max_waiting, MAX_SEATS)

    def set_memory(self, kind: str) -> None:
        """Records where the slots' bytes live (``"system"``, ``"cuda"``, or ``"inline"``: in
        the requests themselves, by value; by the owner)."""
        self._word[_MEMORY] = _MEMORY_KINDS.index(kind)

    @property
    def memory(self) -> str:
        """Where the slots' bytes live: ``"system"`` (after the header), ``"cuda"``, or
        ``"inline"`` (by value: in the requests)."""
        kind = self._word[_MEMORY]
        if 0 <= kind < len(_MEMORY_KINDS):
            return _MEMORY_KINDS[kind]
        raise foreign_region_error(
            self._region, stamp_version(self._word), why=f"its memory word is {kind}"
        )

    # ---------------------------------------------------------------- the pool's size

    @property
    def slot_count(self) -> int:
        """Slots the region has room for: the pool's largest size."""
        return self._slot_count

    @property
    def size(self) -> int:
        """Slots in use now: ``0 .. size-1`` (callers take no other; a word out of
        ``1 .. slot_count`` reads as :attr:`slot_count`)."""
        size = self._word[_SIZE]
        return size if 0 < size <= self._slot_count else self._slot_count

    def set_size(self, size: int) -> None:
        """Sets the pool's size (by the owner: after backing the slots it adds, before freeing
        the memory of those it takes out)."""
        old = self._word[_SIZE]
        self._word[_SIZE] = size
        if old and size > old:
            _add(self._word, _GROWS, 1)
        elif old and size < old:
            _add(self._word, _SHRINKS, 1)

    def set_bounds(self, min_size: int) -> None:
        """Records the pool's smallest size (its largest is :attr:`slot_count`)."""
        self._word[_MIN_SIZE] = min_size

    @property
    def min_size(self) -> int:
        """The pool's smallest size (its size, for a fixed pool)."""
        min_size, size = self._word[_MIN_SIZE], self.size
        return min_size if 0 < min_size <= size else size

    @property
    def limited_by(self) -> str:
        """What stopped the pool growing while callers wait (``""``: nothing): its
        ``"max_slots"``, the node's ``"shm_budget"``, ``"shm_full"`` (``/dev/shm`` had no
        room), or ``"upscale_delay_s"`` (callers waited, none that long on end)."""
        limit = self._word[_LIMITED]
        return LIMITS[limit] if 0 <= limit < len(LIMITS) else ""

    def set_limited_by(self, limit: str) -> None:
        """Records what stops the pool growing (``""``: nothing)."""
        self._word[_LIMITED] = LIMITS.index(limit)

    @property
    def resizes(self) -> tuple[int, int]:
        """How often the pool grew and shrank."""
        return self._word[_GROWS], self._word[_SHRINKS]

    @property
    def max_waiting(self) -> int:
        """Callers that may wait for a slot at once (the number of seats, at most
        :data:`MAX_SEATS`)."""
        return min(max(self._word[_MAX_WAITING], 0), MAX_SEATS)

    def retire(self) -> None:
        """Marks the region as replaced by a newer layout of its model (by its owner)."""
        self._word[_RETIRED] = 1

    @property
    def retired(self) -> bool:
        """Whether the model's pool moved to another region: a caller that takes a slot here
        gives it back unused and goes to the model's current region (believed only of a header
        that is :attr:`intact`)."""
        return self._word[_RETIRED] != 0

    # ---------------------------------------------------------------- seats

    def queue(self, seat: int, slot: int | None) -> None:
        """Records the slot the holder of ``seat`` queues on (``None``: none)."""
        self._word[_FIRST_SEAT_WORD + seat] = 0 if slot is None else slot + 1

    def queued_on(self, seat: int) -> int | None:
        """The slot the holder of ``seat`` queues on, if any."""
        value = self._word[_FIRST_SEAT_WORD + seat]
        return value - 1 if value else None

    def queued(self) -> list[int]:
        """How many callers queue on each slot."""
        counts = [0] * self._slot_count
        first = _FIRST_SEAT_WORD
        for value in self._word[first : first + self.max_waiting].tolist():  # one read
            if 0 < value <= self._slot_count:
                counts[value - 1] += 1
        return counts

    # ---------------------------------------------------------------- slot state

    def busy_since(self, slot: int) -> int:
        """When the slot's holder sent a request on it (``time.monotonic_ns``), ``0`` while it
        is free."""
        return self._word[_slot_word(slot, _BUSY_SINCE)]

    def set_busy_since(self, slot: int, since_ns: int) -> None:
        """Records when a request was sent on the slot (``0``: the slot was given back)."""
        self._word[_slot_word(slot, _BUSY_SINCE)] = since_ns

    def abandoned_since(self, slot: int) -> int:
        """When the request Triton may still run on the slot was sent (``0``: none), the slot
        being out of use until Triton is proven done with it."""
        return self._word[_slot_word(slot, _ABANDONED_SINCE)]

    def abandon(self, slot: int, since_ns: int) -> None:
        """Takes the slot out of use: the request sent at ``since_ns`` was given up while
        Triton may still run it (by the slot's holder, or by whoever found it dead)."""
        word, base = self._word, _slot_word(slot, 0)
        word[base + _ABANDONED_SINCE] = since_ns
        word[base + _BUSY_SINCE] = 0
        _add(word, base + _ABANDONS, 1)

    def settle(self, slot: int, now_ns: int) -> None:
        """Puts an abandoned slot back in use: Triton is done with its request (counted)."""
        word, base = self._word, _slot_word(slot, 0)
        since = word[base + _ABANDONED_SINCE]
        if since:
            waited = min(max(now_ns - since, 0), _INT64_MAX)
            _add(word, base + _SETTLE_NS, waited)
            _add(word, base + _SETTLE_BUCKETS + _bucket(waited), 1)
            word[base + _ABANDONED_SINCE] = 0

    def in_triton(self, size: int) -> int:
        """How many of the first ``size`` slots have a request in Triton (sent, not given
        back): cheap, every node-batched call asks."""
        return int(np.count_nonzero(self._slots[:size, _BUSY_SINCE]))

    def busy_slots(self) -> list[int]:
        """The slots whose holder sent a request on them, not given back yet."""
        return [int(s) for s in np.flatnonzero(self._slots[:, _BUSY_SINCE])]

    def queued_seats(self) -> list[int]:
        """The seats whose holder queues for a slot."""
        first = _FIRST_SEAT_WORD
        return [int(s) for s in np.flatnonzero(self._words[first : first + self.max_waiting])]

    def takes(self) -> int:
        """Slots taken so far, over every slot and process (each take is counted in the wait
        histogram, see :meth:`count_take`)."""
        return int(self._slots[:, _WAIT_BUCKETS : _WAIT_BUCKETS + _BUCKETS].sum())

    def abandoned_slots(self) -> list[int]:
        """The slots out of use until Triton is done with an abandoned request."""
        return [int(s) for s in np.flatnonzero(self._slots[:, _ABANDONED_SINCE])]

    # ---------------------------------------------------------------- counters

    def count(
        self, slot: int, samples: int, bytes_in: int, bytes_out: int, latency_ns: int
    ) -> None:
        """Counts one answered request on ``slot`` (only its current holder calls this)."""
        word, base = self._word, _slot_word(slot, 0)
        try:  # the common case, at a memoryview's cost: no word is near overflow
            word[base + _REQUESTS] += 1
            word[base + _SAMPLES] += samples
            word[base + _BYTES_IN] += bytes_in
            word[base + _BYTES_OUT] += bytes_out
            word[base + _LATENCY_NS] += latency_ns
            word[base + _LATENCY_BUCKETS + _bucket(latency_ns)] += 1
            word[base + _ROW_BUCKETS + _rows_bucket(samples)] += 1
        except ValueError:  # a word past int64: not ours (a stray writer)
            self._restart_slot(slot)

    def count_error(self, slot: int) -> None:
        """Counts one failed request on ``slot``."""
        _add(self._word, _slot_word(slot, _ERRORS), 1)

    def count_wait(self, slot: int, wait_ns: int) -> None:
        """Counts a caller that queued for ``slot`` (by the caller that just took it)."""
        word, base = self._word, _slot_word(slot, 0)
        _add(word, base + _WAITS, 1)
        _add(word, base + _WAIT_NS, wait_ns)

    def count_take(self, slot: int, wait_ns: int) -> None:
        """Counts how long a request waited for ``slot`` (zero: it was free), in the wait
        histogram (by the request's holder of the slot)."""
        index = _slot_word(slot, _WAIT_BUCKETS + _bucket(wait_ns))
        try:
            self._word[index] += 1
        except ValueError:  # past int64: not ours
            self._word[index] = 1

    def count_failure(self, kind: str) -> None:
        """Counts a failed call of ``kind`` (one of :data:`.._exceptions.ERROR_KINDS`; the
        caller holds the region's mutex: any process may count). Nothing is written into a
        header that is not :attr:`intact`: its words are another's."""
        if self.intact:
            _add(self._word, _FAILURES + ERROR_KINDS.index(kind), 1)

    def _restart_slot(self, slot: int) -> None:
        """Zeroes the counters of ``slot`` that are past half of int64 (no request adds that
        much: they are another writer's), so that counting goes on."""
        counters = self._slots[slot]
        counters[np.abs(counters) > _INT64_MAX // 2] = 0

    def failures(self) -> dict[str, int]:
        """Failed calls by kind."""
        return {kind: self._word[_FAILURES + k] for k, kind in enumerate(ERROR_KINDS)}

    @property
    def overloads(self) -> int:
        """Callers refused with ``OverloadedError`` because every seat was taken."""
        return self._word[_FAILURES + ERROR_KINDS.index("overloaded")]

    def totals(self) -> SlotCounters:
        """The counters summed over every slot."""
        sums = self._slots.sum(axis=0)
        counters = (*sums[:_BUSY_SINCE], sums[_ABANDONS], sums[_SETTLE_NS], sums[_LATENCY_NS])
        return SlotCounters(*(int(v) for v in counters))

    def histograms(self) -> dict[str, np.ndarray]:
        """Each histogram of :data:`HISTOGRAMS` summed over the slots: counts per bucket of
        :data:`BUCKET_BOUNDS_S`."""
        return {
            name: self._slots[:, first : first + _BUCKETS].sum(axis=0)
            for name, first in HISTOGRAMS.items()
        }

    def settle_quantile_s(self, q: float) -> float:
        """The ``q`` quantile of how long abandoned slots waited for Triton, in seconds (the
        bucket's upper bound; ``0.0`` if none was abandoned and settled)."""
        return _quantile_s(self._slots[:, _SETTLE_BUCKETS:_LATENCY_BUCKETS], q)

    def count_company_wait(self, slot: int, waited_ns: int) -> None:
        """Counts a node batch on ``slot`` that waited ``waited_ns`` for company (by its
        leader, the slot's holder)."""
        word, base = self._word, _slot_word(slot, 0)
        _add(word, base + _COMPANY_WAITS, 1)
        _add(word, base + _COMPANY_WAIT_NS, max(waited_ns, 0))

    def company_waits(self) -> tuple[int, int]:
        """Node batches that waited for company, and the nanoseconds they waited in all."""
        sums = self._slots[:, _COMPANY_WAITS : _COMPANY_WAIT_NS + 1].sum(axis=0)
        return int(sums[0]), int(sums[1])

    def rows_histogram(self) -> np.ndarray:
        """Answered requests by their rows, summed over the slots: counts per bucket of
        :data:`ROWS_BUCKET_BOUNDS`."""
        return self._slots[:, _ROW_BUCKETS:_COMPANY_WAITS].sum(axis=0)

    def board_column(self, field: int) -> np.ndarray:
        """Word ``field`` of every slot's batch board, slot ``i``'s at index ``i`` (a view:
        a look over every slot at once, whatever their number)."""
        first = _FIRST_BOARD_WORD + field
        return self._words[first : first + MAX_SLOTS * BOARD_WORDS : BOARD_WORDS]

    def board(self, slot: int) -> memoryview:
        """The words of ``slot``'s batch board (see :mod:`._board`): any process writes them,
        under the board's rules."""
        first = _FIRST_BOARD_WORD + slot * BOARD_WORDS
        return self._word[first : first + BOARD_WORDS]

    def latency_quantile_s(self, q: float) -> float:
        """The ``q`` quantile of answered requests' latency, in seconds (the bucket's upper
        bound; ``0.0`` if none was answered)."""
        return _quantile_s(self._slots[:, _LATENCY_BUCKETS:_ROW_BUCKETS], q)


#: Each histogram bucket's upper bound in seconds; the last bucket has none (``inf``).
BUCKET_BOUNDS_S = (*(_BUCKET0_NS * 2 ** (b / 2) / 1e9 for b in range(_BUCKETS - 1)), math.inf)


_INT64_MAX = 2**63 - 1


def _add(word: memoryview, index: int, value: int) -> None:
    """Adds ``value`` to a word, wrapping around past int64 (as numpy's sums of them do)."""
    total = word[index] + value
    word[index] = (total + 2**63) % 2**64 - 2**63


def stamp_version(words: Any) -> int | None:
    """The layout version a header's words say (``None``: no magic word: not a stamped
    header of this library's)."""
    return int(words[_VERSION]) if words[_MAGIC] == MAGIC else None


def header_version(data: bytes) -> int | None:
    """The layout version of the header at the start of ``data`` (a region's first bytes, as
    read by a tool), ``None`` if it bears no stamp of this library's, or is too short."""
    if len(data) < (_VERSION + 1) * 8:
        return None
    return stamp_version(memoryview(data)[: (_VERSION + 1) * 8].cast("q"))


def foreign_region_error(
    region: str, version: int | None, *, model: str | None = None, why: str = ""
) -> ForeignRegionError:
    """The error refusing a region whose header is not of this layout (found: ``version``)."""
    if why:
        found = f"its header is not one of this library's ({why})"
    elif version is None:
        found = (
            "its header has no ray-triton-shm stamp: a ray-triton-shm before layout version 2 "
            "made it, or something other than ray-triton-shm wrote over it"
        )
    else:
        found = (
            f"its header is of layout version {version}, and this ray-triton-shm reads version "
            f"{LAYOUT_VERSION}: another version of ray-triton-shm made it"
        )
    return ForeignRegionError(
        f"region {region!r}" + (f" of model {model!r}" if model else "") + f" is refused: "
        f"{found}. Run one ray-triton-shm version in every process of the node (the node "
        "actor and its callers), and register the model again for a region of this version's; "
        "`ray-triton-shm status` marks the foreign regions",
        model=model,
        region=region,
        version=version,
        expected_version=LAYOUT_VERSION,
    )


def _rows_bucket(rows: int) -> int:
    return min(max(rows - 1, 0).bit_length(), ROWS_BUCKETS - 1)


def _bucket(duration_ns: int) -> int:
    ratio = max(duration_ns, 1) / _BUCKET0_NS
    return min(_BUCKETS - 1, max(0, math.ceil(2 * math.log2(ratio))))


def _quantile_s(per_slot: np.ndarray, q: float) -> float:
    return histogram_quantile_s(per_slot.sum(axis=0), q)


def histogram_quantile_s(histogram: np.ndarray, q: float) -> float:
    """The ``q`` quantile of one of :meth:`RegionHeader.histograms`, in seconds (its bucket's
    upper bound; ``0.0`` for an empty histogram)."""
    total = int(histogram.sum())
    if total == 0:
        return 0.0
    bucket = int(np.searchsorted(np.cumsum(histogram), q * total))
    return _BUCKET0_NS * 2 ** (min(bucket, _BUCKETS - 1) / 2) / 1e9
