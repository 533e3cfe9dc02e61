"""What a benchmark run does: the ``bench`` options, their defaults and the run configuration,
and options as data (:data:`Option`), which the command line's are too. It imports nothing
heavy (no numpy, tritonclient or Ray): ``ray-triton-shm --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["CASE_NAMES", "CHURN", "DEFAULT_PATHS", "EXAMPLE_CASES", "NODE_LOAD", "RAY_PATHS"]
__all__ += ["CEILING_PATHS"]
__all__ += ["ELASTIC", "GPU_CASES", "GPU_PATHS", "NODE_LOAD_FIXED", "NODE_LOAD_WARMUP_S"]
__all__ += ["APP_CASES", "CHURN_CASE", "CHURN_KILL_EVERY_S", "DATA_CASE", "DATA_JOB_BATCHES"]
__all__ += ["DATA_JOB_ROUNDS", "POOL_SAMPLE_S", "REPLICAS"]
__all__ += ["BY_VALUE", "BY_VALUE_SHARE", "BY_VALUE_TWINS", "LIBRARY_PATHS", "SHM"]
__all__ += ["RAY_STREAM_PATHS", "STREAM_CEILING_PATHS", "STREAM_LEVELS", "STREAM_PATHS"]
__all__ += ["STREAM_RESPONSES", "STREAM_TWINS", "STREAM_VARIANTS"]
__all__ += ["BATCHING_PATHS", "BY_VALUE_PATHS", "DYNAMIC_SUFFIX", "GRPC_TWINS", "MANY_CALLERS"]
__all__ += ["MANY_CALLERS_BY_VALUE", "MANY_CALLERS_BY_VALUE_CASES", "MANY_CALLERS_CASES"]
__all__ += ["MANY_CALLERS_LEVELS"]
__all__ += ["NODE_ACTOR_IDLE_PATHS"]
__all__ += [
    "SERVE_HTTP_CLIENTS",
    "SERVE_HTTP_PATHS",
    "RATE_PATHS",
    "SWEEP_PATHS",
    "BENCH_OPTIONS",
    "BenchConfig",
    "CaseSpec",
    "Option",
    "OptionGroups",
    "add_arguments",
    "add_groups",
    "add_options",
    "config_from_args",
]


@dataclasses.dataclass(frozen=True)
class CaseSpec:
    """What to send to one model (``model``, default ``name``); the rest is read from its
    configuration on the server.

    Attributes:
        batch: Samples per request (``None``: the model's ``max_batch_size``, or 1).
        shapes: Per-sample shapes of inputs with ``-1`` dims, by name.
        max_element_bytes: Bytes of each element of BYTES tensors, by name: the length of the
            random strings sent, and at least the room of the outputs' elements.
        values: Inputs sent with one value in every element, by name (a streaming model's
            count of responses, say), instead of random ones.
        streaming: Whether the model is known to be a streaming (decoupled) one before its
            configuration is read (the progress counts its runs by it; the configuration
            decides what runs).
        many_callers_only: Whether only the many-callers case (:data:`MANY_CALLERS`) runs on
            it (``identity-1``: the other runs have ``identity``'s 8 rows a request).
    """

    name: str
    model: str = ""
    batch: int | None = None
    shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    max_element_bytes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    values: Mapping[str, int] = dataclasses.field(default_factory=dict)
    streaming: bool = False
    many_callers_only: bool = False

    def __post_init__(self) -> None:
        if not self.model:
            object.__setattr__(self, "model", self.name)


#: Responses per stream of the example streaming model (``captioner``'s ``COUNT``; the example
#: Serve app's default); its ``DELAY_US`` is 0 (the model's own pace, no sleep). Its shared
#: memory saves per stream (the image in), so its gain shrinks as streams grow longer.
STREAM_RESPONSES = 8
#: The example models' cases, the default ``--models``, in table order.
EXAMPLE_CASES: dict[str, CaseSpec] = {
    case.name: case
    for case in (
        CaseSpec("identity", shapes={"INPUT0": (16,)}),
        CaseSpec("identity-1", "identity", 1, {"INPUT0": (16,)}, many_callers_only=True),
        CaseSpec("classifier-1", "classifier", batch=1),
        CaseSpec("classifier"),
        CaseSpec("my_model"),
        CaseSpec("large_image"),
        CaseSpec("upper-short", "upper", max_element_bytes={"TEXT": 64}),
        CaseSpec("upper-long", "upper", max_element_bytes={"TEXT": 64 * 1024}),
        CaseSpec(
            "captioner",
            values={"COUNT": STREAM_RESPONSES, "DELAY_US": 0},
            streaming=True,
        ),
    )
}
CASE_NAMES: tuple[str, ...] = tuple(EXAMPLE_CASES)
#: ``--memory cuda``'s cases: one tensor of 1, 16 and 64 MiB through ``identity_gpu``.
GPU_CASES: dict[str, CaseSpec] = {
    f"gpu-{mib}MiB": CaseSpec(f"gpu-{mib}MiB", "identity_gpu", 1, {"INPUT0": (mib * 2**18,)})
    for mib in (1, 16, 64)
}
#: ``--memory cuda``'s paths, in table order: the same tensors as NumPy arrays, then as torch
#: CUDA tensors, over gRPC, system shared memory, tritonclient's CUDA utilities by hand, and
#: this library's GPU memory.
GPU_PATHS: tuple[str, ...] = (
    "grpc", "shm-client", "cuda-manual", "cuda-client",
    "grpc-torch", "shm-client-torch", "cuda-manual-torch", "cuda-client-torch",
)  # fmt: skip
MEMORY_KINDS = ("system", "cuda")
#: Triton's perf_analyzer, the ceiling: its inputs in system shared memory (written once), and
#: by value; it never reads its outputs.
CEILING_PATHS: tuple[str, ...] = ("pa-shm", "pa-grpc")
#: Paths without Ray in the default run, in table order.
DEFAULT_PATHS: tuple[str, ...] = (
    "grpc",
    "http",
    "shm-manual",
    "shm-client",
    "shm-client-prep",
    "shm-lease",
    "memcpy",
    *CEILING_PATHS,
)
#: The Ray paths (``--ray``), in table order.
RAY_PATHS: tuple[str, ...] = (
    "shm-model", "grpc-procs", "serve-grpc", "serve-shm", "serve-inproc",
    "serve-http-grpc", "serve-http-shm", "serve-http-noop",
    "data-grpc", "data-shm", "data-noop", "shm-model-nokill", "shm-model-churn",
)  # fmt: skip
#: Node batching (``--ray``; the many-callers case, :data:`MANY_CALLERS`): ``ShmModel`` with
#: node batching in each caller process, and the Serve replica on it; the model's twin with
#: Triton's dynamic batcher on (:data:`DYNAMIC_SUFFIX`) through plain gRPC and through
#: ``ShmModel`` without node batching.
BATCHING_PATHS: tuple[str, ...] = (
    "shm-model-nb", "serve-shm-nb", "grpc-procs-dynamic", "shm-model-dynamic"
)  # fmt: skip
#: The same case by value, on a Triton of the bench's own in a mount namespace of its own (a
#: ``/dev/shm`` of its own: it maps none of the bench's regions): ``ShmModel`` with and
#: without node batching, and plain gRPC, in each caller process.
BY_VALUE_PATHS: tuple[str, ...] = (
    "shm-model-nb-byvalue", "shm-model-byvalue", "grpc-procs-byvalue"
)  # fmt: skip
RAY_PATHS += (*BATCHING_PATHS, *BY_VALUE_PATHS)
#: The name of a model's twin with Triton's dynamic batcher on: the model's, and this (the
#: example ``identity_dynamic`` and ``classifier_dynamic``: copies with ``dynamic_batching``).
DYNAMIC_SUFFIX = "_dynamic"
#: Paths run at every ``--concurrency`` level. The Serve and Ray Data paths run with
#: ``--ray-callers`` callers, every other path with one.
SWEEP_PATHS: tuple[str, ...] = (
    "grpc",
    "shm-client",
    "shm-client-prep",
    "shm-lease",
    "shm-model",
    "grpc-procs",
    *CEILING_PATHS,
)
#: The paths of ``--request-rate`` (open-loop arrivals), in table order: gRPC, the core client
#: at each ``--concurrency`` level as its pool size, and ``ShmModel`` with as many node slots.
RATE_PATHS: tuple[str, ...] = ("grpc", "shm-client", "shm-model")
#: A streaming (decoupled) model's paths without Ray, in table order: the core client's
#: ``stream`` (threads) and ``stream_async`` (tasks on one event loop), tritonclient's own
#: streaming client (``start_stream`` and ``async_stream_infer``, by value; a client, so a
#: gRPC stream, per caller), and perf_analyzer's ``--streaming`` (its inputs in shared memory
#: written once, and by value).
STREAM_CEILING_PATHS: tuple[str, ...] = ("pa-stream-shm", "pa-stream")
STREAM_PATHS: tuple[str, ...] = ("stream-client", "stream-async", "stream-grpc")
STREAM_PATHS += STREAM_CEILING_PATHS
#: Its Ray paths (``--ray``): ``ShmModel.stream`` and tritonclient's streaming client in the
#: same caller processes, and the same Serve deployment streaming to a handle through
#: ``ShmModel.stream_async`` and through ``tritonclient.grpc.aio``; with ``--ray-callers``.
RAY_STREAM_PATHS: tuple[str, ...] = (
    "stream-model", "stream-grpc-procs", "serve-stream", "serve-stream-grpc"
)  # fmt: skip
#: Each streaming path of the library against tritonclient's streaming client in the same
#: set-up (the ratio of their responses per second is the verdict's).
STREAM_TWINS: dict[str, str] = {
    "stream-client": "stream-grpc",
    "stream-async": "stream-grpc",
    "stream-model": "stream-grpc-procs",
    "serve-stream": "serve-stream-grpc",
}
#: Streams at once of the streaming paths without Ray (default ``--streams``).
STREAM_LEVELS: tuple[int, ...] = (1, 4, 16)
#: Inputs of its own per caller (images, for the example): each stream's responses are
#: checked against its own request's, so that one crossing to another stream shows.
STREAM_VARIANTS = 2
#: The transports of the library's pools (``PoolStats.transport``): through shared memory
#: Triton maps, or by value, in the requests (a Triton that cannot map the bench's /dev/shm).
SHM, BY_VALUE = "shm", "inline"
#: The paths whose requests go through the library, by the transport it chose for them.
LIBRARY_PATHS: tuple[str, ...] = (
    "shm-client", "shm-client-prep", "shm-lease", "shm-model", "serve-shm", "serve-inproc",
    "serve-http-shm", "data-shm", "shm-model-nokill", "shm-model-churn",
    "stream-client", "stream-async", "stream-model", "serve-stream",
    "shm-model-nb", "serve-shm-nb", "shm-model-dynamic", "shm-model-nb-byvalue",
    "shm-model-byvalue",
)  # fmt: skip
#: By value, each library path against its plain gRPC twin in the same set-up: the library
#: must cost nothing where it cannot help, its MB/s this share of the twin's at least.
BY_VALUE_TWINS: dict[str, str] = {
    "shm-client": "grpc",
    "shm-model": "grpc-procs",
    "serve-shm": "serve-grpc",
    "serve-inproc": "serve-grpc",
    "serve-http-shm": "serve-http-grpc",
    "data-shm": "data-grpc",
    "shm-model-nb": "grpc-procs",
    "serve-shm-nb": "serve-grpc",
    "shm-model-dynamic": "grpc-procs-dynamic",
    **STREAM_TWINS,
}
#: The library paths whose plain gRPC twin in the same set-up their names do not say.
GRPC_TWINS: dict[str, str] = {
    "shm-model-nb": "grpc-procs",
    "serve-shm-nb": "serve-grpc",
    "shm-model-dynamic": "grpc-procs-dynamic",
    "shm-model-nb-byvalue": "grpc-procs-byvalue",
    "shm-model-byvalue": "grpc-procs-byvalue",
}
BY_VALUE_SHARE = 0.95
#: How ``--request-rate`` arrivals are spaced.
ARRIVALS: tuple[str, ...] = ("constant", "poisson")
#: The example app behind Serve's HTTP proxy (``--ray``): its paths, and the HTTP clients at
#: once of their runs (one, and more than the node's slots).
SERVE_HTTP_PATHS: tuple[str, ...] = ("serve-http-grpc", "serve-http-shm", "serve-http-noop")
SERVE_HTTP_CLIENTS: tuple[int, ...] = (1, 16)
#: The cases the example app runs on (1 and 8 images per request).
APP_CASES = ("classifier-1", "classifier")
#: The case the Ray Data job runs on, and the one the churn runs run on (the example
#: classifier: the job and the churn are made for it).
DATA_CASE = "classifier"
CHURN_CASE = "classifier"
#: Replicas of each example app behind Serve's HTTP proxy.
REPLICAS = 2
#: The Ray Data job's size in batches (``--quick``: its ``data_job_batches``).
DATA_JOB_BATCHES = 64
#: The most rounds the Ray Data paths take part in (each slice of theirs is a job).
DATA_JOB_ROUNDS = 2
#: How often (in run time) the churn kills a caller.
CHURN_KILL_EVERY_S = 2.0
#: How often an elastic run reads its pool's size from the node actor.
POOL_SAMPLE_S = 0.2
#: A run's slots when its pool follows its load (registered without ``pool_size``; for
#: ``shm-model``, on a node actor with its default ``slots``). ``None`` is a path without slots.
ELASTIC = 0
#: The node under load (``--ray``): ``(path, callers, node slots)`` of its runs, interleaved:
#: ``ShmModel`` as it comes (its pool following its load) beside plain gRPC.
NODE_LOAD: tuple[tuple[str, int, int | None], ...] = (
    ("shm-model", 16, ELASTIC), ("grpc-procs", 16, None)
)  # fmt: skip
#: The same load on fixed pools, each run in a group of its own (a node actor holds one
#: sizing of a model): fewer slots than callers, and as many.
NODE_LOAD_FIXED: tuple[tuple[str, int, int], ...] = (("shm-model", 16, 4), ("shm-model", 16, 16))
#: Seconds of load each run of the node under load gets, untimed, before the rounds: the
#: elastic pool grows in them (after ``upscale_delay_s``, 0.2 s by default), as it would in a
#: service's first second, and every run gets as much, so that the slices measure them all
#: settled (the elastic pool's size over time says how fast it got there).
NODE_LOAD_WARMUP_S = 1.0
#: The many-callers case (``--ray``, node batching): callers of 1 row each, closed loop, at
#: these numbers of callers (``--many-callers``), on these cases (``--many-callers-models``).
MANY_CALLERS_LEVELS: tuple[int, ...] = (1, 4, 16, 64)
MANY_CALLERS_CASES: tuple[str, ...] = ("identity-1", "classifier-1")
#: Its groups, each ``(path, callers, slots)`` run interleaved, by number of callers: first
#: with node batching (a node actor whose model batches, beside the baselines that need no
#: node actor: plain gRPC in each caller, perf_analyzer at that concurrency, the model's twin
#: with Triton's dynamic batcher through plain gRPC, Serve through plain gRPC), then without
#: (a node actor holds one registration of a model). A run already made in the case's other
#: groups is not made again. 64 callers: Ray tasks only.
MANY_CALLERS: tuple[tuple[tuple[str, int, int | None], ...], ...] = (
    (("shm-model-nb", 1, 1), ("grpc-procs", 1, None)),
    (("shm-model", 1, 1),),
    (
        ("shm-model-nb", 4, 4), ("grpc-procs", 4, None), ("pa-shm", 4, None),
        ("pa-grpc", 4, None),
    ),
    (("shm-model", 4, 4),),
    (
        ("shm-model-nb", 16, 16), ("serve-shm-nb", 16, None), ("grpc-procs", 16, None),
        ("pa-shm", 16, None), ("pa-grpc", 16, None), ("grpc-procs-dynamic", 16, None),
        ("serve-grpc", 16, None),
    ),
    (("shm-model", 16, 16), ("serve-shm", 16, None), ("shm-model-dynamic", 16, 16)),
    (
        ("shm-model-nb", 64, 64), ("grpc-procs", 64, None), ("pa-shm", 64, None),
        ("pa-grpc", 64, None),
    ),
    (("shm-model", 64, 64),),
)  # fmt: skip
#: Its by-value groups, on a Triton of the bench's own with a ``/dev/shm`` of its own (the
#: embedded server only; ``unshare --mount``), on these cases.
MANY_CALLERS_BY_VALUE: tuple[tuple[tuple[str, int, int | None], ...], ...] = (
    (("shm-model-nb-byvalue", 16, 16), ("grpc-procs-byvalue", 16, None)),
    (("shm-model-byvalue", 16, 16),),
)
MANY_CALLERS_BY_VALUE_CASES: tuple[str, ...] = ("identity-1",)
#: The runs whose group gets an idle window (``--slice-s`` without load, after its set-up):
#: the node actor's idle CPU, and its CPU per extra request as the slope from there to the
#: run's load (the goals on the node actor are theirs).
NODE_ACTOR_IDLE_PATHS: tuple[str, ...] = ("serve-shm", "data-shm")
#: The churn runs (``--ray``): ``(path, callers, node slots)``, interleaved like the rest.
CHURN: tuple[tuple[str, int, int], ...] = (("shm-model-nokill", 8, 4), ("shm-model-churn", 8, 4))
DEFAULT_RAY_CALLERS = 4
DEFAULT_PLOT_PATH = "bench-results/bench.png"
DEFAULT_REPORT_PATH = "bench-results/report.html"
#: Exit status when ``--check-goals`` is given and a goal is missed.
EXIT_GOALS_MISSED = 3

_QUICK = {
    "rounds": 2,
    "slice_s": 0.1,
    "warmup_requests": 1,
    "churn_s": 2.5,
    "model_update_s": 3.0,
    # A job's start (its predictor actors' processes) is most of a small one: fewer batches
    # still give every actor a few.
    "data_job_batches": 16,
}
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to run (see ``add_arguments`` for what the fields mean).

    Attributes:
        models: Case names: example cases (:data:`EXAMPLE_CASES`) or models on the server.
        streams: Streams at once of the streaming paths without Ray (:data:`STREAM_PATHS`),
            on a streaming model; ``concurrency`` is the other models' levels.
        shapes: ``[MODEL:]TENSOR`` -> per-sample shape, over the cases' own.
        max_element_bytes: ``[MODEL:]TENSOR`` -> bytes of a BYTES element, over the cases' own.
        values: ``[MODEL:]TENSOR`` -> the value of every element of an input, over the cases'
            own (a streaming model's count of responses, say).
        url: gRPC endpoint of a running server; ``None`` starts the embedded one.
        node_load: Also run the node under load (:data:`NODE_LOAD`, :data:`NODE_LOAD_FIXED`)
            when ``shm-model`` runs.
        churn_s: Seconds of each churn run (:data:`CHURN`), over the rounds.
        data_job_batches: Batches of each Ray Data job, a slice of the Ray Data paths.
        model_update_s: Seconds of the model update under load (:mod:`._update`; on the
            embedded server only, which it starts a Triton of its own beside); ``0`` skips it.
        request_rates: ``--request-rate``: requests per second (``"200"``), or shares of
            the most plain gRPC did in the concurrency sweep (``"50%"``); empty: no open loop.
        arrivals: How open-loop arrivals are spaced: ``"constant"`` or ``"poisson"``.
        latency_bound_ms: The p99 latency a rate must stay under to count as sustained.
        max_threads: Requests in flight at most per open-loop path (perf_analyzer's
            ``--max-threads``): later arrivals wait for one, and their wait counts.
        rate_models: The cases the open loop runs on (empty: every one).
        many_callers: The numbers of callers of the many-callers case (:data:`MANY_CALLERS`:
            node batching; its paths with ``--ray``); empty: none.
        many_callers_models: The cases it runs on (those of ``models``).
        by_value_url: A Triton that cannot map the bench's ``/dev/shm``, serving the
            many-callers case's by-value runs (``None``: on the embedded server, one of the
            bench's own in a mount namespace of its own; with ``url``, none).
        memory: ``"cuda"``: the GPU paths (:data:`GPU_PATHS`) on the GPU cases, the embedded
            server serving ``identity_gpu`` on the GPU.
        restart_on_crash: Start the embedded Triton again when it crashes (and go on, the
            run in progress marked disturbed); ``False``: a crash ends the bench.
        reconnect_timeout_s: How long the paths' requests wait for an unreachable Triton,
            and how long a remote one may stay unreachable before the bench ends.
    """

    models: tuple[str, ...] = tuple(n for n in CASE_NAMES if not EXAMPLE_CASES[n].many_callers_only)
    paths: tuple[str, ...] = (*DEFAULT_PATHS, *STREAM_PATHS)
    concurrency: tuple[int, ...] = (1, 4)
    streams: tuple[int, ...] = STREAM_LEVELS
    shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    max_element_bytes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    values: Mapping[str, int] = dataclasses.field(default_factory=dict)
    batch: int | None = None
    rounds: int = 4
    slice_s: float = 0.4
    warmup_requests: int = 2
    url: str | None = None
    http_url: str | None = None
    startup_timeout_s: float = 180.0
    ray_callers: int = DEFAULT_RAY_CALLERS
    node_load: bool = True
    churn_s: float = 10.0
    data_job_batches: int = DATA_JOB_BATCHES
    model_update_s: float = 6.0
    request_rates: tuple[str, ...] = ()
    arrivals: str = "constant"
    latency_bound_ms: float | None = None
    max_threads: int = 16
    rate_models: tuple[str, ...] = ()
    many_callers: tuple[int, ...] = MANY_CALLERS_LEVELS
    many_callers_models: tuple[str, ...] = MANY_CALLERS_CASES
    by_value_url: str | None = None
    memory: str = "system"
    restart_on_crash: bool = True
    reconnect_timeout_s: float = 10.0

    def rate(self, spec: str, grpc_best: float | None) -> float:
        """The requests per second of a ``--request-rate`` value: ``spec`` itself, or its
        share of ``grpc_best`` (plain gRPC's most requests per second in the sweep).

        Raises:
            ValueError: For a share without a gRPC figure to take it of.
        """
        if not spec.endswith("%"):
            return float(spec)
        if not grpc_best:
            raise ValueError(f"--request-rate {spec} is a share of plain gRPC's, not measured")
        return float(spec[:-1]) / 100 * grpc_best

    def rates_on(self, name: str) -> tuple[str, ...]:
        """The ``--request-rate`` values the case ``name`` runs at."""
        return self.request_rates if not self.rate_models or name in self.rate_models else ()

    def many_callers_on(self, name: str) -> tuple[int, ...]:
        """The numbers of callers the many-callers case runs with on the case ``name``."""
        return self.many_callers if name in self.many_callers_models else ()

    def case(self, name: str) -> CaseSpec:
        """The case ``name``: an example case or the model of that name, with this run's
        ``batch``, ``shapes``, ``max_element_bytes`` and ``values`` over its own."""
        base = EXAMPLE_CASES.get(name) or GPU_CASES.get(name) or CaseSpec(name)

        def mine(given: Mapping[str, _T]) -> dict[str, _T]:
            # A MODEL: prefix (case or model name) wins over no prefix.
            keys = sorted(given, key=lambda key: ":" in key)
            prefixes = (f"{name}:", f"{base.model}:")
            return {
                key.rsplit(":", 1)[-1]: given[key]
                for key in keys
                if ":" not in key or key.startswith(prefixes)
            }

        return dataclasses.replace(
            base,
            batch=self.batch or base.batch,
            shapes={**base.shapes, **mine(self.shapes)},
            max_element_bytes={**base.max_element_bytes, **mine(self.max_element_bytes)},
            values={**base.values, **mine(self.values)},
        )


def _names(values: Sequence[str] | None) -> list[str]:
    """Accept both ``--models a b`` and ``--models a,b``."""
    return [v for value in values or () for v in value.split(",") if v]


def _assignments(
    values: Sequence[str] | None, flag: str, *, dims: bool, least: int = 1
) -> dict[str, Any]:
    """``[MODEL:]TENSOR=D1,D2,...`` (``dims``) or ``[MODEL:]TENSOR=N`` options, as a dict,
    each number at least ``least``."""
    out: dict[str, Any] = {}
    for value in values or ():
        key, _, text = value.partition("=")
        try:
            numbers = tuple(int(d) for d in text.split(","))
        except ValueError:
            numbers = ()
        if not key or not numbers or min(numbers) < least or (len(numbers) > 1 and not dims):
            form = "D1,D2,..." if dims else "N"
            sign = "positive" if least == 1 else f"at least {least}"
            raise ValueError(f"{flag} takes [MODEL:]TENSOR={form}, {sign}, got {value!r}")
        out[key] = numbers if dims else numbers[0]
    return out


def _levels(values: Sequence[int] | None) -> tuple[int, ...]:
    """``--many-callers`` values: positive, sorted, each once (none given: the defaults)."""
    if values and min(values) < 1:
        raise ValueError(f"--many-callers takes numbers of callers (>= 1), got {min(values)}")
    return tuple(sorted(set(values))) if values else MANY_CALLERS_LEVELS


def _rates(values: Sequence[str] | None) -> list[str]:
    """``--request-rate`` values, checked: positive numbers, each maybe followed by ``%``."""
    rates = []
    for value in _names(values):
        try:
            number = float(value.removesuffix("%"))
        except ValueError:
            number = 0.0
        if not number > 0 or number == float("inf"):
            raise ValueError(f"--request-rate takes R or N% (R, N > 0), got {value!r}")
        rates.append(f"{number:g}" + ("%" if value.endswith("%") else ""))
    return rates


#: One command-line option: its flag, and the keywords of ``argparse``'s ``add_argument``.
Option = tuple[str, dict[str, Any]]
#: Options by argument group: ``(title, options)``.
OptionGroups = tuple[tuple[str, tuple[Option, ...]], ...]

#: The options of a run's length, by the :class:`BenchConfig` field they set: ``(flag, type,
#: what it is)``. Unset, the field is :class:`BenchConfig`'s, or ``--quick``'s (``_QUICK``).
_LENGTHS: dict[str, tuple[str, type, str]] = {
    "rounds": ("--rounds", int, "interleaved rounds"),
    "slice_s": ("--slice-s", float, "seconds per run per round"),
    "warmup_requests": ("--warmup", int, "untimed requests per run"),
    "churn_s": ("--churn-s", float, "seconds of each churn run"),
    "model_update_s": ("--model-update-s", float, "seconds of the model update, 0: none"),
}

#: The ``bench`` options, by argument group (read by :func:`add_arguments`).
BENCH_OPTIONS: OptionGroups = (
    (
        "server (default: the embedded one, the example models)",
        (
            ("--url", dict(metavar="HOST:PORT", help="gRPC endpoint of a running Triton")),
            ("--http-url", dict(metavar="HOST:PORT", help="its HTTP endpoint")),
            (
                "--startup-timeout-s",
                dict(
                    type=float,
                    default=BenchConfig.startup_timeout_s,
                    metavar="S",
                    help="embedded: %(default)s",
                ),
            ),
            (
                "--no-restart",
                dict(
                    action="store_true",
                    help="embedded: end the bench when Triton crashes, instead of starting it "
                    "again and going on with the run marked disturbed",
                ),
            ),
            (
                "--reconnect-timeout-s",
                dict(
                    type=float,
                    default=BenchConfig.reconnect_timeout_s,
                    metavar="S",
                    help="how long requests wait for an unreachable Triton, and how long one "
                    "may stay unreachable before the bench ends with what ran "
                    "(default: %(default)s)",
                ),
            ),
        ),
    ),
    (
        "what to run",
        (
            (
                "--models",
                dict(
                    nargs="+",
                    metavar="MODEL",
                    help="models, inputs made from their configuration "
                    f"(default: {', '.join(CASE_NAMES)}; "
                    f"{', '.join(n for n in CASE_NAMES if EXAMPLE_CASES[n].many_callers_only)} "
                    "with --ray only)",
                ),
            ),
            (
                "--shape",
                dict(
                    action="append",
                    metavar="[MODEL:]TENSOR=D1,D2",
                    help="per-sample shape of an input with -1 dims (repeatable)",
                ),
            ),
            (
                "--max-element-bytes",
                dict(
                    action="append",
                    metavar="[MODEL:]TENSOR=N",
                    help="bytes of each element of a BYTES tensor: inputs are random strings of "
                    "that length (default 128), outputs get at least the longest answered "
                    "(repeatable)",
                ),
            ),
            (
                "--input-value",
                dict(
                    action="append",
                    metavar="[MODEL:]TENSOR=N",
                    help="every element of an input N, not random (repeatable); e.g. "
                    f"captioner:COUNT=4, its responses per stream ({STREAM_RESPONSES})",
                ),
            ),
            ("--batch", dict(type=int, metavar="N", help="samples per request (max_batch_size)")),
            (
                "--concurrency",
                dict(
                    type=int,
                    nargs="+",
                    metavar="N",
                    help=f"levels: callers at once and slots, for {', '.join(SWEEP_PATHS)} "
                    "(default: 1 4)",
                ),
            ),
            (
                "--streams",
                dict(
                    type=int,
                    nargs="+",
                    metavar="N",
                    help="streams at once, on a streaming model, for "
                    f"{', '.join(STREAM_PATHS)} (default: "
                    f"{' '.join(map(str, STREAM_LEVELS))})",
                ),
            ),
            (
                "--paths",
                dict(nargs="+", help=f"default: {', '.join((*DEFAULT_PATHS, *STREAM_PATHS))}"),
            ),
            (
                "--memory",
                dict(
                    choices=MEMORY_KINDS,
                    default=BenchConfig.memory,
                    help="cuda: tensors on the GPU (NumPy and torch) over gRPC, system shared "
                    "memory, tritonclient's CUDA shared memory by hand and memory='cuda' (needs "
                    f"a GPU, torch and the [cuda] extra; default models {', '.join(GPU_CASES)})",
                ),
            ),
            (
                "--ray",
                dict(
                    action="store_true",
                    help=f"also, on a local Ray: {', '.join((*RAY_PATHS, *RAY_STREAM_PATHS))}",
                ),
            ),
            (
                "--ray-callers",
                dict(
                    type=int,
                    metavar="N",
                    default=BenchConfig.ray_callers,
                    help="callers of the Serve and Ray Data paths (%(default)s)",
                ),
            ),
            (
                "--no-node-load",
                dict(
                    action="store_true",
                    help="skip the node under load (16 callers: an elastic pool, 4 and 16 slots)",
                ),
            ),
            (
                "--many-callers",
                dict(
                    type=int,
                    nargs="+",
                    metavar="N",
                    help="the many-callers case (node batching, --ray): callers of 1 row each "
                    "at these numbers (default: "
                    f"{' '.join(map(str, MANY_CALLERS_LEVELS))})",
                ),
            ),
            (
                "--many-callers-models",
                dict(
                    nargs="+",
                    metavar="MODEL",
                    help=f"its cases (default: {', '.join(MANY_CALLERS_CASES)})",
                ),
            ),
            ("--no-many-callers", dict(action="store_true", help="skip the many-callers case")),
            (
                "--by-value-url",
                dict(
                    metavar="HOST:PORT",
                    help="its by-value runs on this Triton, which cannot map this machine's "
                    "/dev/shm (default: with the embedded server, one of the bench's own with "
                    "a /dev/shm of its own, where unshare --mount runs)",
                ),
            ),
            *(
                (
                    flag,
                    dict(
                        type=kind,
                        dest=key,
                        metavar="N",
                        help=f"{text} ({getattr(BenchConfig, key)}; --quick: {_QUICK[key]})",
                    ),
                )
                for key, (flag, kind, text) in _LENGTHS.items()
            ),
            ("--quick", dict(action="store_true", help="a short run (tests, CI): noisy")),
        ),
    ),
    (
        "open loop (perf_analyzer's request-rate mode): arrivals at a rate, for "
        f"{', '.join(RATE_PATHS)}; latency from each request's intended send time",
        (
            (
                "--request-rate",
                dict(
                    nargs="+",
                    metavar="R",
                    help="requests/s, or N%% of the most plain gRPC did in the concurrency sweep",
                ),
            ),
            (
                "--arrivals",
                dict(choices=ARRIVALS, default=BenchConfig.arrivals, help="spacing (%(default)s)"),
            ),
            (
                "--latency-bound-ms",
                dict(
                    type=float,
                    metavar="MS",
                    help="a rate is sustained if its p99 stays under this (and nothing queues up)",
                ),
            ),
            (
                "--max-threads",
                dict(
                    type=int,
                    default=BenchConfig.max_threads,
                    metavar="N",
                    help="in flight at most (%(default)s)",
                ),
            ),
            ("--rate-models", dict(nargs="+", metavar="MODEL", help="default: every model")),
        ),
    ),
    (
        "output",
        (
            ("--json", dict(metavar="PATH", help="write machine-readable results here")),
            (
                "--plot",
                dict(metavar="PATH", default=DEFAULT_PLOT_PATH, help="PNG plot (%(default)s)"),
            ),
            ("--no-plot", dict(action="store_true")),
            (
                "--report",
                dict(
                    metavar="PATH",
                    default=DEFAULT_REPORT_PATH,
                    help="self-contained HTML report (%(default)s)",
                ),
            ),
            ("--no-report", dict(action="store_true")),
            (
                "--full",
                dict(action="store_true", help="print every run's numbers, not just the summary"),
            ),
            ("--no-progress", dict(action="store_true")),
            (
                "--check-goals",
                dict(action="store_true", help=f"exit {EXIT_GOALS_MISSED} if a goal is missed"),
            ),
        ),
    ),
)


def add_options(parser: argparse._ActionsContainer, options: Iterable[Option]) -> None:
    """Add ``options`` to ``parser``, or to one of its argument groups."""
    for flag, keywords in options:
        parser.add_argument(flag, **keywords)


def add_groups(parser: argparse.ArgumentParser, groups: OptionGroups) -> None:
    """Add each group of ``groups`` to ``parser``, as an argument group with its options."""
    for title, options in groups:
        add_options(parser.add_argument_group(title), options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options (:data:`BENCH_OPTIONS`) to ``parser``."""
    add_groups(parser, BENCH_OPTIONS)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build the run configuration from parsed ``bench`` arguments.

    Raises:
        ValueError: With a user-facing message, for invalid values or combinations.
    """
    gpu = args.memory == "cuda"
    known = (*DEFAULT_PATHS, *STREAM_PATHS, *RAY_PATHS, *RAY_STREAM_PATHS)
    known += tuple(p for p in GPU_PATHS if p not in DEFAULT_PATHS)
    ray = (*RAY_PATHS, *RAY_STREAM_PATHS) if args.ray else ()
    paths = _names(args.paths) or ([*GPU_PATHS] if gpu else [*DEFAULT_PATHS, *STREAM_PATHS, *ray])
    if gpu and args.ray:
        raise ValueError("--memory cuda runs the core client's paths: leave out --ray")
    unknown = [p for p in paths if p not in known]
    if unknown:
        raise ValueError(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    base: dict[str, Any] = dict(_QUICK) if args.quick else {}
    if gpu:
        base["model_update_s"] = 0.0  # the model update runs on the example models
    for key in _LENGTHS:
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    order = (*GPU_PATHS, *known) if gpu else known
    # The cases of the many-callers case alone run only with its paths (--ray).
    cases = [n for n in CASE_NAMES if args.ray or not EXAMPLE_CASES[n].many_callers_only]
    config = BenchConfig(
        models=tuple(dict.fromkeys(_names(args.models) or (GPU_CASES if gpu else cases))),
        paths=tuple(dict.fromkeys(p for p in order if p in paths)),
        concurrency=tuple(sorted(set(args.concurrency or BenchConfig.concurrency))),
        streams=tuple(sorted(set(args.streams or BenchConfig.streams))),
        shapes=_assignments(args.shape, "--shape", dims=True),
        max_element_bytes=_assignments(args.max_element_bytes, "--max-element-bytes", dims=False),
        values=_assignments(args.input_value, "--input-value", dims=False, least=0),
        batch=args.batch,
        url=args.url,
        http_url=args.http_url,
        startup_timeout_s=args.startup_timeout_s,
        restart_on_crash=not args.no_restart,
        reconnect_timeout_s=args.reconnect_timeout_s,
        ray_callers=args.ray_callers,
        node_load=not args.no_node_load,
        request_rates=tuple(dict.fromkeys(_rates(args.request_rate))),
        arrivals=args.arrivals,
        latency_bound_ms=args.latency_bound_ms,
        max_threads=args.max_threads,
        rate_models=tuple(_names(args.rate_models)),
        many_callers=() if args.no_many_callers else _levels(args.many_callers),
        many_callers_models=tuple(_names(args.many_callers_models) or MANY_CALLERS_CASES),
        by_value_url=args.by_value_url,
        memory=args.memory,
        **base,
    )
    if args.http_url and not args.url:
        raise ValueError("--http-url needs --url")
    if config.slice_s <= 0 or config.churn_s <= 0:
        raise ValueError("--slice-s and --churn-s must be positive")
    if config.model_update_s < 0:
        raise ValueError("--model-update-s must be >= 0")
    if not config.reconnect_timeout_s > 0:
        raise ValueError("--reconnect-timeout-s must be positive")
    if config.latency_bound_ms is not None and config.latency_bound_ms <= 0:
        raise ValueError("--latency-bound-ms must be positive")
    unknown_models = [m for m in config.rate_models if m not in config.models]
    if unknown_models:
        raise ValueError(f"--rate-models {', '.join(unknown_models)}: not in --models")
    if config.request_rates and "grpc" not in config.paths:
        shares = [r for r in config.request_rates if r.endswith("%")]
        if shares:
            raise ValueError(f"--request-rate {shares[0]} is a share of gRPC's: run the grpc path")
    counts = {
        "rounds": config.rounds,
        "warmup": config.warmup_requests,
        "ray-callers": config.ray_callers,
        "concurrency": min(config.concurrency),
        "streams": min(config.streams),
        "batch": config.batch or 1,
        "max-threads": config.max_threads,
    }
    for flag, value in counts.items():
        if value < 1:
            raise ValueError(f"--{flag} must be at least 1")
    return config
