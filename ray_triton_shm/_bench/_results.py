"""What a bench run measured: each run's numbers, each model's, the goals and the pool-size
answers, as the runner collects them and the reports render them (no path, no Ray: reading a
run's results imports neither)."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ray_triton_shm._bench._config import (
    APP_CASES,
    BY_VALUE,
    BY_VALUE_SHARE,
    BY_VALUE_TWINS,
    CEILING_PATHS,
    CHURN,
    CHURN_CASE,
    ELASTIC,
    MANY_CALLERS_BY_VALUE_CASES,
    MANY_CALLERS_CASES,
    NODE_ACTOR_IDLE_PATHS,
    NODE_LOAD,
    NODE_LOAD_FIXED,
    SERVE_HTTP_CLIENTS,
    SERVE_HTTP_PATHS,
    STREAM_CEILING_PATHS,
    STREAM_TWINS,
    BenchConfig,
)
from ray_triton_shm._bench._load import OpenLoop, SliceSummary, StreamSlice
from ray_triton_shm._bench._watch import Outage

if TYPE_CHECKING:  # at run time, results are read without tritonclient (whose dtypes it needs)
    from ray_triton_shm._bench._cases import ModelCase

__all__ = ["CEILING", "GOALS", "BenchResults", "Goal", "ModelResult", "RunResult"]
__all__ += ["COPY_LINE", "NODE_ACTOR_IDLE_MS_PER_S"]
__all__ += ["ELASTIC_POOL", "POOL_SIZE_FOR_RATE", "POOL_SIZE_FOR_THROUGHPUT", "RECOMMEND_SHARE"]
__all__ += ["UPDATE_CALLERS", "UPDATE_SLOTS", "UpdateResult", "describe_rate_path", "describe_run"]
__all__ += ["describe_slots", "host_info", "mb_ratio", "mb_ratio_spread", "ratio"]

#: The shm throughput a recommended pool reaches, over the best one measured.
RECOMMEND_SHARE = 0.95
#: The three pool-size answers, each to a question of its own, by the one name the terminal,
#: the report and the JSON give it: the fewest slots of a fixed pool near the most
#: closed-loop throughput; the size the elastic pool (no pool_size) settled on under N
#: callers; the smallest fixed pool that sustained each open-loop request rate.
POOL_SIZE_FOR_THROUGHPUT = "pool_size_for_throughput"
ELASTIC_POOL = "elastic_pool"
POOL_SIZE_FOR_RATE = "pool_size_for_rate"


def describe_slots(slots: int | None) -> str:
    """``"4 slots"``, or ``"elastic pool"`` for :data:`~._config.ELASTIC`."""
    return "elastic pool" if slots == ELASTIC else f"{slots} slot{'s' * (slots != 1)}"


#: The paths of a streaming model: their callers are streams at once.
_STREAMING = (*STREAM_TWINS, *STREAM_TWINS.values(), *STREAM_CEILING_PATHS)


def describe_run(path: str, concurrency: int | None = None, slots: int | None = None) -> str:
    """E.g. ``"shm-model (16 callers, 4 slots)"``, ``"shm-model (16 callers, elastic pool)"``,
    ``"shm-client (4 callers)"`` (its slots said where they differ from the callers, and
    always for ``shm-model``, whose default pool is elastic), ``"stream-client (4 streams)"``
    (a streaming model's: its callers each run one stream at a time); ``path`` alone without a
    concurrency."""
    if concurrency is None:
        return path
    who = "stream" if path in _STREAMING else "caller"
    callers = f"{concurrency} {who}{'s' * (concurrency > 1)}"
    shown = slots is not None and (slots != concurrency or path == "shm-model")
    return f"{path} ({callers}{f', {describe_slots(slots)}' if shown else ''})"


def describe_rate_path(
    path: str, concurrency: int, slots: int | None, *, detailed: bool = False
) -> str:
    """An open-loop run's path and slots: ``"grpc"`` (``detailed``: ``"grpc (16 threads)"``),
    ``"shm-client (pool 4)"``, ``"shm-model (4 slots)"`` (``"elastic pool"`` for either on
    :data:`~._config.ELASTIC`)."""
    if path == "shm-client":
        return f"shm-client ({'elastic pool' if slots == ELASTIC else f'pool {slots}'})"
    if path == "shm-model":
        return f"shm-model ({describe_slots(slots)})"
    return f"{path} ({concurrency} threads)" if detailed else path


#: The ceiling's name, as a goal's baseline names it: the better of perf_analyzer's runs
#: (:data:`~._config.CEILING_PATHS`) at the same number of callers.
CEILING = "perf_analyzer"
#: The line a client that copies its inputs into a slot (and its outputs out) can reach, as
#: a goal's baseline names it: ``pa-shm`` at N callers (its inputs written once, its outputs
#: never read), each request plus the time of the memcpy floor's copies (``memcpy``, one
#: caller): ``1 / (1 / pa-shm's requests/s + 1 / memcpy's)``.
COPY_LINE = "pa-shm + copy"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


@dataclasses.dataclass
class RunResult:
    """One path at one concurrency (on ``slots`` slots, for the shm paths) on one model: its
    time, client CPU time (every thread of every client process) and the node actor's
    (``None``: not used) over the slices, every request's latency per caller (or, for a path
    that times its slices itself, each slice's :class:`~._load.SliceSummary`), why it was
    ``skipped`` or failed (``error``), and the path's own numbers (``extra``); see
    :meth:`numbers`. ``verified``: set up, and its first answer checked against the
    reference, but where ``unchecked`` says why it was not."""

    path: str
    concurrency: int
    slots: int | None
    case: ModelCase
    wall_s: float = 0.0
    cpu_s: float = 0.0
    side_cpu_s: float | None = 0.0
    latencies_s: list[list[float]] = dataclasses.field(default_factory=list)
    verified: bool = False
    unchecked: str | None = None
    skipped: str | None = None
    error: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: An open-loop run's: its ``--request-rate`` value and requests per second.
    rate_spec: str | None = None
    rate: float | None = None
    #: An open-loop run's: requests due, dropped, and the seconds it was meant to last and
    #: took until its last request was sent (:meth:`add_open_loop`).
    due: int = 0
    dropped: int = 0
    planned_s: float = 0.0
    paced_s: float = 0.0
    #: Each slice's seconds and requests, in the order of the rounds.
    rounds: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    #: What happened to Triton while one of its slices ran (a crash, an outage): its numbers
    #: are kept, but count for no verdict, goal or advice (:attr:`counts`).
    disturbed: str | None = None
    #: The slices its path timed itself (perf_analyzer), in the order of the rounds.
    summaries: list[SliceSummary] = dataclasses.field(default_factory=list)
    #: A streaming model's: per caller, each stream's seconds to its first response (its
    #: :attr:`latencies_s` are to its end: Triton's final response), and every response.
    first_s: list[list[float]] = dataclasses.field(default_factory=list)
    responses: int = 0
    #: Triton's counts of the run's model over its slices (:meth:`add_counts`): requests,
    #: the rows in them, and the model's executions (fewer than the requests where Triton's
    #: dynamic batcher merged them).
    #: The seconds over which the node actor's CPU (``side_cpu_s``) was read.
    side_wall_s: float = 0.0
    triton_requests: int = 0
    triton_rows: int = 0
    triton_executions: int = 0
    #: The node actor's CPU seconds over seconds without load, in the run's group (``None``:
    #: not measured; see ``_config.NODE_ACTOR_IDLE_PATHS``).
    node_actor_idle: tuple[float, float] | None = None
    #: Whether it is a run of the many-callers case (``_config.MANY_CALLERS``): its own
    #: table and choices say it; the others' verdicts and pool-size answers leave it out.
    many_callers: bool = False

    def add_counts(self, before: tuple[int, int, int], after: tuple[int, int, int]) -> None:
        """Adds Triton's counts of one slice: its ``(requests, rows, executions)`` of the
        model after it, less those before."""
        requests, rows, executions = (a - b for a, b in zip(after, before))
        self.triton_requests += requests
        self.triton_rows += rows
        self.triton_executions += executions

    def add_open_loop(self, loop: OpenLoop, planned_s: float, cpu_s: float) -> None:
        """Adds one open-loop slice of ``planned_s`` seconds of arrivals."""
        latencies = loop.latencies
        self.add(max(loop.wall_s, planned_s), cpu_s, None, [list(latencies)])
        self.due += len(latencies) + loop.dropped
        self.dropped += loop.dropped
        self.planned_s += planned_s
        # Until the last request went out, about, had no queue built up: the last answer,
        # less the latency of the first requests (a queue that grew shows as time past it).
        self.paced_s += max(loop.wall_s - loop.first_s, 1e-9)

    @property
    def rate_label(self) -> str:
        """An open-loop run's path and slots (:func:`describe_rate_path`)."""
        return describe_rate_path(self.path, self.concurrency, self.slots)

    def sustained(self, bound_ms: float | None) -> bool | None:
        """Whether an open-loop run kept up with its arrivals: none dropped, answers at 90%
        of the rate they came at or more, and the p99 latency under ``bound_ms`` if given
        (``None``: no numbers)."""
        numbers = self.numbers()
        if not numbers or self.rate is None or self.disturbed is not None:
            return None
        kept_up = numbers["answered_per_s"] >= 0.9 * numbers["offered_per_s"]
        under = bound_ms is None or numbers["latency_ms"]["p99"] <= bound_ms
        return self.dropped == 0 and kept_up and under

    def add(
        self,
        wall_s: float,
        cpu_s: float,
        side_cpu_s: float | None,
        latencies: list,
        *,
        side_wall_s: float | None = None,
    ) -> None:
        """Adds one slice: its times (``side_wall_s``: the seconds over which the node
        actor's ``side_cpu_s`` was read, if not ``wall_s``), and each caller's latencies."""
        self.rounds.append((wall_s, sum(map(len, latencies))))
        self.wall_s += wall_s
        self.side_wall_s += wall_s if side_wall_s is None else side_wall_s
        self.cpu_s += cpu_s
        if self.side_cpu_s is not None:
            self.side_cpu_s = None if side_cpu_s is None else self.side_cpu_s + side_cpu_s
        self.latencies_s = self.latencies_s or [[] for _ in latencies]
        for mine, more in zip(self.latencies_s, latencies):
            mine.extend(more)

    def add_streams(self, streams: StreamSlice, cpu_s: float, side_cpu_s: float | None) -> None:
        """Adds one slice of streams: its times, and each caller's streams' times to their
        first response and to their end."""
        self.add(streams.wall_s, cpu_s, side_cpu_s, [list(times) for times in streams.last_s])
        self.first_s = self.first_s or [[] for _ in streams.first_s]
        for mine, more in zip(self.first_s, streams.first_s):
            mine.extend(more)
        self.responses += streams.responses

    def add_summary(self, summary: SliceSummary) -> None:
        """Adds one slice its path timed itself: its requests and their latency percentiles,
        no latency per request; its client CPU is not measured (a process of its own per
        slice, its start included)."""
        self.rounds.append((summary.wall_s, summary.requests))
        self.wall_s += summary.wall_s
        self.side_cpu_s = None
        self.summaries.append(summary)
        self.responses += summary.responses or 0

    @property
    def ok(self) -> bool:
        """Whether the run produced valid numbers (an open-loop run that dropped every
        request did not)."""
        done = self.verified and not self.error and not self.skipped
        measured = any(self.latencies_s) or any(s.requests for s in self.summaries)
        return done and self.wall_s > 0 and measured

    @property
    def counts(self) -> bool:
        """Whether its numbers count for verdicts, goals and advice: valid, and no crash or
        outage of Triton touched them."""
        return self.ok and self.disturbed is None

    def numbers(self) -> dict[str, Any]:
        """Requests, samples and input MB (1e6 B) per second, ``latency_ms`` (p50, p90 and
        p99 of a request's; of a path that timed its slices itself, each slice's, the mean
        over the slices weighted by their requests), client CPU s per GB (1e9 B) of input
        (``None`` where not measured), ``fairness`` (the fewest requests a caller completed
        over the mean, with several callers), the node actor's CPU us per request (and where
        its idle CPU was measured, that and its CPU per extra request), ``latency_p99_ms``
        alone (for the goals), the rows per Triton request and per execution of the model
        (Triton's counts; ``None``: not read), and the path's own numbers; empty for a run
        without numbers."""
        if not self.ok:
            return {}
        timed = sum(s.requests for s in self.summaries)
        requests = sum(map(len, self.latencies_s)) + timed
        done = [len(caller) for caller in self.latencies_s]
        gigabytes = requests * self.case.input_nbytes / 1e9
        if timed:
            latency = {
                p: sum(s.latency_ms[p] * s.requests for s in self.summaries) / timed
                for p in ("p50", "p90", "p99")
            }
        else:
            every = np.concatenate([np.array(caller) for caller in self.latencies_s]) * 1e3
            latency = dict(zip(("p50", "p90", "p99"), np.percentile(every, [50, 90, 99]).tolist()))
        return {
            "requests_per_s": requests / self.wall_s,
            "samples_per_s": requests * self.case.batch_size / self.wall_s,
            "mb_per_s": gigabytes * 1e3 / self.wall_s,
            "latency_ms": latency,
            "cpu_s_per_gb": self.cpu_s / gigabytes if gigabytes and not timed else None,
            "fairness": min(done) / (requests / len(done)) if len(done) > 1 else None,
            "node_actor_cpu_us": ratio(self.side_cpu_s, requests / 1e6),
            **self._node_actor_slope(requests),
            "latency_p99_ms": latency["p99"],
            "rows_per_request": ratio(self.triton_rows, self.triton_requests),
            "rows_per_execution": ratio(self.triton_rows, self.triton_executions),
            **self.extra,
            **(
                {
                    "request_rate": self.rate,
                    "offered_per_s": self.due / self.planned_s,
                    # Over the arrivals' window at least: a run that keeps pace answers at
                    # the offered rate, never above it.
                    "answered_per_s": requests / max(self.paced_s, self.planned_s),
                    "dropped": self.dropped,
                }
                if self.rate is not None
                else {}
            ),
            **(self._stream_numbers(requests, latency, timed) if self.case.streaming else {}),
            "requests": requests,
            "wall_s": self.wall_s,
            "cpu_s": None if timed else self.cpu_s,
            "mb_per_s_rounds": self.round_mb_per_s(),
        }

    def _node_actor_slope(self, requests: int) -> dict[str, float | None]:
        """The node actor's CPU at two loads: its idle CPU (ms per second, without load),
        and its CPU per extra request (us), the slope from there to the run's load; ``{}``
        where its idle CPU was not measured."""
        if self.node_actor_idle is None or self.side_cpu_s is None or not requests:
            return {}
        idle_s, idle_wall_s = self.node_actor_idle
        idle = idle_s / idle_wall_s
        extra = (self.side_cpu_s - idle * (self.side_wall_s or self.wall_s)) / requests
        return {
            "node_actor_idle_ms_per_s": idle * 1e3,
            "node_actor_us_per_extra_request": extra * 1e6,
        }

    def _stream_numbers(self, streams: int, to_end: dict[str, float], timed: int) -> dict[str, Any]:
        """A streaming model's numbers: responses per second and per stream, the percentiles
        of a stream's time to its first response (``None`` for a path that timed its slices
        itself: perf_analyzer says nothing of it) and to its last (its end), ``first_`` and
        ``last_response_p50_ms`` alone (for the goals), and the client's CPU us per response."""
        first = None
        if not timed:
            every = np.concatenate([np.array(caller) for caller in self.first_s]) * 1e3
            first = dict(zip(("p50", "p90", "p99"), np.percentile(every, [50, 90, 99]).tolist()))
        return {
            "responses_per_s": self.responses / self.wall_s,
            "responses_per_stream": self.responses / streams,
            "first_response_ms": first,
            "last_response_ms": to_end,
            "first_response_p50_ms": first["p50"] if first else None,
            "last_response_p50_ms": to_end["p50"],
            "cpu_us_per_response": (
                self.cpu_s / self.responses * 1e6 if self.responses and not timed else None
            ),
        }

    def round_mb_per_s(self) -> list[float]:
        """Input MB (1e6 B) per second of each round's slice."""
        megabytes = self.case.input_nbytes / 1e6
        return [requests * megabytes / wall for wall, requests in self.rounds if wall > 0]


def mb_ratio(run: RunResult | None, baseline: RunResult | None) -> float | None:
    """``run``'s MB/s over ``baseline``'s (``None`` if either has none)."""
    value = run.numbers().get("mb_per_s") if run else None
    return ratio(value, baseline.numbers().get("mb_per_s") if baseline else None)


def mb_ratio_spread(run: RunResult, baseline: RunResult) -> tuple[float, float] | None:
    """The lowest and highest of ``run``'s MB/s over ``baseline``'s, round by round (the
    rounds interleave the runs, so round ``i`` of each ran side by side); ``None`` with fewer
    than two rounds of both."""
    ratios = [
        mine / theirs
        for mine, theirs in zip(run.round_mb_per_s(), baseline.round_mb_per_s())
        if theirs > 0
    ]
    return (min(ratios), max(ratios)) if len(ratios) >= 2 else None


@dataclasses.dataclass
class ModelResult:
    """Every run on one model, in the order they ran (``case``: ``None`` if it could not be
    made, ``error`` says why)."""

    name: str
    case: ModelCase | None = None
    runs: list[RunResult] = dataclasses.field(default_factory=list)
    error: str | None = None
    #: The open-loop runs (``--request-rate``), by rate then path.
    rate_runs: list[RunResult] = dataclasses.field(default_factory=list)
    #: How the library's pools of the model reach Triton (``"shm"``, or ``"inline"``: by
    #: value; ``None``: not known), and why.
    transport: str | None = None
    transport_reason: str = ""

    @property
    def by_value(self) -> bool:
        """Whether the library sends the model's tensors by value (Triton cannot map the
        bench's shared memory)."""
        return self.transport == BY_VALUE

    def goals(self) -> list[Goal]:
        """The goals on this model: the project's (:data:`GOALS`); by value, those without a
        baseline (the speed-ups are shared memory's), then :meth:`by_value_goals`."""
        mine = [g for g in GOALS if g.model == self.name and not (self.by_value and g.baseline)]
        return mine + (self.by_value_goals() if self.by_value else [])

    def by_value_goals(self) -> list[Goal]:
        """By value, each library path's run (its slots as many as its callers, or elastic)
        at least :data:`~._config.BY_VALUE_SHARE` of its plain gRPC twin's MB/s
        (:data:`~._config.BY_VALUE_TWINS`) at as many callers: the library must cost nothing
        where it cannot help."""
        return [
            Goal(self.name, (r.path, r.concurrency, r.slots), BY_VALUE_SHARE, (twin, r.concurrency))
            for r in self.runs
            if (twin := BY_VALUE_TWINS.get(r.path)) and not r.skipped
            if r.slots in (None, ELASTIC, r.concurrency)
        ]

    def rate_limits(self, bound_ms: float | None) -> dict[str, float | None]:
        """The highest rate each open-loop path sustained (:meth:`RunResult.sustained`),
        by :attr:`RunResult.rate_label` (``None``: not even the lowest tried)."""
        limits: dict[str, float | None] = {}
        for r in self.rate_runs:
            if r.rate is None or not r.counts:
                continue
            label = r.rate_label
            best = limits.setdefault(label, None)
            if r.sustained(bound_ms) and (best is None or r.rate > best):
                limits[label] = r.rate
        return limits

    def pools_for_rates(self, bound_ms: float | None) -> list[dict[str, Any]]:
        """Per rate tried, the smallest pool (``shm-client``'s slots) that sustained it, or
        ``None``; gRPC's verdict at that rate beside it."""
        rates = sorted({r.rate for r in self.rate_runs if r.rate is not None})
        advice = []
        for rate in rates:
            at = [r for r in self.rate_runs if r.rate == rate]
            pools = sorted(
                r.slots for r in at if r.path == "shm-client" and r.slots and r.sustained(bound_ms)
            )
            grpc = next((r for r in at if r.path == "grpc"), None)
            advice.append(
                {
                    "request_rate": rate,
                    "pool_size": pools[0] if pools else None,
                    "grpc_sustained": grpc.sustained(bound_ms) if grpc else None,
                }
            )
        return advice

    def run(
        self, path: str, concurrency: int | None = None, slots: int | None = None
    ) -> RunResult | None:
        """The run of ``path``, at ``concurrency`` and on ``slots`` slots when given."""
        for r in self.runs:
            if r.path == path and concurrency in (None, r.concurrency) and slots in (None, r.slots):
                return r
        return None

    def ceiling(self, concurrency: int) -> RunResult | None:
        """The ceiling at ``concurrency`` callers: the run of perf_analyzer
        (:data:`~._config.CEILING_PATHS`, :data:`~._config.STREAM_CEILING_PATHS` on a
        streaming model) with the most MB/s there, of those that count."""
        paths = (*CEILING_PATHS, *STREAM_CEILING_PATHS)
        runs = [
            r for r in self.runs if r.path in paths and r.concurrency == concurrency and r.counts
        ]
        return max(runs, key=lambda r: r.numbers()["mb_per_s"], default=None)

    def copy_line(self, concurrency: int, metric: str) -> float | None:
        """:data:`COPY_LINE` at ``concurrency`` callers, in ``metric`` (a rate: requests,
        samples or MB per second); ``None`` without both runs."""
        ceiling, copy = self.run("pa-shm", concurrency), self.run("memcpy", 1)
        if ceiling is None or copy is None or not (ceiling.counts and copy.counts):
            return None
        pa, floor = ceiling.numbers(), copy.numbers()
        line = 1 / (1 / pa["requests_per_s"] + 1 / floor["requests_per_s"])
        return ratio(pa.get(metric), pa["requests_per_s"] / line)

    def vs_ceiling(self, run: RunResult) -> tuple[float | None, RunResult | None]:
        """``run``'s MB/s over the ceiling's at its number of callers, and the ceiling's run
        (``None`` and ``None``: no ceiling measured there)."""
        ceiling = self.ceiling(run.concurrency)
        return mb_ratio(run, ceiling), ceiling

    def skipped(self) -> dict[str, str]:
        """Why the runs that did not run did not: by ``"path@concurrency"``."""
        return {f"{r.path}@{r.concurrency}": r.skipped for r in self.runs if r.skipped}

    def elastic(self) -> list[dict[str, Any]]:
        """Per load (callers) with an elastic ``shm-model`` run: the size its pool settled on
        and the most it reached, what held it back (``limited_by``), its requests per second,
        and the fixed pools measured at that load (``fixed``: slots and requests per second,
        by slots), the best of them (``best_fixed``) and the elastic run's ratio to it."""
        advice = []
        for r in self.runs:
            if r.path != "shm-model" or r.slots != ELASTIC or not r.counts:
                continue
            rate = r.numbers()["requests_per_s"]
            fixed = sorted(
                (f.slots, f.numbers()["requests_per_s"])
                for f in self.runs
                if f.path == r.path and f.concurrency == r.concurrency and f.counts
                if f.slots not in (None, ELASTIC)
            )
            best = max(fixed, key=lambda pair: pair[1], default=(None, None))
            advice.append(
                {
                    "callers": r.concurrency,
                    "settled_slots": r.extra.get("pool_size_settled"),
                    "max_slots_reached": r.extra.get("pool_size_max"),
                    "limited_by": r.extra.get("limited_by", ""),
                    "requests_per_s": rate,
                    "fixed": [{"slots": s, "requests_per_s": v} for s, v in fixed],
                    "best_fixed": best[0],
                    "best_fixed_requests_per_s": best[1],
                    "vs_best_fixed": ratio(rate, best[1]),
                }
            )
        return advice

    def recommendation(self, bound_ms: float | None) -> dict[str, Any] | None:
        """The pool-size answers, by name (``None`` where none has any run to go on):

        - :data:`POOL_SIZE_FOR_THROUGHPUT`: at the sweep's levels (the loads without an
          elastic run), the smallest fixed pool whose shm throughput (``shm-client`` or
          ``shm-model``, as many callers as slots) reaches :data:`RECOMMEND_SHARE` of the
          best measured there (``pool_size``, ``path``, ``requests_per_s``,
          ``best_requests_per_s``), shm-client's MB/s over gRPC's there and the ``/dev/shm``
          such a pool takes; ``None`` without such runs.
        - :data:`ELASTIC_POOL`: per load with an elastic run (:meth:`elastic`), the size the
          pool without pool_size settled on, beside the fixed pools measured there.
        - :data:`POOL_SIZE_FOR_RATE`: per open-loop rate, the smallest pool that sustained it
          within ``bound_ms`` (:meth:`pools_for_rates`).
        """
        elastic = self.elastic()
        loads = {advice["callers"] for advice in elastic}
        shm = [
            (r.numbers()["requests_per_s"], r)
            for r in self.runs
            if r.path in ("shm-client", "shm-model") and r.counts and r.slots == r.concurrency
            if r.concurrency not in loads and not r.many_callers
        ]
        rates = self.pools_for_rates(bound_ms)
        if not shm and not elastic and not rates:
            return None
        throughput = None
        if shm:
            best = max(rate for rate, _ in shm)
            rate, fit = min(
                ((rate, r) for rate, r in shm if rate >= RECOMMEND_SHARE * best),
                key=lambda pair: (pair[1].concurrency, -pair[0]),
            )
            pool = fit.concurrency
            throughput = {
                "pool_size": pool,
                "path": fit.path,
                "requests_per_s": rate,
                "best_requests_per_s": best,
                "shm_vs_grpc": mb_ratio(self.run("shm-client", pool), self.run("grpc", pool)),
                "shm_bytes": fit.extra.get("shm_bytes"),
            }
        return {
            POOL_SIZE_FOR_THROUGHPUT: throughput,
            ELASTIC_POOL: elastic,
            POOL_SIZE_FOR_RATE: rates,
        }


_METRICS = {
    "mb_per_s": "MB/s",
    "requests_per_s": "req/s",
    "cpu_s_per_gb": "CPU s/GB",
    "fairness": "fewest requests of a caller / mean",
    "node_actor_cpu_us": "node actor CPU us/request",
    "wrong_answers": "wrong answers",
    "responses_per_s": "responses/s",
    "first_response_p50_ms": "time to first response p50",
    "samples_per_s": "samples/s",
    "latency_p99_ms": "p99 latency",
    "node_actor_idle_ms_per_s": "node actor idle CPU ms/s",
    "node_actor_us_per_extra_request": "node actor CPU us per extra request",
}
#: The metrics whose goals are at most, not at least.
_AT_MOST: tuple[str, ...] = ("cpu_s_per_gb", "node_actor_cpu_us", "wrong_answers")
_AT_MOST += ("first_response_p50_ms",)
_AT_MOST += ("latency_p99_ms", "node_actor_idle_ms_per_s", "node_actor_us_per_extra_request")


@dataclasses.dataclass(frozen=True)
class Goal:
    """A target on one ``model``: ``metric`` (a key of :meth:`RunResult.numbers`) of ``run``
    (``(path, concurrency, slots)``, the last two optional), or its ratio to ``baseline``'s,
    at least ``target`` (at most, for CPU, latency and wrong answers). A baseline
    ``(CEILING, N)`` is the better of perf_analyzer's runs at N callers
    (:meth:`ModelResult.ceiling`); ``(COPY_LINE, N)`` the line a client that copies reaches
    (:meth:`ModelResult.copy_line`)."""

    model: str
    run: tuple[Any, ...]
    target: float
    baseline: tuple[Any, ...] = ()
    metric: str = "mb_per_s"

    @property
    def description(self) -> str:
        """E.g. ``"shm-client (1 caller) MB/s >= 3x grpc (1 caller)"``."""
        run, metric = describe_run(*self.run), _METRICS[self.metric]
        sign = "<=" if self.metric in _AT_MOST else ">="
        if not self.baseline:
            return f"{run}: {metric} {sign} {self.target:g}"
        base = describe_run(*self.baseline)
        if self.baseline[0] == CEILING:
            base += f", the better of {' and '.join(CEILING_PATHS)}"
        if self.baseline[0] == COPY_LINE:
            base = f"the line of {describe_run('pa-shm', *self.baseline[1:])} plus memcpy's copies"
        return f"{run} {metric} {sign} {self.target:g}x {base}"

    @property
    def paths(self) -> set[str]:
        """The paths it needs run (any of perf_analyzer's for the ceiling)."""
        base = self.baseline[:1]
        if base == (COPY_LINE,):
            return {self.run[0], "pa-shm", "memcpy"}
        return {self.run[0], *base} - {CEILING}

    def measure(self, model: ModelResult) -> float | None:
        """The value this goal is about, or ``None`` if not measured (or disturbed)."""
        run = model.run(*self.run)
        value = run.numbers().get(self.metric) if run and run.counts else None
        if not self.baseline:
            return value
        if self.baseline[0] == COPY_LINE:
            return ratio(value, model.copy_line(self.baseline[1], self.metric))
        if self.baseline[0] == CEILING:
            base = model.ceiling(self.baseline[1])
        else:
            base = model.run(*self.baseline)
        return ratio(value, base.numbers().get(self.metric) if base and base.counts else None)

    def met(self, value: float | None) -> bool | None:
        """Whether ``value`` meets the goal (``None``: not measured)."""
        if value is None:
            return None
        return value <= self.target if self.metric in _AT_MOST else value >= self.target


_LOAD, _LOAD_CASES = NODE_LOAD[0], ("identity", "classifier-1", "classifier")
#: The node actor's idle CPU at most, in ms per second: Ray's own background work was about
#: 10 (whatever the request rate); twice that, 2% of a core.
NODE_ACTOR_IDLE_MS_PER_S = 20.0
#: The goals of node batching in Ray tasks: ``(callers, target, baseline, metric)``.
_BATCHING: tuple[tuple[Any, ...], ...] = (
    (16, 2.0, (CEILING, 16), "samples_per_s"),
    (16, 3.0, ("grpc-procs", 16), "samples_per_s"),
    (16, 1.5, ("shm-model", 16, 16), "samples_per_s"),
    (16, 1.0, ("shm-model", 16, 16), "latency_p99_ms"),
    (16, 1.5, ("grpc-procs-dynamic", 16), "samples_per_s"),
    (64, 3.0, (CEILING, 64), "samples_per_s"),
    (1, 0.95, ("shm-model", 1, 1), "samples_per_s"),
)
_FIXED_4, _FIXED_16 = NODE_LOAD_FIXED
_HTTP_LOAD = max(SERVE_HTTP_CLIENTS)
# fmt: off
#: The project's performance goals: ``Goal``'s arguments (model, run, target, baseline, metric).
_GOALS: tuple[tuple[Any, ...], ...] = (
    # One caller, one request at a time: the client alone.
    ("identity", ("shm-client", 1), 1.0, ("grpc", 1)),
    ("classifier", ("shm-client", 1), 3.0, ("grpc", 1)),
    ("my_model", ("shm-client", 1), 3.0, ("grpc", 1)),
    ("large_image", ("shm-client", 1), 8.0, ("grpc", 1)),
    ("upper-short", ("shm-client", 1), 1.0, ("grpc", 1)),
    ("upper-long", ("shm-client", 1), 1.5, ("grpc", 1)),
    ("classifier", ("shm-client", 1), 1.5, ("memcpy", 1), "cpu_s_per_gb"),
    ("large_image", ("shm-client", 1), 1.5, ("memcpy", 1), "cpu_s_per_gb"),
    # A slot lease: the batch preprocessed into the slot, the outputs read there, against the
    # same preprocessing into the caller's arrays, then infer_shm.
    ("large_image", ("shm-lease", 1), 0.6, ("shm-client-prep", 1), "cpu_s_per_gb"),
    ("classifier", ("shm-lease", 1), 0.9, ("shm-client-prep", 1), "cpu_s_per_gb"),
    *((case, ("shm-lease", callers), 1.0, ("shm-client-prep", callers), "requests_per_s")
      for case in ("classifier", "my_model", "large_image") for callers in (1, 4)),
    # Triton's perf_analyzer, the ceiling (its inputs written once, its outputs never read):
    # the core client near it on tiny requests, at or above it on bulk ones under load.
    *(("identity", ("shm-client", n), target, (CEILING, n)) for n, target in ((1, 0.8), (4, 0.75))),
    *((case, (path, 4), 1.0, ("pa-shm", 4))
      for case, path in (("classifier", "shm-client"), ("my_model", "shm-client"),
                         ("large_image", "shm-lease"))),
    # At one caller, infer_shm copies the inputs into the slot (and the outputs out), which
    # perf_analyzer never does: against the line those copies allow; a lease copies nothing,
    # against perf_analyzer itself.
    *((case, ("shm-client", 1), 0.8, (COPY_LINE, 1)) for case in ("classifier", "my_model")),
    ("large_image", ("shm-lease", 1), 0.8, ("pa-shm", 1)),
    # bench --ray: the same Serve deployment with its replica on each client, and the same
    # Ray Data job with each predictor.
    ("identity", ("serve-shm",), 1.0, ("serve-grpc",)),
    ("classifier-1", ("serve-shm",), 1.0, ("serve-grpc",)),
    ("classifier", ("serve-shm",), 2.3, ("serve-grpc",)),
    ("large_image", ("serve-shm",), 3.5, ("serve-grpc",)),
    *((case, ("serve-shm",), 0.95, ("serve-inproc",))
      for case in ("identity", "classifier-1", "classifier", "my_model", "large_image")),
    ("classifier", ("data-shm",), 0.95, ("data-noop",)),
    ("classifier", ("data-shm",), 1.0, ("data-grpc",)),
    # bench --ray: the example app behind Serve's HTTP proxy, under load, against the same app
    # on plain gRPC and with a no-op model (its ceiling); every answer checked.
    *((case, ("serve-http-shm", _HTTP_LOAD), target, ("serve-http-grpc", _HTTP_LOAD))
      for case, target in (("classifier-1", 1.0), ("classifier", 1.2))),
    *((case, ("serve-http-shm", _HTTP_LOAD), 0.9, ("serve-http-noop", _HTTP_LOAD))
      for case in APP_CASES),
    *((case, (path, clients), 0, (), "wrong_answers") for case in APP_CASES
      for path in SERVE_HTTP_PATHS for clients in SERVE_HTTP_CLIENTS),
    # The node actor before it left the request path: about 1.17 ms of CPU per request. Its
    # idle CPU (Ray's own background work), and its CPU per extra request: the slope from
    # idle to the run's load.
    *(("classifier", (path,), target, (), metric)
      for path in NODE_ACTOR_IDLE_PATHS
      for metric, target in (("node_actor_us_per_extra_request", 0.05 * 1170),
                             ("node_actor_idle_ms_per_s", NODE_ACTOR_IDLE_MS_PER_S))),
    # bench --ray, the node under load: ShmModel as it comes (its pool following its load)
    # against fixed pools of 4 and of 16 node slots, and against plain gRPC.
    *((case, _LOAD, 1.25, _FIXED_4) for case in _LOAD_CASES),
    *((case, _LOAD, 0.95, _FIXED_16) for case in _LOAD_CASES),
    ("identity", _LOAD, 0.85, NODE_LOAD[1]),
    ("classifier-1", _LOAD, 2.5, NODE_LOAD[1]),
    ("classifier", _LOAD, 4.5, NODE_LOAD[1]),
    *((case, _LOAD, 0.5, (), "fairness") for case in _LOAD_CASES),
    # bench --ray, the many-callers case: callers of 1 row each; node batching against
    # perf_analyzer at as many callers, plain gRPC and the library without it in the same
    # processes, Triton's own dynamic batcher (plain gRPC on the model's twin with it on),
    # the same Serve deployment; what it costs a caller alone; and by value.
    *((case, ("shm-model-nb", callers), target, base, metric)
      for case in MANY_CALLERS_CASES
      for callers, target, base, metric in _BATCHING),
    *((case, ("serve-shm-nb", 16), 1.3, ("serve-shm", 16), "samples_per_s")
      for case in MANY_CALLERS_CASES),
    *((case, ("shm-model-nb-byvalue", 16), 1.5, ("grpc-procs-byvalue", 16), "samples_per_s")
      for case in MANY_CALLERS_BY_VALUE_CASES),
    # bench --ray, churn: a caller killed mid-request and replaced every 2 s.
    (CHURN_CASE, CHURN[1], 0.8, CHURN[0], "requests_per_s"),
    *((CHURN_CASE, run, 0, (), "wrong_answers") for run in CHURN),
    # A streaming model (captioner: an image in, 8 responses out): the library's streams
    # (threads, and tasks on an event loop) against tritonclient's streaming client (a client
    # per caller, inputs by value), in responses per second and time to the first response;
    # ShmModel.stream in Ray tasks, and a Serve replica streaming to a handle, likewise.
    *(("captioner", (path, n), target, ("stream-grpc", n), "responses_per_s")
      for path in ("stream-client", "stream-async")
      for n, target in ((1, 1.0), (4, 1.5), (16, 1.5))),
    *(("captioner", (path, n), 1.0, ("stream-grpc", n), "first_response_p50_ms")
      for path in ("stream-client", "stream-async") for n in (1, 4)),
    ("captioner", ("stream-model",), 1.2, ("stream-grpc-procs",), "responses_per_s"),
    ("captioner", ("serve-stream",), 1.0, ("serve-stream-grpc",), "responses_per_s"),
    # bench --memory cuda: tensors on the GPU, against tritonclient's CUDA utilities by hand
    # and against system shared memory (through the host).
    *((case, ("cuda-client-torch", 1), 0.9, ("cuda-manual-torch", 1))
      for case in ("gpu-16MiB", "gpu-64MiB")),
    ("gpu-64MiB", ("cuda-client-torch", 1), 30.0, ("shm-client-torch", 1)),
    ("gpu-64MiB", ("cuda-client", 1), 2.0, ("cuda-manual", 1)),
    ("gpu-1MiB", ("cuda-client-torch", 1), 1.0, ("shm-client-torch", 1)),
)
# fmt: on
GOALS = tuple(Goal(*goal) for goal in _GOALS)


@dataclasses.dataclass
class BenchResults:
    """Everything one run of ``config`` measured, on the ``server`` (``"embedded"`` or its URL)."""

    config: BenchConfig
    models: list[ModelResult]
    server: str
    duration_s: float = 0.0
    #: The model update under load (:mod:`._update`), when it ran.
    model_update: UpdateResult | None = None
    #: Every crash of Triton (or outage of a remote one) while the bench ran.
    outages: list[Outage] = dataclasses.field(default_factory=list)
    #: Why the bench stopped before the end (Triton gone for good, Ctrl-C), if it did.
    stopped: str | None = None

    def goals(self) -> list[tuple[Goal, float | None]]:
        """Every goal whose model and paths were run (:meth:`ModelResult.goals`: a model by
        value has goals of its own), with its measured value."""
        by_model = {m.name: m for m in self.models}
        paths = {*self.config.paths}
        chosen = [
            g
            for g in GOALS
            if g.model in by_model and not (by_model[g.model].by_value and g.baseline)
        ]
        chosen += [g for m in self.models if m.by_value for g in m.by_value_goals()]
        return [
            (goal, goal.measure(by_model[goal.model]))
            for goal in chosen
            if goal.paths <= paths
            if goal.baseline[:1] != (CEILING,) or paths & {*CEILING_PATHS}
        ]

    @property
    def failures(self) -> list[str]:
        """``"model: error"`` or ``"model/run: error"`` for every failure."""
        return (
            [f"{m.name}: {m.error}" for m in self.models if m.error]
            + [
                f"{m.name}/{describe_run(r.path, r.concurrency, r.slots)}: {r.error}"
                for m in self.models
                for r in m.runs
                if r.error is not None and r.disturbed is None
            ]
            + [
                f"{m.name}/{r.rate_label} at {r.rate_spec} requests/s: {r.error}"
                for m in self.models
                for r in m.rate_runs
                if r.error is not None and r.disturbed is None
            ]
            + (
                [f"model update: {update_failure(self.model_update)}"]
                if self.model_update is not None and not self.model_update.ok
                else []
            )
        )

    def disturbed(self) -> list[str]:
        """``"model/run"`` for every run a crash or outage of Triton touched."""
        return [
            f"{m.name}/{describe_run(r.path, r.concurrency, r.slots)}"
            + (f" at {r.rate_spec} requests/s" if r.rate_spec else "")
            for m in self.models
            for r in (*m.runs, *m.rate_runs)
            if r.disturbed is not None
        ]


def host_info() -> dict[str, Any]:
    """The machine and the versions that matter to the numbers."""
    import os
    import platform
    from importlib import metadata

    versions = {}
    for package in ("ray-triton-shm", "tritonclient", "numpy", "ray", "grpcio"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "versions": versions,
    }


def update_failure(update: UpdateResult) -> str:
    if update.error is not None:
        return update.error
    return (
        f"{update.wrong_answers} wrong answer(s), {update.new_config_answers} from the new "
        f"config, {update.old_regions_left} old region(s) left"
    )


#: The model update under load (:mod:`._update`): its callers and their slots.
UPDATE_CALLERS = 8
UPDATE_SLOTS = 4


@dataclasses.dataclass
class UpdateResult:
    """What one model update under load measured (see the module docstring)."""

    callers: int = UPDATE_CALLERS
    slots: int = UPDATE_SLOTS
    duration_s: float = 0.0
    old_config_answers: int = 0
    new_config_answers: int = 0
    failed: int = 0
    wrong_answers: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    reload_s: float | None = None
    first_new_answer_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    old_regions_left: int = 0
    error: str | None = None
    #: When it began (``time.time()``), and what happened to Triton meanwhile, if anything.
    started_at: float = dataclasses.field(default_factory=time.time)
    disturbed: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the run met its promises: every answer right, nothing left behind (or Triton
        crashed meanwhile, which says nothing of them)."""
        return self.disturbed is not None or (
            self.error is None
            and self.wrong_answers == 0
            and self.old_regions_left == 0
            and self.new_config_answers > 0
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
