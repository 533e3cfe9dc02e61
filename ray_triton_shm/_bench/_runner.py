"""Runs the paths at every level of the sweep, interleaved, and collects the numbers.

For each model the runs come in groups: one per ``--concurrency`` level (the sweep paths at
that level, and the one-caller paths at level 1), the Serve and Ray Data paths (with
``--ray-callers`` callers), the node under load, and each churn run. The runs of a group are
set up together, then measured in interleaved rounds (one time slice per run per round, the
order rotating each round), so that load from other processes hits them alike. Each run's
first request is checked against a plain gRPC reference before its numbers count, but for
perf_analyzer's (:mod:`.paths._perf_analyzer`), which never reads its outputs: theirs say so.

A streaming (decoupled) model runs its own paths instead (:func:`stream_groups`): a group per
``--streams`` level, and one of the Ray paths with ``--ray-callers`` callers. Its slices are
streams, and every response of every stream is checked against its own request's, made with
tritonclient's streaming client (:func:`_stream_requests`).

The many-callers case (node batching) adds its groups on its cases (:func:`many_callers_groups`);
its by-value ones run on a Triton of the bench's own elsewhere (:mod:`._elsewhere`). Around
every slice, Triton's counts of the path's model say how many rows its requests and the
model's executions carried.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ray_triton_shm._bench._cases import STREAM_RULES, ModelCase
from ray_triton_shm._bench._config import (
    BATCHING_PATHS,
    BY_VALUE_PATHS,
    CHURN,
    DEFAULT_PATHS,
    GPU_PATHS,
    MANY_CALLERS,
    MANY_CALLERS_BY_VALUE,
    MANY_CALLERS_BY_VALUE_CASES,
    NODE_ACTOR_IDLE_PATHS,
    NODE_LOAD,
    NODE_LOAD_FIXED,
    NODE_LOAD_WARMUP_S,
    RAY_PATHS,
    RAY_STREAM_PATHS,
    SERVE_HTTP_CLIENTS,
    SERVE_HTTP_PATHS,
    STREAM_PATHS,
    STREAM_VARIANTS,
    SWEEP_PATHS,
    BenchConfig,
    CaseSpec,
)
from ray_triton_shm._bench._elsewhere import ElsewhereTriton
from ray_triton_shm._bench._load import arrival_times
from ray_triton_shm._bench._progress import Progress
from ray_triton_shm._bench._results import (
    BenchResults,
    ModelResult,
    RunResult,
    describe_rate_path,
    describe_run,
)
from ray_triton_shm._bench._update import run_model_update
from ray_triton_shm._bench._watch import TritonGone, TritonWatch
from ray_triton_shm._bench.paths import (
    _batching,
    _gpu,
    _http,
    _perf_analyzer,
    _plain,
    _ray,
    _shm,
    _streams,
)
from ray_triton_shm._bench.paths._base import (
    BenchPath,
    BenchTarget,
    SkipPath,
    StreamRequest,
    check_outputs,
)
from ray_triton_shm._bench.paths._clients import GrpcStreamer, TritonCounts, infer, transport_of
from ray_triton_shm._bench.paths._ray_session import RayBenchSession, RayPath
from ray_triton_shm._slots import _cuda
from ray_triton_shm._wire._plain_client import tritonclient_for
from ray_triton_shm.local._server import LocalTritonServer

__all__ = ["PATHS", "RunContext", "Workload", "rate_groups", "run_bench", "run_groups"]
__all__ += ["many_callers_groups", "stream_groups"]

#: Every path, by name: those without Ray, then the Ray paths.
_CLASSES = {
    cls.name: cls
    for cls in (
        *_plain.PATHS,
        *_shm.PATHS,
        *_perf_analyzer.PATHS,
        *_ray.PATHS,
        *_batching.PATHS,
        *_http.PATHS,
        *_gpu.PATHS,
        *_streams.PATHS,
        *_perf_analyzer.STREAM_PATHS,
        *_ray.STREAM_PATHS,
    )
}
_ALL = (*DEFAULT_PATHS, *STREAM_PATHS, *RAY_PATHS, *RAY_STREAM_PATHS, *GPU_PATHS)
PATHS: dict[str, type[BenchPath]] = {name: _CLASSES[name] for name in dict.fromkeys(_ALL)}
#: A streaming model's paths (none of the others runs on one, nor these on another).
_STREAMING = (*STREAM_PATHS, *RAY_STREAM_PATHS)
#: Its paths whose slots are as many as their callers.
_STREAM_POOLED = ("stream-client", "stream-async", "stream-model")
#: Its Ray paths, by group: in caller processes, and through Serve.
_STREAM_TASKS = tuple(p for p in RAY_STREAM_PATHS if not p.startswith("serve"))
_STREAM_SERVE = tuple(p for p in RAY_STREAM_PATHS if p.startswith("serve"))
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
#: The paths whose slots are as many as their callers.
_POOLED = ("shm-client", "shm-client-prep", "shm-lease", "shm-model")


def run_groups(config: BenchConfig, name: str = "") -> list[list[RunKey]]:
    """The runs of the case ``name``, in groups whose runs are interleaved (see the module
    doc): every case's, then the many-callers case's where it runs on ``name``
    (:func:`many_callers_groups`; ``""``: every case's alone)."""
    regular = _regular_groups(config, name)
    return regular + many_callers_groups(config, name, regular)


def many_callers_groups(
    config: BenchConfig, name: str, before: Sequence[list[RunKey]] = ()
) -> list[list[RunKey]]:
    """The many-callers case's groups on the case ``name``
    (:data:`~._config.MANY_CALLERS`, and :data:`~._config.MANY_CALLERS_BY_VALUE` on its
    cases), at its numbers of callers, without the runs of the groups ``before``."""
    levels = config.many_callers_on(name)
    table = MANY_CALLERS + (MANY_CALLERS_BY_VALUE if name in MANY_CALLERS_BY_VALUE_CASES else ())
    done = {key for group in before for key in group}
    groups = []
    for group in table:
        keys = [k for k in group if k[0] in config.paths and k[1] in levels and k not in done]
        done.update(keys)
        groups.append(keys)
    return [group for group in groups if group]


def _regular_groups(config: BenchConfig, name: str) -> list[list[RunKey]]:
    """Every case's groups (see :func:`run_groups`), but on a case of the many-callers case
    alone (``identity-1``)."""
    if name and config.case(name).many_callers_only:
        return []
    levels = config.concurrency
    grouped = (*SWEEP_PATHS, *_RAY_CHOICES, *SERVE_HTTP_PATHS, *_CHURN_PATHS, *_STREAMING)
    grouped += (*BATCHING_PATHS, *BY_VALUE_PATHS)  # the many-callers case's alone
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


def stream_groups(config: BenchConfig) -> list[list[RunKey]]:
    """The runs of a streaming model, in groups whose runs are interleaved: a group per
    ``--streams`` level (the core client's streams on a slot per stream), then the Ray tasks
    and the Serve paths, each a group (a node actor holds one sizing of a model), with
    ``--ray-callers`` callers."""
    groups = [
        [(p, n, n if p in _STREAM_POOLED else None) for p in STREAM_PATHS if p in config.paths]
        for n in config.streams
    ]
    callers = config.ray_callers
    for kind in (_STREAM_TASKS, _STREAM_SERVE):
        ray = [p for p in kind if p in config.paths]
        groups.append([(p, callers, callers if p in _STREAM_POOLED else None) for p in ray])
    return [group for group in groups if group]


def _describe(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc`` in a line: its first, or of an error a Ray task raised,
    its last, which says its cause (the first names the task)."""
    text = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    said = text[0] if text else ""
    if "ray::" in said and len(text) > 1:
        said = text[-1]
    return f"{type(exc).__name__}: {said}"[:300]


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What every run of the bench shares: its options, its private Ray (``None``: no Ray
    path runs), where its progress goes, its watch on Triton, Triton's counts of the models
    (read around each slice), and the Triton elsewhere (``None``: none asked for)."""

    config: BenchConfig
    session: RayBenchSession | None
    progress: Progress
    watch: TritonWatch
    counts: TritonCounts = dataclasses.field(default_factory=TritonCounts)
    elsewhere: ElsewhereTriton | None = None


@dataclasses.dataclass(frozen=True)
class Workload:
    """What every run on one model sends: the case, one request's inputs and the reference
    answer (:func:`_prepare`), to the target; of a streaming model, its requests with the
    responses each must get (:func:`_stream_requests`)."""

    target: BenchTarget
    case: ModelCase
    inputs: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    streams: tuple[StreamRequest, ...] = ()

    def path(self, key: RunKey, session: RayBenchSession | None) -> BenchPath:
        """The path of run ``key`` on this workload (not set up)."""
        name, concurrency, slots = key
        return PATHS[name](
            target=self.target,
            case=self.case,
            inputs=self.inputs,
            reference=self.reference,
            concurrency=concurrency,
            slots=slots,
            session=session,
            streams=self.streams,
        )


def _prepare(
    spec: CaseSpec, target: BenchTarget
) -> tuple[ModelCase, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The case made from the model's configuration, one request's inputs, and the plain gRPC
    answer every path must reproduce (of a streaming model, none: each of its requests has
    its own, see :func:`_stream_requests`)."""
    client = tritonclient_for(target.grpc_url)
    try:
        config = client.get_model_config(spec.model, as_json=True)
        case = ModelCase.from_config(spec, config.get("config", config))
        inputs = case.make_inputs(seed=zlib.crc32(spec.model.encode()))
        if case.streaming:
            return case, inputs, {}
        reference = {name: np.array(a) for name, a in infer(client, case, inputs).items()}
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return case.with_reference(reference), inputs, reference


def _stream_requests(
    case: ModelCase, inputs: dict[str, np.ndarray], target: BenchTarget, count: int
) -> tuple[ModelCase, tuple[StreamRequest, ...]]:
    """``count`` requests of a streaming case (the first of ``inputs``, the others of inputs
    of their own), each with tritonclient's streaming answer to it, which must be the model's
    own rule's where the bench knows it (:data:`~._cases.STREAM_RULES`); and the case with its
    outputs' shapes from the first response.

    Raises:
        AssertionError: Triton's answer is not the rule's.
    """
    streamer = GrpcStreamer(target.grpc_url)
    rule = STREAM_RULES.get(case.model)
    requests = []
    try:
        for index in range(count):
            seed = zlib.crc32(case.model.encode()) + index
            mine = inputs if index == 0 else case.make_inputs(seed=seed)
            answer = [{n: np.array(a) for n, a in r.items()} for r in streamer.stream(case, mine)]
            request = StreamRequest(mine, tuple(answer))
            if rule is not None:  # tritonclient's answer must be the model's: else no reference
                checked = StreamRequest(mine, tuple(rule(mine)))
                for position, response in enumerate(answer):
                    checked.check(position, response)
                checked.check_end(len(answer))
            requests.append(request)
    finally:
        with contextlib.suppress(Exception):
            streamer.close()
    first = requests[0].responses
    return (case.with_reference(first[0]) if first else case), tuple(requests)


def _transport(case: ModelCase, target: BenchTarget) -> tuple[str | None, str]:
    """How the library's pools of ``case``'s model reach Triton, and why (``None``, and why
    not: it could not tell; the paths then say what they find)."""
    try:
        return transport_of(target.grpc_url, case, reconnect_timeout_s=target.reconnect_timeout_s)
    except Exception as exc:
        return None, _describe(exc)


def _fresh_node_actor(
    stack: contextlib.ExitStack, session: RayBenchSession | None, keys: list[RunKey]
) -> None:
    """A fresh node actor for runs ``keys`` if any uses one, ended with ``stack``."""
    if session is not None and any(PATHS[key[0]].uses_node_actor for key in keys):
        session.end_node_actor()
        stack.callback(session.end_node_actor)


def _set_up(path: BenchPath, reference: Mapping[str, np.ndarray], config: BenchConfig) -> None:
    """Sets ``path`` up, checks its first answer against ``reference``, and warms it up (a
    path whose answers are not checked, :attr:`~.paths._base.BenchPath.unchecked`: set up only)."""
    path.setup()
    if path.unchecked is not None:
        return
    if path.streaming:
        path.run_once()  # a stream, each of its responses checked against its own request's
    else:
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
    work: Workload,
    ctx: RunContext,
    *,
    many_callers: bool = False,
) -> None:
    """Sets up the runs of ``group`` (of the ``many_callers`` case, or not), then measures
    them in interleaved rounds."""
    config, progress, watch = ctx.config, ctx.progress, ctx.watch
    with contextlib.ExitStack() as stack:
        _fresh_node_actor(stack, ctx.session, group)
        active: list[tuple[RunResult, BenchPath]] = []
        for key in group:
            r = RunResult(*key, work.case, many_callers=many_callers)
            model.runs.append(r)
            watch.run = f"{model.name}: {describe_run(*key)}"
            path = work.path(key, ctx.session)
            path.own_inputs = many_callers
            stack.callback(path.teardown)

            def set_up(r: RunResult = r, path: BenchPath = path) -> None:
                try:
                    _set_up(path, work.reference, config)
                    r.verified, r.unchecked = True, path.unchecked
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
        _idle_window(active, config.slice_s)
        for index in range(config.rounds):
            # Rotate the order so no run always comes right after the same neighbour.
            shift = index % len(active) if active else 0
            for r, path in active[shift:] + active[:shift]:
                if path.max_rounds is not None and index >= path.max_rounds:
                    progress.advance()
                    continue
                if r.error is None:
                    watch.run = f"{model.name}: {describe_run(r.path, r.concurrency, r.slots)}"
                    _guarded([r], watch, functools.partial(_slice, r, path, ctx))
                progress.advance()
        for r, path in active:
            with contextlib.suppress(Exception):
                r.extra.update(path.stats())
            with contextlib.suppress(Exception):
                checked = path.answers_checked()
                r.extra.update({} if checked is None else {"answers_checked": checked})


def _idle_window(active: list[tuple[RunResult, BenchPath]], seconds: float) -> None:
    """Where a run of :data:`~._config.NODE_ACTOR_IDLE_PATHS` is among ``active``, the node
    actor's CPU over ``seconds`` without load, given to every run of the group on it."""
    on_actor = [(r, path) for r, path in active if path.uses_node_actor]
    if not any(r.path in NODE_ACTOR_IDLE_PATHS for r, _ in on_actor):
        return
    path = on_actor[0][1]
    try:
        before, start = path.side_cpu_time(), time.perf_counter()
        time.sleep(seconds)  # the load itself: none
        after, wall_s = path.side_cpu_time(), time.perf_counter() - start
    except Exception:  # the node actor gone (Triton's crash, say): no idle figure
        return
    if before is not None and after is not None:
        for r, _ in on_actor:
            r.node_actor_idle = (after - before, wall_s)


def _slice(r: RunResult, path: BenchPath, ctx: RunContext) -> None:
    """One slice of ``r`` on ``path``, added to ``r``, with Triton's counts of its model
    around it (a streaming model's are not read)."""
    counted = None if path.streaming else path.counted
    before = ctx.counts.read(*counted) if counted else None
    _measure(r, path, ctx.config)
    after = ctx.counts.read(*counted) if counted and before else None
    if before is not None and after is not None:
        r.add_counts(before, after)


def _measure(r: RunResult, path: BenchPath, config: BenchConfig) -> None:
    """The slice itself (see :func:`_slice`)."""
    churn = r.path in _CHURN_PATHS
    slice_s = config.churn_s / config.rounds if churn else config.slice_s
    if isinstance(path, _perf_analyzer.PerfAnalyzerPath):  # a run timed by perf_analyzer itself
        r.add_summary(path.measure_slice(slice_s * path.slice_factor))
        return
    cpu, side, start = path.cpu_time(), path.side_cpu_time(), time.perf_counter()
    if path.streaming:
        streams = path.run_stream_slice(slice_s * path.slice_factor)
    else:
        latencies, wall_s = path.run_slice(slice_s * path.slice_factor)
    after, side_wall_s = path.side_cpu_time(), time.perf_counter() - start
    spent = None if side is None or after is None else after - side
    if path.streaming:
        r.add_streams(streams, path.cpu_time() - cpu, spent)
    else:
        r.add(wall_s, path.cpu_time() - cpu, spent, latencies, side_wall_s=side_wall_s)


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


def _run_rates(keys: list[RunKey], model: ModelResult, work: Workload, ctx: RunContext) -> None:
    """The open loop at every ``--request-rate`` on ``model``: each path set up once, then
    every (path, rate) run measured in interleaved rounds, as :func:`_run_group` does."""
    config, progress, watch = ctx.config, ctx.progress, ctx.watch
    specs = config.rates_on(model.name)
    grpc = [r.numbers()["requests_per_s"] for r in model.runs if r.path == "grpc" and r.counts]
    with contextlib.ExitStack() as stack:
        _fresh_node_actor(stack, ctx.session, keys)
        active: list[tuple[BenchPath, RunResult]] = []
        for key in keys:
            runs = [RunResult(*key, work.case, rate_spec=s) for s in specs]
            model.rate_runs += runs
            watch.run = f"{model.name}: open loop, {describe_rate_path(*key)}"
            path = work.path(key, ctx.session)
            stack.callback(path.teardown)

            def set_up(runs: list[RunResult] = runs, path: BenchPath = path) -> None:
                try:
                    rates = [config.rate(spec, max(grpc, default=None)) for spec in specs]
                    _set_up(path, work.reference, config)
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


def _run_elsewhere(
    group: list[RunKey], model: ModelResult, work: Workload, ctx: RunContext
) -> None:
    """The runs of ``group`` on the Triton elsewhere (:mod:`._elsewhere`), or each skipped
    saying why it cannot run here."""
    try:
        if ctx.elsewhere is None:
            raise SkipPath("no Triton elsewhere was asked for")
        target = ctx.elsewhere.target()
    except SkipPath as exc:
        for key in group:
            model.runs.append(RunResult(*key, work.case, skipped=str(exc), many_callers=True))
        ctx.progress.advance(len(group) * (1 + ctx.config.rounds))
        return
    transport, reason = _transport(work.case, target)
    target = dataclasses.replace(target, transport=transport, transport_reason=reason)
    work = dataclasses.replace(work, target=target)
    _run_group(group, model, work, ctx, many_callers=True)


def _sort_rate_runs(model: ModelResult, config: BenchConfig) -> None:
    """By rate, then in :func:`rate_groups` order."""
    keys = [key for group in rate_groups(config) for key in group]
    order = {key: index for index, key in enumerate(keys)}
    model.rate_runs.sort(key=lambda r: (r.rate or 0.0, order[r.path, r.concurrency, r.slots]))


def _units(config: BenchConfig, name: str, streaming: bool) -> int:
    """The progress units of the case ``name`` (of a ``streaming`` model, or not): a set-up
    and a slice per round, per run."""
    if streaming:
        return sum(map(len, stream_groups(config))) * (1 + config.rounds)
    rates = sum(map(len, rate_groups(config))) * len(config.rates_on(name))
    runs = sum(map(len, run_groups(config, name))) + rates
    return runs * (1 + config.rounds)


def _workload(config: BenchConfig, spec: CaseSpec, target: BenchTarget) -> Workload:
    """The workload of the case ``spec`` (:func:`_prepare`; of a streaming model, a few
    requests per caller, :func:`_stream_requests`)."""
    case, inputs, reference = _prepare(spec, target)
    streams: tuple[StreamRequest, ...] = ()
    if case.streaming:
        count = STREAM_VARIANTS * max(*config.streams, config.ray_callers)
        case, streams = _stream_requests(case, inputs, target, count)
    return Workload(target, case, inputs, reference, streams)


def _run_model(model: ModelResult, target: BenchTarget, ctx: RunContext) -> None:
    """Every run on ``model``: its case made from its configuration, then each group's runs
    (a streaming model's own), then the open loop's."""
    config, progress, watch = ctx.config, ctx.progress, ctx.watch
    spec = config.case(model.name)
    units = _units(config, spec.name, spec.streaming)
    progress.stage(f"{spec.name}: reading the model configuration")
    watch.run = f"{spec.name}: reading the model configuration"
    for attempt in range(2):  # again if a crash of Triton was why it failed
        start = time.time()
        try:
            work = _workload(config, spec, target)
            break
        except Exception as exc:
            watch.wait_back()
            if attempt or watch.disturbance(start, time.time(), failed=True) is None:
                model.error = _describe(exc)
                progress.advance(units)
                return
    case = model.case = work.case
    if config.memory != "cuda":  # the GPU paths choose their memory themselves
        model.transport, model.transport_reason = _transport(case, target)
        target = dataclasses.replace(
            target, transport=model.transport, transport_reason=model.transport_reason
        )
        work = dataclasses.replace(work, target=target)
    groups = [(group, False) for group in stream_groups(config)] if case.streaming else []
    if not case.streaming:
        regular = _regular_groups(config, spec.name)
        groups += [(group, False) for group in regular]
        groups += [(group, True) for group in many_callers_groups(config, spec.name, regular)]
    for group, many in groups:
        progress.stage(f"{spec.name}: {', '.join(describe_run(*key) for key in group)}")
        if any(PATHS[key[0]].elsewhere for key in group):
            _run_elsewhere(group, model, work, ctx)
        else:
            _run_group(group, model, work, ctx, many_callers=many)
    if ctx.elsewhere is not None:
        ctx.elsewhere.close()  # the next model that needs it starts it again
    if config.rates_on(spec.name) and not case.streaming:
        rates = " ".join(config.rates_on(spec.name))
        for keys in rate_groups(config):
            runs = ", ".join(describe_rate_path(*key, detailed=True) for key in keys)
            progress.stage(f"{spec.name}: open loop at {rates} requests/s: {runs}")
            _run_rates(keys, model, work, ctx)
        _sort_rate_runs(model, config)
    progress.advance(max(0, units - _units(config, spec.name, case.streaming)))


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
    progress.start(sum(_units(config, n, config.case(n).streaming) for n in config.models))
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
                session = stack.enter_context(
                    RayBenchSession(target, data_job_batches=config.data_job_batches)
                )
            elsewhere = stack.enter_context(_elsewhere(config))
            ctx = RunContext(config, session, progress, watch, elsewhere=elsewhere)
            stack.callback(ctx.counts.close)
            for name in config.models:
                models.append(ModelResult(name))
                # A restart gives the embedded server a new process (its CPU is measured).
                target = dataclasses.replace(target, server_pid=local.pid if local else None)
                _run_model(models[-1], target, ctx)
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


def _elsewhere(config: BenchConfig) -> ElsewhereTriton:
    """The Triton elsewhere of the many-callers case's by-value runs, serving their cases'
    models (started when they first need it)."""
    names = [n for n in config.models if n in MANY_CALLERS_BY_VALUE_CASES]
    return ElsewhereTriton(
        (config.case(name).model for name in names),
        url=config.url,
        startup_timeout_s=config.startup_timeout_s,
        reconnect_timeout_s=config.reconnect_timeout_s,
        given=config.by_value_url,
    )


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
        _gpu.GPU_MODEL_REPOSITORY,
        extra_args=[f"--cuda-memory-pool-byte-size=0:{_CUDA_POOL_BYTES}"],
        **options,
    )
