"""The node actor's metrics: each one's name, kind, help and labels written once, here (the
exporter below and the Grafana dashboard, :mod:`._dashboard`, use them), and the exporter.

Ray prefixes application metrics with ``ray_``, and Prometheus ends a counter's name with
``_total``: :attr:`Metric.prometheus` is the name the dashboard and the alert rules query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._exceptions import ERROR_KINDS
from .._inference._transport import INLINE, SHM
from .._pools._snapshot import PoolSnapshot
from .._slots._header import BUCKET_BOUNDS_S, LIMITS, ROWS_BUCKET_BOUNDS

__all__ = [
    "ABANDONED_REQUESTS",
    "ABANDONED_SETTLE",
    "CALLERS_WAITING",
    "COMPANY_WAITS",
    "COMPANY_WAIT_SECONDS",
    "DEAD_OWNER_REGIONS",
    "ERRORS",
    "GROWTH_LIMITED",
    "INPUT_BYTES",
    "LAYOUT_CHANGES",
    "METRICS",
    "NODE_ACTOR_START_TIME",
    "OUTPUT_BYTES",
    "POOL_RESIZES",
    "REQUESTS",
    "REQUEST_DURATION",
    "ROWS_PER_REQUEST",
    "SAMPLES",
    "SLOTS",
    "SLOTS_ABANDONED",
    "SLOTS_IN_USE",
    "SLOTS_MAX",
    "SLOT_WAIT",
    "TRITON_RESTARTS",
    "TRANSPORT",
    "TRANSPORTS",
    "TRITON_UP",
    "Metric",
    "NodeMetrics",
]

_MODEL = ("model", "node_id")
_NODE = ("node_id",)


@dataclass(frozen=True)
class Metric:
    """One metric of the node actor.

    Attributes:
        name: Its name as given to Ray.
        kind: ``"counter"``, ``"gauge"`` or ``"histogram"``.
        help: What it measures.
        tags: Its labels.
    """

    name: str
    kind: str
    help: str
    tags: tuple[str, ...] = _MODEL

    @property
    def prometheus(self) -> str:
        """Its name in Prometheus: Ray's ``ray_`` prefix, and ``_total`` after a counter's."""
        total = self.kind == "counter" and not self.name.endswith("_total")
        return f"ray_{self.name}" + "_total" * total


REQUESTS = Metric(
    "triton_shm_requests",
    "counter",
    "Inference requests Triton answered (a call larger than a slot makes several)",
)
SAMPLES = Metric("triton_shm_samples", "counter", "Samples in the requests Triton answered")
INPUT_BYTES = Metric(
    "triton_shm_input_bytes", "counter", "Input bytes written into slots for Triton"
)
OUTPUT_BYTES = Metric("triton_shm_output_bytes", "counter", "Output bytes read from slots")
ABANDONED_REQUESTS = Metric(
    "triton_shm_abandoned_requests",
    "counter",
    "Requests given up (deadline, cancellation, caller death) while Triton ran them",
)
ERRORS = Metric(
    "triton_shm_errors",
    "counter",
    "Failed calls by kind: " + ", ".join(ERROR_KINDS),
    (*_MODEL, "kind"),
)
LAYOUT_CHANGES = Metric(
    "triton_shm_layout_changes",
    "counter",
    "New layouts of a model's pool: the model changed on Triton",
)
POOL_RESIZES = Metric(
    "triton_shm_pool_resizes", "counter", "Times a pool grew or shrank", (*_MODEL, "direction")
)
REQUEST_DURATION = Metric(
    "triton_shm_request_duration_seconds",
    "histogram",
    "Latency of requests Triton answered, from the caller's first wait for a slot to its answer",
)
SLOT_WAIT = Metric(
    "triton_shm_slot_wait_seconds",
    "histogram",
    "How long each request waited for a slot (0: one was free)",
)
ABANDONED_SETTLE = Metric(
    "triton_shm_abandoned_settle_seconds",
    "histogram",
    "How long slots of abandoned requests stayed out of use until Triton was done",
)
ROWS_PER_REQUEST = Metric(
    "triton_shm_rows_per_request",
    "histogram",
    "Rows (samples) per request Triton answered: above 1 where callers batch, or node batching "
    "merged their calls",
)
COMPANY_WAITS = Metric(
    "triton_shm_company_waits",
    "counter",
    "Node batches whose sender waited for company (other callers' rows) while the model's "
    "earlier batches were in Triton",
)
COMPANY_WAIT_SECONDS = Metric(
    "triton_shm_company_wait_seconds",
    "counter",
    "Seconds node batches waited for company, in all",
)
SLOTS = Metric("triton_shm_slots", "gauge", "Slots in the pool now")
SLOTS_MAX = Metric("triton_shm_slots_max", "gauge", "Slots the pool may grow to")
SLOTS_IN_USE = Metric("triton_shm_slots_in_use", "gauge", "Slots held now")
CALLERS_WAITING = Metric("triton_shm_callers_waiting", "gauge", "Callers waiting for a slot now")
SLOTS_ABANDONED = Metric(
    "triton_shm_slots_abandoned",
    "gauge",
    "Slots out of use until Triton finishes a request whose caller gave up or died",
)
GROWTH_LIMITED = Metric(
    "triton_shm_growth_limited",
    "gauge",
    "1 while callers wait and the pool cannot grow, by reason (max_slots, shm_budget, shm_full)",
    (*_MODEL, "reason"),
)
#: The values of :data:`TRANSPORT`'s ``transport`` label.
TRANSPORTS = (SHM, INLINE)
TRANSPORT = Metric(
    "triton_shm_transport",
    "gauge",
    "1 for how the model's pool reaches Triton, by transport: shm (shared memory Triton maps) "
    "or inline (by value, in the requests); 0 for the other",
    (*_MODEL, "transport"),
)
TRITON_UP = Metric(
    "triton_shm_triton_up",
    "gauge",
    "1 while the node's Triton answers the node actor's liveness check, else 0",
    _NODE,
)
TRITON_RESTARTS = Metric(
    "triton_shm_triton_restarts_total",
    "counter",
    "Times the node's Triton answered the node actor again after it was down (a crash and "
    "restart, or an outage between them)",
    _NODE,
)
NODE_ACTOR_START_TIME = Metric(
    "triton_shm_node_actor_start_time_seconds",
    "gauge",
    "When the node actor's process started (Unix time): it changes when it restarts",
    _NODE,
)
DEAD_OWNER_REGIONS = Metric(
    "triton_shm_dead_owner_regions",
    "gauge",
    "Regions of this library in the node's /dev/shm whose owner died (reclaim removes them)",
    _NODE,
)

#: Every metric of the node actor.
METRICS = (
    REQUESTS,
    SAMPLES,
    INPUT_BYTES,
    OUTPUT_BYTES,
    ABANDONED_REQUESTS,
    ERRORS,
    LAYOUT_CHANGES,
    POOL_RESIZES,
    REQUEST_DURATION,
    SLOT_WAIT,
    ABANDONED_SETTLE,
    ROWS_PER_REQUEST,
    COMPANY_WAITS,
    COMPANY_WAIT_SECONDS,
    SLOTS,
    SLOTS_MAX,
    SLOTS_IN_USE,
    CALLERS_WAITING,
    SLOTS_ABANDONED,
    GROWTH_LIMITED,
    TRANSPORT,
    TRITON_UP,
    TRITON_RESTARTS,
    NODE_ACTOR_START_TIME,
    DEAD_OWNER_REGIONS,
)

#: The counters of a pool's header, by their key in :attr:`PoolSnapshot.counters`.
_COUNTERS = {
    "requests": REQUESTS,
    "samples": SAMPLES,
    "bytes_in": INPUT_BYTES,
    "bytes_out": OUTPUT_BYTES,
    "abandoned_requests": ABANDONED_REQUESTS,
    "company_waits": COMPANY_WAITS,
    "company_wait_s": COMPANY_WAIT_SECONDS,
}
#: The durations' Prometheus buckets: every other bucket of the header's, a factor of 2 apart,
#: 16 us to 8.4 s; where each of the header's buckets is observed: its middle (geometric).
_SECONDS_BOUNDS = tuple(float(b) for b in BUCKET_BOUNDS_S[0:-1:2])
_SECONDS_MIDDLES = (
    BUCKET_BOUNDS_S[0] / 2,
    *(
        (BUCKET_BOUNDS_S[b - 1] * BUCKET_BOUNDS_S[b]) ** 0.5
        for b in range(1, len(BUCKET_BOUNDS_S) - 1)
    ),
    BUCKET_BOUNDS_S[-2] * 2**0.25,
)
#: The rows' Prometheus buckets: the header's own (1, 2, 4, ..., 1024 rows); each of its
#: buckets is observed at its middle, strictly inside it, where Ray's recorder puts it anyway.
_ROWS_BOUNDS = tuple(float(b) for b in ROWS_BUCKET_BOUNDS[:-1])
_ROWS_MIDDLES = (
    _ROWS_BOUNDS[0] / 2,
    *((low + high) / 2 for low, high in zip(_ROWS_BOUNDS, _ROWS_BOUNDS[1:])),
    _ROWS_BOUNDS[-1] * 2,
)
#: The histograms of a pool, by their key in the snapshot's: each one's metric, its buckets,
#: and where each of the header's buckets is observed.
_HISTOGRAMS = {
    "latency": (REQUEST_DURATION, _SECONDS_BOUNDS, _SECONDS_MIDDLES),
    "wait": (SLOT_WAIT, _SECONDS_BOUNDS, _SECONDS_MIDDLES),
    "settle": (ABANDONED_SETTLE, _SECONDS_BOUNDS, _SECONDS_MIDDLES),
    "rows": (ROWS_PER_REQUEST, _ROWS_BOUNDS, _ROWS_MIDDLES),
}
#: The gauges of a pool, by the key of its value.
_GAUGES = {
    "slots": SLOTS,
    "max_slots": SLOTS_MAX,
    "in_use": SLOTS_IN_USE,
    "waiting": CALLERS_WAITING,
    "abandoned": SLOTS_ABANDONED,
}


def _make(metric: Metric, **kwargs: Any) -> Any:
    from ray.util import metrics

    kind = {"counter": metrics.Counter, "gauge": metrics.Gauge, "histogram": metrics.Histogram}
    return kind[metric.kind](metric.name, metric.help, tag_keys=metric.tags, **kwargs)


class NodeMetrics:
    """The node's regions as Ray metrics (:data:`METRICS`), as Prometheus expects them.

    Exported from the housekeeping thread, not per request: requests only count into their
    regions' headers (see :mod:`.._slots._header`).

    Histograms are replayed from the headers' buckets: each request counted since the last
    export is observed once, at the middle of its bucket. So their buckets are exact (for
    durations, every other bucket of the header, a factor of 2 apart; for rows, the header's
    own) and their ``_sum`` approximate: within a bucket of the truth (Ray's OpenTelemetry
    recorder, too, counts each observation at the middle of its Prometheus bucket).
    """

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._exported: dict[str, dict[str, Any]] = {}
        self._counters = {key: _make(metric) for key, metric in _COUNTERS.items()}
        self._errors = _make(ERRORS)
        self._layouts = _make(LAYOUT_CHANGES)
        self._resizes = _make(POOL_RESIZES)
        self._histograms = {
            key: (_make(metric, boundaries=list(bounds)), middles)
            for key, (metric, bounds, middles) in _HISTOGRAMS.items()
        }
        self._gauges = {key: _make(metric) for key, metric in _GAUGES.items()}
        self._limited = _make(GROWTH_LIMITED)
        self._transport = _make(TRANSPORT)
        self._triton_up = _make(TRITON_UP)
        self._triton_restarts = _make(TRITON_RESTARTS)
        self._triton_restarts_exported = 0
        self._started = _make(NODE_ACTOR_START_TIME)
        self._dead_regions = _make(DEAD_OWNER_REGIONS)

    def export_node(
        self, *, triton_up: bool, triton_restarts: int, started_s: float, dead_regions: int
    ) -> None:
        """Sets the node's gauges, and adds the restarts of Triton seen since the last export."""
        tags = {"node_id": self._node_id}
        self._triton_up.set(int(triton_up), tags)
        if triton_restarts > self._triton_restarts_exported:
            self._triton_restarts.inc(triton_restarts - self._triton_restarts_exported, tags)
            self._triton_restarts_exported = triton_restarts
        self._started.set(started_s, tags)
        self._dead_regions.set(dead_regions, tags)

    def export(self, model: str, now: PoolSnapshot, transport: str | None = None) -> None:
        """Adds what the counters and histograms gained since the last export; sets the
        gauges.

        Args:
            model: The model.
            now: Its pool, read now.
            transport: How the pool reaches Triton now (``"shm"`` or ``"inline"``): its
                :data:`TRANSPORT` series is 1, the other's 0, so a switch leaves no series
                saying both; ``None``: not exported.
        """
        tags = {"model": model, "node_id": self._node_id}
        totals: dict[str, Any] = {
            **now.counters,
            "failures": now.failures,
            "generation": now.generation,
            "grows": now.grows,
            "shrinks": now.shrinks,
            "company_waits": now.company_waits,
            "company_wait_s": now.company_wait_ns / 1e9,
            "histograms": {**now.histograms, "rows": now.rows_histogram},
        }
        last = self._exported.get(model)
        if last is None:
            self._zero(tags)
        if last is None or last["region"] != now.region:
            # A new region (registered anew, or a new layout): its counts start at zero.
            last = {"region": now.region, "failures": {}, "histograms": {}}
            if model in self._exported:
                last["generation"] = self._exported[model].get("generation", 0)
        totals["region"] = now.region
        for key, metric in self._counters.items():
            _inc(metric, totals[key] - last.get(key, 0), tags)
        for kind, count in totals["failures"].items():
            _inc(self._errors, count - last["failures"].get(kind, 0), {**tags, "kind": kind})
        _inc(self._layouts, totals["generation"] - last.get("generation", 0), tags)
        for direction, key in (("grow", "grows"), ("shrink", "shrinks")):
            _inc(self._resizes, totals[key] - last.get(key, 0), {**tags, "direction": direction})
        for key, (histogram, middles) in self._histograms.items():
            counts = totals["histograms"][key]
            before = last["histograms"].get(key)
            _replay(histogram, middles, counts if before is None else counts - before, tags)
        self._exported[model] = totals
        gauges = {
            "slots": now.size,
            "max_slots": now.max_size,
            "in_use": now.in_use,
            "waiting": now.waiting,
            "abandoned": now.abandoned,
        }
        for name, value in gauges.items():
            self._gauges[name].set(value, tags)
        for reason in LIMITS[1:]:
            self._limited.set(int(reason == now.limited_by), {**tags, "reason": reason})
        if transport is not None:
            for kind in TRANSPORTS:
                self._transport.set(int(kind == transport), {**tags, "transport": kind})

    def _zero(self, tags: dict[str, str]) -> None:
        """Makes a model's counters exist at zero, every label of them, before their first
        event: ``rate()`` and ``increase()`` over a series that does not exist yet say
        nothing, not zero (Prometheus' own advice). Ray's public ``inc`` refuses zero."""
        zeros = [(metric, tags) for metric in self._counters.values()]
        zeros += [(self._errors, {**tags, "kind": kind}) for kind in ERROR_KINDS]
        zeros += [(self._layouts, tags)]
        zeros += [(self._resizes, {**tags, "direction": d}) for d in ("grow", "shrink")]
        for metric, labels in zeros:
            record = getattr(metric, "_record", None)
            if record is not None:
                record(0.0, labels)


def _inc(counter: Any, delta: float, tags: dict[str, str]) -> None:
    if delta > 0:
        counter.inc(delta, tags)


def _replay(
    histogram: Any, middles: tuple[float, ...], new: np.ndarray, tags: dict[str, str]
) -> None:
    """Observes each of ``new`` (counts per bucket of the header's) at its bucket's middle."""
    for bucket in np.flatnonzero(new > 0):
        value = middles[bucket]
        for _ in range(int(new[bucket])):
            histogram.observe(value, tags)
