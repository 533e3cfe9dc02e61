"""Runs the paths at every level of the sweep, interleaved, and collects the numbers.

For each model the runs come in groups: one per ``--concurrency`` level (the sweep paths at
that level, and the one-caller paths at level 1), the Serve and Ray Data paths (with
``--ray-callers`` callers), the node under load, and each churn run. The runs of a group are
set up together, then measured in interleaved rounds (one time slice per run per round, the
order rotating each round), so that load from other processes hits them alike. Each run's
first request is checked against a plain gRPC reference before its numbers count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ray_triton_shm import _cuda
from ray_triton_shm._bench import _gpu_paths, _paths, _ray_paths, _serve_http
from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._config import (
    CHURN,
    DEFAULT_PATHS,
    ELASTIC,
    GPU_PATHS,
    NODE_LOAD,
    NODE_LOAD_FIXED,
    NODE_LOAD_WARMUP_S,
    RAY_PATHS,
    SERVE_HTTP_CLIENTS,
    SERVE_HTTP_PATHS,
    SWEEP_PATHS,
    BenchConfig,
    CaseSpec,
)
from ray_triton_shm._bench._paths import (
    BenchPath,
    BenchTarget,
    OpenLoop,
    SkipPath,
    arrival_times,
    check_outputs,
)
from ray_triton_shm._bench._ray_paths import CHURN_CASE
from ray_triton_shm._bench._ray_session import RayBenchSession, RayPath
from ray_triton_shm._bench._update import UpdateResult, run_model_update
from ray_triton_shm._bench._watch import Outage, TritonGone, TritonWatch
from ray_triton_shm._plain_client import tritonclient_for
from ray_triton_shm.local._server import LocalTritonServer

__all__ = ["GOALS", "PATHS", "BenchResults", "Goal", "ModelResult", "Progress", "RunResult"]
__all__ += ["describe_rate_path", "describe_run", "rate_groups", "run_bench", "run_groups"]
__all__ += ["ELASTIC_POOL", "POOL_SIZE_FOR_RATE", "POOL_SIZE_FOR_THROUGHPUT", "RECOMMEND_SHARE"]

#: Every path, by name: those without Ray, then the Ray paths.
_CLASSES = {
    cls.name: cls
    for cls in (*_paths.PATHS, *_ray_paths.PATHS, *_serve_http.PATHS, *_gpu_paths.PATHS)
}
PATHS: dict[str, type[BenchPath]] = {
    name: _CLASSES[name] for name in dict.fromkeys((*DEFAULT_PATHS, *RAY_PATHS, *GPU_PATHS))
}
#: The paths run with ``--ray-callers`` callers, in a group of their own.
_RAY_CHOICES = ("serve-grpc", "serve-shm", "serve-inproc", "data-grpc", "data-shm", "data-noop")
_CHURN_PATHS = tuple(path for path, _, _ in CHURN)
#: Triton's CUDA memory pool on GPU 0 for ``--memory cuda`` (inputs and outputs of 64 MiB).
_CUDA_POOL_BYTES = 1 << 30
#: A run: ``(path, concurrency, slots)``; slots ``None`` for the paths without any,
#: :data:`~._config.ELASTIC` for a pool that follows its load.
RunKey = tuple[str, int, "int | None"]
#: The runs of the node under load (each gets :data:`~._config.NODE_LOAD_WARMUP_S` of load).
_NODE_LOAD_KEYS = {*NODE_LOAD, *NODE_LOAD_FIXED}
#: The shm throughput a recommended pool reaches, over the best one measured.
RECOMMEND_SHARE = 0.95
#: The three pool-size answers, each to a question of its own, by the one name the terminal,
#: the report and the JSON give it: the fewest slots of a fixed pool near the most
#: closed-loop throughput; the size the elastic pool (no pool_size) settled on under N
#: callers; the smallest fixed pool that sustained each open-loop request rate.
POOL_SIZE_FOR_THROUGHPUT = "pool_size_for_throughput"
ELASTIC_POOL = "elastic_pool"
POOL_SIZE_FOR_RATE = "pool_size_for_rate"


class Progress:
    """Where the runner reports progress, here nowhere: ``start(total)`` units of work, a new
    ``stage(text)``, ``advance(units)`` done, and ``stop()`` when the run is over; and where
    it says what happened to Triton as it happens (``say(text)``, on stderr here)."""

    def start(self, total: int) -> None: ...
    def stage(self, text: str) -> None: ...
    def advance(self, units: int = 1) -> None: ...
    def stop(self) -> None: ...

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)


def describe_slots(slots: int | None) -> str:
    """``"4 slots"``, or ``"elastic pool"`` for :data:`~._config.ELASTIC`."""
    return "elastic pool" if slots == ELASTIC else f"{slots} slot{'s' * (slots != 1)}"


def describe_run(path: str, concurrency: int | None = None, slots: int | None = None) -> str:
    """E.g. ``"shm-model (16 callers, 4 slots)"``, ``"shm-model (16 callers, elastic pool)"``,
    ``"shm-client (4 callers)"`` (its slots said where they differ from the callers, and
    always for ``shm-model``, whose default pool is elastic); ``path`` alone without a
    concurrency."""
    if concurrency is None:
        return path
    callers = f"{concurrency} caller{'s' * (concurrency > 1)}"
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


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


@dataclasses.dataclass
class RunResult:
    """One path at one concurrency (on ``slots`` slots, for the shm paths) on one model: its
    time, client CPU time (every thread of every client process) and the node actor's
    (``None``: not used) over the slices, every request's latency per caller, why it was
    ``skipped`` or failed (``error``), and the path's own numbers (``extra``); see
    :meth:`numbers`."""

    path: str
    concurrency: int
    slots: int | None
    case: ModelCase
    wall_s: float = 0.0
    cpu_s: float = 0.0
    side_cpu_s: float | None = 0.0
    latencies_s: list[list[float]] = dataclasses.field(default_factory=list)
    verified: bool = False
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

    def add(self, wall_s: float, cpu_s: float, side_cpu_s: float | None, latencies: list) -> None:
        """Adds one slice: its times, and each caller's latencies."""
        self.rounds.append((wall_s, sum(map(len, latencies))))
        self.wall_s += wall_s
        self.cpu_s += cpu_s
        if self.side_cpu_s is not None:
            self.side_cpu_s = None if side_cpu_s is None else self.side_cpu_s + side_cpu_s
        self.latencies_s = self.latencies_s or [[] for _ in latencies]
        for mine, more in zip(self.latencies_s, latencies):
            mine.extend(more)

    @property
    def ok(self) -> bool:
        """Whether the run produced valid numbers (an open-loop run that dropped every
        request did not)."""
        done = self.verified and not self.error and not self.skipped
        return done and self.wall_s > 0 and any(self.latencies_s)

    @property
    def counts(self) -> bool:
        """Whether its numbers count for verdicts, goals and advice: valid, and no crash or
        outage of Triton touched them."""
        return self.ok and self.disturbed is None

    def numbers(self) -> dict[str, Any]:
        """Requests, samples and input MB (1e6 B) per second, ``latency_ms`` (p50, p90 and
        p99 of a request's), client CPU s per GB (1e9 B) of input, ``fairness`` (the fewest
        requests a caller completed over the mean, with several callers), the node actor's
        CPU us per request, and the path's own numbers; empty for a run without numbers."""
        if not self.ok:
            return {}
        requests = sum(map(len, self.latencies_s))
        every = np.concatenate([np.array(caller) for caller in self.latencies_s]) * 1e3
        done = [len(caller) for caller in self.latencies_s]
        gigabytes = requests * self.case.input_nbytes / 1e9
        return {
            "requests_per_s": requests / self.wall_s,
            "samples_per_s": requests * self.case.batch_size / self.wall_s,
            "mb_per_s": gigabytes * 1e3 / self.wall_s,
            "latency_ms": dict(
                zip(("p50", "p90", "p99"), np.percentile(every, [50, 90, 99]).tolist())
            ),
            "cpu_s_per_gb": self.cpu_s / gigabytes if gigabytes else None,
            "fairness": min(done) / (requests / len(done)) if len(done) > 1 else None,
            "node_actor_cpu_us": _ratio(self.side_cpu_s, requests / 1e6),
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
            "requests": requests,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "mb_per_s_rounds": self.round_mb_per_s(),
        }

    def round_mb_per_s(self) -> list[float]:
        """Input MB (1e6 B) per second of each round's slice."""
        megabytes = self.case.input_nbytes / 1e6
        return [requests * megabytes / wall for wall, requests in self.rounds if wall > 0]


def mb_ratio(run: RunResult | None, baseline: RunResult | None) -> float | None:
    """``run``'s MB/s over ``baseline``'s (``None`` if either has none)."""
    value = run.numbers().get("mb_per_s") if run else None
    return _ratio(value, baseline.numbers().get("mb_per_s") if baseline else None)


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
                    "vs_best_fixed": _ratio(rate, best[1]),
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
            if r.concurrency not in loads
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
}
#: The metrics whose goals are at most, not at least.
_AT_MOST = ("cpu_s_per_gb", "node_actor_cpu_us", "wrong_answers")


@dataclasses.dataclass(frozen=True)
class Goal:
    """A target on one ``model``: ``metric`` (a key of :meth:`RunResult.numbers`) of ``run``
    (``(path, concurrency, slots)``, the last two optional), or its ratio to ``baseline``'s,
    at least ``target`` (at most, for CPU and wrong answers)."""

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
        return f"{run} {metric} {sign} {self.target:g}x {describe_run(*self.baseline)}"

    def measure(self, model: ModelResult) -> float | None:
        """The value this goal is about, or ``None`` if not measured (or disturbed)."""
        run = model.run(*self.run)
        value = run.numbers().get(self.metric) if run and run.counts else None
        if not self.baseline:
            return value
        base = model.run(*self.baseline)
        return _ratio(value, base.numbers().get(self.metric) if base and base.counts else None)

    def met(self, value: float | None) -> bool | None:
        """Whether ``value`` meets the goal (``None``: not measured)."""
        if value is None:
            return None
        return value <= self.target if self.metric in _AT_MOST else value >= self.target


_LOAD, _LOAD_CASES = NODE_LOAD[0], ("identity", "classifier-1", "classifier")
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
      for case in _serve_http.APP_CASES),
    *((case, (path, clients), 0, (), "wrong_answers") for case in _serve_http.APP_CASES
      for path in SERVE_HTTP_PATHS for clients in SERVE_HTTP_CLIENTS),
    # The node actor before it left the request path: about 1.17 ms of CPU per request.
    ("classifier", ("serve-shm",), 0.05 * 1170, (), "node_actor_cpu_us"),
    ("classifier", ("data-shm",), 0.05 * 1170, (), "node_actor_cpu_us"),
    # bench --ray, the node under load: ShmModel as it comes (its pool following its load)
    # against fixed pools of 4 and of 16 node slots, and against plain gRPC.
    *((case, _LOAD, 1.25, _FIXED_4) for case in _LOAD_CASES),
    *((case, _LOAD, 0.95, _FIXED_16) for case in _LOAD_CASES),
    ("identity", _LOAD, 0.85, NODE_LOAD[1]),
    ("classifier-1", _LOAD, 2.5, NODE_LOAD[1]),
    ("classifier", _LOAD, 4.5, NODE_LOAD[1]),
    *((case, _LOAD, 0.5, (), "fairness") for case in _LOAD_CASES),
    # bench --ray, churn: a caller killed mid-request and replaced every 2 s.
    (CHURN_CASE, CHURN[1], 0.8, CHURN[0], "requests_per_s"),
    *((CHURN_CASE, run, 0, (), "wrong_answers") for run in CHURN),
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
        """Every goal whose model and paths were run, with its measured value."""
        by_model = {m.name: m for m in self.models}
        return [
            (goal, goal.measure(by_model[goal.model]))
            for goal in GOALS
            if goal.model in by_model and {goal.run[0], *goal.baseline[:1]} <= {*self.config.paths}
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
                [f"model update: {_update_failure(self.model_update)}"]
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view: ``runs`` (those that posted numbers; ``disturbed``: what
        happened to Triton meanwhile, which keeps them from every verdict), ``verdicts`` and
        ``recommendations`` first."""
        from ray_triton_shm._bench._summary import verdicts_json  # it imports this module

        bound = self.config.latency_bound_ms
        recommendations = {m.name: m.recommendation(bound) for m in self.models}
        return {
            "schema": "ray-triton-shm-bench/3",
            "runs": [
                {"model": m.name, "path": r.path, "concurrency": r.concurrency, "slots": r.slots}
                | r.numbers()
                | {"disturbed": r.disturbed}
                for m in self.models
                for r in m.runs
                if r.ok
            ],
            "verdicts": verdicts_json(self),
            "recommendations": {name: r for name, r in recommendations.items() if r},
            "rate_runs": [
                {"model": m.name, "path": r.path, "slots": r.slots, "rate_spec": r.rate_spec}
                | {"arrivals": self.config.arrivals, "max_threads": self.config.max_threads}
                | r.numbers()
                | {"sustained": r.sustained(bound), "disturbed": r.disturbed}
                for m in self.models
                for r in m.rate_runs
                if r.ok
            ],
            "rate_limits": {m.name: m.rate_limits(bound) for m in self.models if m.rate_runs},
            "models": {m.name: {"error": m.error, "skipped": m.skipped()} for m in self.models},
            "goals": [
                {"model": g.model, "description": g.description, "target": g.target}
                | {"value": value, "met": g.met(value)}
                for g, value in self.goals()
            ],
            "failures": self.failures,
            "stopped": self.stopped,
            "triton_crashes": [outage.to_dict() for outage in self.outages],
            "disturbed": self.disturbed(),
            "units": {"mb": "1e6 bytes of input", "gb": "1e9 bytes of input"},
            "config": dataclasses.asdict(self.config),
            "server": self.server,
            "host": host_info(),
            "duration_s": self.duration_s,
            "model_update": None if self.model_update is None else self.model_update.to_dict(),
        }


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


#: The paths whose slots are as many as their callers.
_POOLED = ("shm-client", "shm-client-prep", "shm-lease", "shm-model")


def run_groups(config: BenchConfig) -> list[list[RunKey]]:
    """The runs of every model, in groups whose runs are interleaved (see the module doc)."""
    levels = config.concurrency
    grouped = (*SWEEP_PATHS, *_RAY_CHOICES, *SERVE_HTTP_PATHS, *_CHURN_PATHS)
    one = [p for p in config.paths if p not in grouped]
    groups = [
        [
            (path, level, level if path in _POOLED else None)
            for path in config.paths
            if (path in SWEEP_PATHS and level in levels) or (path in one and level == 1)
        ]
        for level in sorted({*levels, *([1] if one else [])})
    ]
    groups.append([(p, config.ray_callers, None) for p in config.paths if p in _RAY_CHOICES])
    http = [p for p in config.paths if p in SERVE_HTTP_PATHS]
    groups.append([(p, clients, None) for clients in SERVE_HTTP_CLIENTS for p in http])
    if config.node_load and "shm-model" in config.paths:
        swept = {key for group in groups for key in group}
        groups.append([key for key in NODE_LOAD if key[0] in config.paths and key not in swept])
        # A group each: a node actor holds one sizing of a model.
        groups += [[key] for key in NODE_LOAD_FIXED if key not in swept]
    groups.append([key for key in CHURN if key[0] in config.paths])
    return [group for group in groups if group]


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _prepare(
    spec: CaseSpec, target: BenchTarget
) -> tuple[ModelCase, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The case made from the model's configuration, one request's inputs, and the plain gRPC
    answer every path must reproduce."""
    client = tritonclient_for(target.grpc_url)
    try:
        config = client.get_model_config(spec.model, as_json=True)
        case = ModelCase.from_config(spec, config.get("config", config))
        inputs = case.make_inputs(seed=zlib.crc32(spec.model.encode()))
        reference = {name: np.array(a) for name, a in _paths.infer(client, case, inputs).items()}
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return case.with_reference(reference), inputs, reference


def _fresh_node_actor(
    stack: contextlib.ExitStack, session: RayBenchSession | None, keys: list[RunKey]
) -> None:
    """A fresh node actor for runs ``keys`` if any uses one, ended with ``stack``."""
    if session is not None and any(PATHS[key[0]].uses_node_actor for key in keys):
        session.end_node_actor()
        stack.callback(session.end_node_actor)


def _set_up(path: BenchPath, reference: Mapping[str, np.ndarray], config: BenchConfig) -> None:
    """Sets ``path`` up, checks its first answer against ``reference``, and warms it up."""
    path.setup()
    check_outputs(path.run_once(), reference)
    for _ in range(config.warmup_requests - 1):
        path.run_once()


def _guarded(
    runs: list[RunResult], watch: TritonWatch, step: Callable[[], None], *, setup: bool = False
) -> None:
    """Runs ``step`` (a set-up, a warm-up or a slice of ``runs``). A crash or outage of
    Triton that touched it marks the runs disturbed; a failure it caused waits until Triton is
    back and lets the runs go on (but for a ``setup``: those runs have no path to go on with);
    any other failure fails them. Raises :class:`TritonGone` when Triton will not come back."""
    start = time.time()
    try:
        step()
    except TritonGone:
        raise
    except Exception as exc:
        try:
            watch.wait_back()
        finally:  # marked before the bench stops too, when Triton is gone
            why = watch.disturbance(start, time.time(), failed=True)
            for r in runs:
                r.disturbed = why or r.disturbed
                if why is None or setup:
                    r.error = _describe(exc)
    else:
        why = watch.disturbance(start, time.time())
        for r in runs:
            r.disturbed = why or r.disturbed
    watch.raise_if_gone()


def _run_group(
    group: list[RunKey],
    model: ModelResult,
    paths: Mapping[str, Any],
    config: BenchConfig,
    session: RayBenchSession | None,
    progress: Progress,
    watch: TritonWatch,
) -> None:
    """Sets up the runs of ``group``, then measures them in interleaved rounds."""
    assert model.case is not None
    with contextlib.ExitStack() as stack:
        _fresh_node_actor(stack, session, group)
        active: list[tuple[RunResult, BenchPath]] = []
        for name, concurrency, slots in group:
            cls, case = PATHS[name], model.case
            r = RunResult(name, concurrency, slots, case)
            model.runs.append(r)
            watch.run = f"{model.name}: {describe_run(name, concurrency, slots)}"
            path = cls(concurrency=concurrency, slots=slots, session=session, **paths)
            stack.callback(path.teardown)

            def set_up(r: RunResult = r, path: BenchPath = path) -> None:
                try:
                    _set_up(path, paths["reference"], config)
                    r.verified = True
                    active.append((r, path))
                except SkipPath as exc:
                    r.skipped = str(exc)

            _guarded([r], watch, set_up, setup=True)
            progress.advance(1 if r.verified else 1 + config.rounds)
        for r, path in active:
            key = (r.path, r.concurrency, r.slots)
            warm_s = NODE_LOAD_WARMUP_S if key in _NODE_LOAD_KEYS else 0.0
            watch.run = f"{model.name}: {describe_run(*key)}"
            _guarded([r], watch, functools.partial(path.warm_up, warm_s))
        for index in range(config.rounds):
            # Rotate the order so no run always comes right after the same neighbour.
            shift = index % len(active) if active else 0
            for r, path in active[shift:] + active[:shift]:
                if path.max_rounds is not None and index >= path.max_rounds:
                    progress.advance()
                    continue
                if r.error is None:
                    watch.run = f"{model.name}: {describe_run(r.path, r.concurrency, r.slots)}"
                    _guarded([r], watch, functools.partial(_slice, r, path, config))
                progress.advance()
        for r, path in active:
            with contextlib.suppress(Exception):
                r.extra.update(path.stats())


def _slice(r: RunResult, path: BenchPath, config: BenchConfig) -> None:
    """One slice of ``r`` on ``path``, added to ``r``."""
    cpu, side = path.cpu_time(), path.side_cpu_time()
    churn = r.path in _CHURN_PATHS
    slice_s = config.churn_s / config.rounds if churn else config.slice_s
    latencies, wall_s = path.run_slice(slice_s * path.slice_factor)
    after = path.side_cpu_time()
    spent = None if side is None or after is None else after - side
    r.add(wall_s, path.cpu_time() - cpu, spent, latencies)


def rate_groups(config: BenchConfig) -> list[list[RunKey]]:
    """The open-loop runs' paths (without their rates), a group per ``--concurrency`` level:
    the core client and ``ShmModel`` (in ``--ray-callers`` processes) on that many slots,
    and plain gRPC with ``--max-threads`` threads in the first. (A node actor has one slot
    count: the groups each start a fresh one.)"""
    groups: list[list[RunKey]] = []
    for level in config.concurrency:
        group: list[RunKey] = (
            [] if groups or "grpc" not in config.paths else [("grpc", config.max_threads, None)]
        )
        for path, callers in (("shm-client", level), ("shm-model", config.ray_callers)):
            if path in config.paths:
                group.append((path, callers, level))
        if group:
            groups.append(group)
    return groups


def rate_slice_s(config: BenchConfig, rate: float) -> float:
    """Seconds of arrivals per slice at ``rate``: ``--slice-s``, longer at low rates so that
    a slice has a few dozen requests (two seconds at most)."""
    return max(config.slice_s, min(25 / rate, 2.0))


def _run_rates(
    keys: list[RunKey],
    model: ModelResult,
    paths: Mapping[str, Any],
    config: BenchConfig,
    session: RayBenchSession | None,
    progress: Progress,
    watch: TritonWatch,
) -> None:
    """The open loop at every ``--request-rate`` on ``model``: each path set up once, then
    every (path, rate) run measured in interleaved rounds, as :func:`_run_group` does."""
    assert model.case is not None
    specs = config.rates_on(model.name)
    grpc = [r.numbers()["requests_per_s"] for r in model.runs if r.path == "grpc" and r.counts]
    with contextlib.ExitStack() as stack:
        _fresh_node_actor(stack, session, keys)
        active: list[tuple[BenchPath, RunResult]] = []
        for name, concurrency, slots in keys:
            runs = [RunResult(name, concurrency, slots, model.case, rate_spec=s) for s in specs]
            model.rate_runs += runs
            watch.run = f"{model.name}: open loop, {describe_rate_path(name, concurrency, slots)}"
            path = PATHS[name](concurrency=concurrency, slots=slots, session=session, **paths)
            stack.callback(path.teardown)

            def set_up(runs: list[RunResult] = runs, path: BenchPath = path) -> None:
                try:
                    rates = [config.rate(spec, max(grpc, default=None)) for spec in specs]
                    _set_up(path, paths["reference"], config)
                    for r, rate in zip(runs, rates):
                        r.rate, r.verified = rate, True
                        active.append((path, r))
                except SkipPath as exc:
                    for r in runs:
                        r.skipped = str(exc)

            _guarded(runs, watch, set_up, setup=True)
            progress.advance(len(runs) * (1 if runs[0].verified else 1 + config.rounds))
        for index in range(config.rounds):
            shift = index % len(active) if active else 0
            for path, r in active[shift:] + active[:shift]:
                assert r.rate is not None
                if r.error is None:
                    watch.run = f"{model.name}: open loop, {r.rate_label} at {r.rate_spec}/s"

                    def step(path: BenchPath = path, r: RunResult = r, index: int = index) -> None:
                        assert r.rate is not None
                        planned_s = rate_slice_s(config, r.rate)
                        due = arrival_times(r.rate, planned_s, config.arrivals, seed=index)
                        cpu = path.cpu_time()
                        loop = path.run_rate(due, config.max_threads, give_up_s=planned_s)
                        r.add_open_loop(loop, planned_s, path.cpu_time() - cpu)

                    _guarded([r], watch, step)
                progress.advance()


def _sort_rate_runs(model: ModelResult, config: BenchConfig) -> None:
    """By rate, then in :func:`rate_groups` order."""
    keys = [key for group in rate_groups(config) for key in group]
    order = {key: index for index, key in enumerate(keys)}
    model.rate_runs.sort(key=lambda r: (r.rate or 0.0, order[r.path, r.concurrency, r.slots]))


def _units(config: BenchConfig, name: str) -> int:
    """The progress units of the case ``name``: a set-up and a slice per round, per run."""
    rates = sum(map(len, rate_groups(config))) * len(config.rates_on(name))
    runs = sum(map(len, run_groups(config))) + rates
    return runs * (1 + config.rounds)


def _run_model(
    model: ModelResult,
    target: BenchTarget,
    config: BenchConfig,
    session: RayBenchSession | None,
    progress: Progress,
    watch: TritonWatch,
) -> None:
    spec = config.case(model.name)
    groups = run_groups(config)
    progress.stage(f"{spec.name}: reading the model configuration")
    watch.run = f"{spec.name}: reading the model configuration"
    for attempt in range(2):  # again if a crash of Triton was why it failed
        start = time.time()
        try:
            model.case, inputs, reference = _prepare(spec, target)
            break
        except Exception as exc:
            watch.wait_back()
            if attempt or watch.disturbance(start, time.time(), failed=True) is None:
                model.error = _describe(exc)
                progress.advance(_units(config, spec.name))
                return
    paths = {"target": target, "case": model.case, "inputs": inputs, "reference": reference}
    for group in groups:
        progress.stage(f"{spec.name}: {', '.join(describe_run(*key) for key in group)}")
        _run_group(group, model, paths, config, session, progress, watch)
    if config.rates_on(spec.name):
        rates = " ".join(config.rates_on(spec.name))
        for keys in rate_groups(config):
            runs = ", ".join(describe_rate_path(*key, detailed=True) for key in keys)
            progress.stage(f"{spec.name}: open loop at {rates} requests/s: {runs}")
            _run_rates(keys, model, paths, config, session, progress, watch)
        _sort_rate_runs(model, config)


def run_bench(config: BenchConfig, *, progress: Progress | None = None) -> BenchResults:
    """Runs the benchmark, reporting to ``progress``; everything acquired (server, regions,
    registrations, connections, Ray) is released before this returns or raises.

    The embedded Triton is restarted when it crashes (unless ``config.restart_on_crash`` is
    off): the run in progress is marked disturbed and the bench goes on. When Triton will not
    come back, or on ``KeyboardInterrupt``, the results of what ran are returned with
    :attr:`BenchResults.stopped` saying why. Raises ``KeyError`` for an unknown path, and
    ``LocalServerError`` if the embedded server does not start."""
    unknown = [name for name in config.paths if name not in PATHS]
    if unknown:
        raise KeyError(f"unknown path(s): {', '.join(unknown)}")
    progress = progress or Progress()
    progress.start(sum(_units(config, name) for name in config.models))
    start = time.perf_counter()
    progress.stage("starting the Triton server" if config.url is None else "connecting")
    local: LocalTritonServer | None = None
    models: list[ModelResult] = []
    watch = _watch(config, progress)
    results = BenchResults(config, models, config.url or "embedded", outages=watch.outages)
    try:
        with contextlib.ExitStack() as stack:
            if config.memory == "cuda":
                _cuda.find_device(0)  # no GPU here: said before a server starts (CudaError)
            if config.url is None:
                local = _embedded_server(config, watch)
                stack.enter_context(contextlib.closing(local)).start()
                # Dying, it may still run a while (Triton's handler of fatal signals).
                url = local.grpc_url
                watch.follow(lambda: local is not None and local.is_running and _is_live(url))
                target = BenchTarget(
                    local.grpc_url,
                    local.http_url,
                    server_pid=local.pid,
                    reconnect_timeout_s=config.reconnect_timeout_s,
                )
            else:
                target = BenchTarget(
                    config.url, config.http_url, reconnect_timeout_s=config.reconnect_timeout_s
                )
                watch.probe()
            session = None
            if any(issubclass(PATHS[name], RayPath) for name in config.paths):
                progress.stage("starting Ray")
                session = stack.enter_context(RayBenchSession(target))
            for name in config.models:
                models.append(ModelResult(name))
                # A restart gives the embedded server a new process (its CPU is measured).
                target = dataclasses.replace(target, server_pid=local.pid if local else None)
                _run_model(models[-1], target, config, session, progress, watch)
            progress.stage("cleaning up")
        if config.url is None and config.model_update_s > 0:  # alone: Ray and Triton are gone
            progress.stage("a model's config reloaded under load")
            watch.run = "the model update under load"
            results.model_update = run_model_update(
                duration_s=config.model_update_s,
                startup_timeout_s=config.startup_timeout_s,
                server_options=_supervision(config, watch),
            )
            results.model_update.disturbed = watch.disturbance(
                results.model_update.started_at, time.time()
            )
    except TritonGone as exc:
        results.stopped = f"Triton is gone: {exc}"
    except KeyboardInterrupt:
        results.stopped = "interrupted (Ctrl-C)"
    results.duration_s = time.perf_counter() - start
    return results


def _watch(config: BenchConfig, progress: Progress) -> TritonWatch:
    """The watch on the bench's Triton: the embedded server's process says whether it is up
    (told by :meth:`TritonWatch.follow` once it runs), a remote one is asked."""
    url = config.url
    return TritonWatch(
        (lambda: True) if url is None else (lambda: _is_live(url)),
        supervised=url is None,
        give_up_s=config.reconnect_timeout_s,
        say=progress.say,
    )


def _is_live(url: str) -> bool:
    client = tritonclient_for(url)
    try:
        return bool(client.is_server_live(client_timeout=1.0))
    finally:
        client.close()


def _supervision(config: BenchConfig, watch: TritonWatch) -> dict[str, Any]:
    """``LocalTritonServer``'s arguments that tie its supervisor to the bench."""
    return {"restart_on_crash": config.restart_on_crash, "on_event": watch.on_event}


def _embedded_server(config: BenchConfig, watch: TritonWatch) -> LocalTritonServer:
    """The embedded Triton, its crashes told to ``watch``: the example models, or
    ``identity_gpu`` on GPU 0 for ``--memory cuda`` (with a CUDA memory pool for its 64 MiB
    tensors)."""
    options: dict[str, Any] = {"startup_timeout_s": config.startup_timeout_s, "install": True}
    options |= _supervision(config, watch)
    if config.memory != "cuda":
        return LocalTritonServer(**options)
    return LocalTritonServer(
        _gpu_paths.GPU_MODEL_REPOSITORY,
        extra_args=[f"--cuda-memory-pool-byte-size=0:{_CUDA_POOL_BYTES}"],
        **options,
    )


def _update_failure(update: UpdateResult) -> str:
    if update.error is not None:
        return update.error
    return (
        f"{update.wrong_answers} wrong answer(s), {update.new_config_answers} from the new "
        f"config, {update.old_regions_left} old region(s) left"
    )
