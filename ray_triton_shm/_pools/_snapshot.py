"""One reading of a pool: what its region's header and its slots say at one moment.

``TritonSHMClient.shm_stats()``, the Ray node actor's ``stats()`` and its metrics are each made
of a :class:`PoolSnapshot`, so a figure is read one way wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._exceptions import ERROR_KINDS
from .._inference._model_pool import ModelPool
from .._slots._header import (
    BUCKET_BOUNDS_S,
    HISTOGRAMS,
    ROWS_BUCKET_BOUNDS,
    ROWS_BUCKETS,
    SlotCounters,
    histogram_quantile_s,
)
from .._slots._shared_slots import NodeSlotStats, SharedSlots
from .._slots._slot_pool import PoolStats

__all__ = ["PoolSnapshot"]


@dataclass(frozen=True)
class PoolSnapshot:
    """A pool at one moment.

    Attributes:
        region: The pool's region (a new layout has a new one: its counts start at zero).
        generation: New layouts since the model was registered.
        size: Slots in the pool now.
        min_size: The smallest size it shrinks to (``size`` for a fixed pool).
        max_size: The largest size it grows to.
        limited_by: Why it did not grow although callers waited lately (``""``: nothing).
        grows: How often it grew.
        shrinks: How often it shrank.
        in_use: Slots held now, abandoned ones included.
        waiting: Callers waiting for a slot.
        abandoned: Slots out of use until Triton is done with a request given up on them.
        overloads: Callers refused past ``max_waiting``.
        shm_bytes: Bytes of ``/dev/shm`` its region holds now.
        shm_max_bytes: Bytes its region would hold at ``max_size``.
        wait_p99_us: The 99th percentile of the waits for a slot.
        settle_p99_us: The 99th percentile of how long abandoned slots waited for Triton.
        latency_p99_us: The 99th percentile of the requests' latency.
        failures: Failed calls by kind.
        counters: The header's counters (``requests``, ``samples``, ``bytes_in``...,
            ``abandoned_requests``).
        histograms: Counts per bucket of each of the header's histograms.
        foreign: Whether the header lost this layout's stamp (something wrote over it): none
            of its words is believed, and every figure read from them is zero (``size``,
            ``min_size``, ``abandoned``, the counters, failures and histograms); ``in_use``
            and ``waiting`` come from the slots' locks, as ever.
        node_batching: Whether the pool's calls join the node's batches (registered with
            ``NodeBatching``, in memory that holds a batch's rows).
        rows_histogram: Answered requests by their rows: counts per bucket of
            :data:`~.._slots._header.ROWS_BUCKET_BOUNDS`.
        company_waits: Node batches whose sender waited for company.
        company_wait_ns: How long they waited, in all.
    """

    region: str
    generation: int
    size: int
    min_size: int
    max_size: int
    limited_by: str
    grows: int
    shrinks: int
    in_use: int
    waiting: int
    abandoned: int
    overloads: int
    shm_bytes: int
    shm_max_bytes: int
    wait_p99_us: int
    settle_p99_us: int
    latency_p99_us: int
    failures: dict[str, int]
    counters: dict[str, int]
    histograms: dict[str, np.ndarray]
    foreign: bool = False
    node_batching: bool = False
    rows_histogram: np.ndarray = field(default_factory=lambda: np.zeros(ROWS_BUCKETS, np.int64))
    company_waits: int = 0
    company_wait_ns: int = 0

    @property
    def rows_per_request(self) -> float:
        """The mean rows (samples) per answered request (``0.0``: none answered)."""
        requests = self.counters.get("requests", 0)
        return self.counters.get("samples", 0) / requests if requests > 0 else 0.0

    @property
    def company_wait_mean_us(self) -> float:
        """The mean wait of the batches that waited for company, in microseconds (``0.0``:
        none did)."""
        return self.company_wait_ns / self.company_waits / 1e3 if self.company_waits > 0 else 0.0

    @property
    def rows_by_bound(self) -> dict[float, int]:
        """:attr:`rows_histogram` by each bucket's upper bound (``1, 2, 4, ..., 1024``, then
        ``math.inf``)."""
        return {bound: int(n) for bound, n in zip(ROWS_BUCKET_BOUNDS, self.rows_histogram)}

    @classmethod
    def of(cls, pool: ModelPool, *, node_wide: bool = False) -> PoolSnapshot:
        """Reads ``pool`` now.

        Args:
            pool: The pool.
            node_wide: Count the slots of every process of the machine (a region's shared
                slots, once the holders that died are swept), not this process's share.
        """
        slots = pool.slots
        header = pool.header
        if not header.intact:
            return cls._foreign(pool, node_wide=node_wide)
        now: NodeSlotStats | PoolStats
        if node_wide:
            assert isinstance(slots, SharedSlots)  # shared before the pool is published
            slots.sweep()  # so that a holder that just died counts as abandoned
            now, size = slots.node_stats(), header.size
        else:
            now = slots.stats()
            size = now.size
        grows, shrinks = header.resizes
        counters = vars(header.totals())
        counters["abandoned_requests"] = counters.pop("abandoned")
        histograms = header.histograms()  # read once: the percentiles come from it
        company_waits, company_wait_ns = header.company_waits()
        return cls(
            region=pool.region.name,
            generation=pool.generation,
            size=size,
            min_size=header.min_size,
            max_size=header.slot_count,
            limited_by=header.limited_by,
            grows=grows,
            shrinks=shrinks,
            in_use=now.in_use,
            waiting=now.waiting,
            abandoned=now.abandoned,
            overloads=header.overloads,
            shm_bytes=pool.region.allocated,
            shm_max_bytes=pool.region.size,
            wait_p99_us=_p99_us(histograms["wait"]),
            settle_p99_us=_p99_us(histograms["settle"]),
            latency_p99_us=_p99_us(histograms["latency"]),
            failures=header.failures(),
            counters=counters,
            histograms=histograms,
            node_batching=_batches(pool),
            rows_histogram=header.rows_histogram(),
            company_waits=company_waits,
            company_wait_ns=company_wait_ns,
        )

    @classmethod
    def _foreign(cls, pool: ModelPool, *, node_wide: bool) -> PoolSnapshot:
        """``pool`` whose header lost this layout's stamp: its words read as zero (and no
        sweep writes into them); slots held and callers waiting as the locks say."""
        slots = pool.slots
        now: NodeSlotStats | PoolStats
        if node_wide:
            assert isinstance(slots, SharedSlots)
            now = slots.node_stats()
        else:
            now = slots.stats()
        counters = vars(SlotCounters())
        counters["abandoned_requests"] = counters.pop("abandoned")
        return cls(
            region=pool.region.name,
            generation=pool.generation,
            size=0,
            min_size=0,
            max_size=pool.header.slot_count,
            limited_by="",
            grows=0,
            shrinks=0,
            in_use=now.in_use,
            waiting=now.waiting,
            abandoned=0,
            overloads=0,
            shm_bytes=pool.region.allocated,
            shm_max_bytes=pool.region.size,
            wait_p99_us=0,
            settle_p99_us=0,
            latency_p99_us=0,
            failures=dict.fromkeys(ERROR_KINDS, 0),
            counters=counters,
            histograms={name: np.zeros(len(BUCKET_BOUNDS_S), np.int64) for name in HISTOGRAMS},
            foreign=True,
            node_batching=_batches(pool),
        )


def _batches(pool: ModelPool) -> bool:
    """Whether ``pool``'s calls join the node's batches: it has a policy and a board."""
    return pool.batching is not None and pool.board is not None


def _p99_us(histogram: np.ndarray) -> int:
    return round(histogram_quantile_s(histogram, 0.99) * 1e6)
