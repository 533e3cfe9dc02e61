"""Runs the paths side by side, in interleaved rounds, and collects the numbers."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from rich.progress import Progress

from ray_triton_shm._bench import _paths, _ray_paths
from ray_triton_shm._bench._cases import CASES, ModelCase
from ray_triton_shm._bench._config import RAY_PATHS, BenchConfig
from ray_triton_shm._bench._node_load import LoadRun, load_ratios, run_node_load
from ray_triton_shm._bench._paths import (
    BenchPath,
    BenchTarget,
    OutputMismatch,
    SkipPath,
    check_outputs,
    grpc_request,
)
from ray_triton_shm._bench._ray_paths import RayBenchSession, RayPath

__all__ = [
    "GOALS",
    "PATHS",
    "BenchResults",
    "Goal",
    "GoalResult",
    "ModelResult",
    "PathResult",
    "SliceStats",
    "run_bench",
]

_MB = 1e6
_GB = 1e9

#: Every path, by name: those without Ray, then the Ray paths.
PATHS: dict[str, type[BenchPath]] = {cls.name: cls for cls in (*_paths.PATHS, *_ray_paths.PATHS)}


@dataclasses.dataclass
class SliceStats:
    """One time slice of one path.

    Attributes:
        round: Round index.
        requests: Requests completed.
        wall_s: Wall-clock time.
        cpu_s: Client process CPU time (all threads).
        side_cpu_s: CPU time of the Ray node actor meanwhile (paths that have one).
    """

    round: int
    requests: int
    wall_s: float
    cpu_s: float
    side_cpu_s: float | None = None


@dataclasses.dataclass
class PathResult:
    """The totals of one path on one model.

    Attributes:
        path: The path's name.
        label: Human-readable name.
        input_nbytes: Input bytes per request.
        slices: Per-slice measurements.
        verified: The first request's outputs matched the reference.
        skipped: Why the path did not run (unavailable here), else ``None``.
        error: Why the path failed, else ``None``.
    """

    path: str
    label: str
    input_nbytes: int
    slices: list[SliceStats] = dataclasses.field(default_factory=list)
    verified: bool = False
    skipped: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the path produced valid numbers."""
        return self.verified and self.error is None and self.skipped is None and self.requests > 0

    @property
    def requests(self) -> int:
        """Requests over all slices."""
        return sum(s.requests for s in self.slices)

    @property
    def wall_s(self) -> float:
        """Wall-clock seconds over all slices."""
        return sum(s.wall_s for s in self.slices)

    @property
    def cpu_s(self) -> float:
        """Client CPU seconds over all slices."""
        return sum(s.cpu_s for s in self.slices)

    @property
    def mb_per_s(self) -> float | None:
        """Input megabytes (1e6 B) per second."""
        if not self.ok or self.wall_s <= 0:
            return None
        return self.requests * self.input_nbytes / _MB / self.wall_s

    @property
    def requests_per_s(self) -> float | None:
        """Requests per second."""
        if not self.ok or self.wall_s <= 0:
            return None
        return self.requests / self.wall_s

    @property
    def cpu_s_per_gb(self) -> float | None:
        """Client CPU seconds per gigabyte (1e9 B) of input."""
        if not self.ok:
            return None
        gigabytes = self.requests * self.input_nbytes / _GB
        return self.cpu_s / gigabytes if gigabytes > 0 else None

    @property
    def side_cpu_us_per_request(self) -> float | None:
        """The node actor's CPU microseconds per request (paths that have one)."""
        sides = [s.side_cpu_s for s in self.slices]
        if not self.ok or not sides or None in sides:
            return None
        return sum(s for s in sides if s is not None) / self.requests * 1e6

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "path": self.path,
            "label": self.label,
            "ok": self.ok,
            "verified": self.verified,
            "skipped": self.skipped,
            "error": self.error,
            "requests": self.requests,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "mb_per_s": self.mb_per_s,
            "requests_per_s": self.requests_per_s,
            "cpu_s_per_gb": self.cpu_s_per_gb,
            "node_actor_cpu_us_per_request": self.side_cpu_us_per_request,
            "slices": [dataclasses.asdict(s) for s in self.slices],
        }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


@dataclasses.dataclass
class ModelResult:
    """All paths on one model.

    Attributes:
        case: The workload.
        paths: Results by path name, in table order.
        node_load: The node under load (``bench --ray``), see :mod:`._node_load`.
    """

    case: ModelCase
    paths: dict[str, PathResult] = dataclasses.field(default_factory=dict)
    node_load: list[LoadRun] = dataclasses.field(default_factory=list)

    def node_ratio(self, kind: str) -> float | None:
        """``"16_vs_4"``, ``"shm_vs_grpc"`` (see :func:`load_ratios`) or ``"fairness"`` (of
        the 16 callers on 4 slots) of the node-load runs."""
        if kind == "fairness":
            many = [r for r in self.node_load if r.path == "shm-model" and r.callers == 16]
            return many[0].fairness if many else None
        return load_ratios(self.node_load).get(self.case.name, {}).get(kind)

    def mbps_vs(self, path: str, baseline: str = "grpc") -> float | None:
        """``path``'s MB/s over ``baseline``'s."""
        a, b = self.paths.get(path), self.paths.get(baseline)
        return _ratio(a.mb_per_s if a else None, b.mb_per_s if b else None)

    def cpu_vs(self, path: str, baseline: str = "memcpy") -> float | None:
        """``path``'s CPU s/GB over ``baseline``'s."""
        a, b = self.paths.get(path), self.paths.get(baseline)
        return _ratio(a.cpu_s_per_gb if a else None, b.cpu_s_per_gb if b else None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        ratios = {
            "shm_client_vs_grpc_mb_per_s": self.mbps_vs("shm-client", "grpc"),
            "shm_client_vs_http_mb_per_s": self.mbps_vs("shm-client", "http"),
            "shm_client_vs_shm_manual_mb_per_s": self.mbps_vs("shm-client", "shm-manual"),
            "shm_client_vs_memcpy_cpu_s_per_gb": self.cpu_vs("shm-client", "memcpy"),
        }
        for path, baseline in RAY_RATIOS:
            if path in self.paths:
                key = f"{path}_vs_{baseline}_mb_per_s".replace("-", "_")
                ratios[key] = self.mbps_vs(path, baseline)
        return {
            "model": self.case.model,
            "case": self.case.name,
            "batch_size": self.case.batch_size,
            "input_bytes_per_request": self.case.input_nbytes,
            "output_bytes_per_request": self.case.output_nbytes,
            "paths": {name: r.to_dict() for name, r in self.paths.items()},
            "ratios": ratios,
            "node_load": {
                "runs": [r.to_dict() for r in self.node_load],
                "ratios": load_ratios(self.node_load).get(self.case.name, {}),
            },
        }


#: MB/s ratios reported for the Ray paths (``bench --ray``): ``(path, baseline)``, each pair
#: the same topology with one choice changed.
RAY_RATIOS: tuple[tuple[str, str], ...] = (
    ("serve-shm", "serve-grpc"),
    ("serve-shm", "serve-inproc"),
    ("data-shm", "data-grpc"),
    ("data-shm", "data-noop"),
)


@dataclasses.dataclass(frozen=True)
class Goal:
    """A target for the shm client on one model.

    Attributes:
        model: The model.
        kind: ``"mbps_vs_grpc"`` (ratio must be at least ``target``),
            ``"cpu_vs_memcpy"`` (ratio must be at most ``target``), ``"mbps_vs"``
            (``path``'s MB/s over ``baseline``'s must be at least ``target``; such a goal is
            listed only when both paths were part of the run), ``"actor_cpu_us"`` (the node
            actor's CPU microseconds per request of ``path`` must be at most ``target``), or
            ``"node"`` (the node-load ratio named by ``path``, see
            :meth:`ModelResult.node_ratio`, must be at least ``target``).
        target: The threshold.
        path: The path measured (``"mbps_vs"``).
        baseline: The path compared with (``"mbps_vs"``).
    """

    model: str
    kind: str
    target: float
    path: str = "shm-client"
    baseline: str = ""

    @property
    def description(self) -> str:
        """E.g. ``"shm-client MB/s >= 3x gRPC"``."""
        if self.kind == "mbps_vs_grpc":
            return f"shm-client MB/s >= {self.target:g}x gRPC"
        if self.kind == "mbps_vs":
            return f"{self.path} MB/s >= {self.target:g}x {self.baseline}"
        if self.kind == "actor_cpu_us":
            return f"{self.path}: node actor CPU <= {self.target:g} us/request"
        if self.kind == "node":
            return {
                "16_vs_4": f"16 callers on 4 slots >= {self.target:g}x req/s of 4 callers",
                "shm_vs_grpc": f"16 callers on 4 slots >= {self.target:g}x req/s of 16 gRPC",
                "fairness": f"16 callers on 4 slots: fewest done >= {self.target:g}x the mean",
            }[self.path]
        return f"shm-client CPU s/GB <= {self.target:g}x memcpy floor"

    def applies_to(self, config: BenchConfig) -> bool:
        """Whether the goal is listed for a run of ``config``."""
        if self.model not in config.models:
            return False
        if self.kind == "actor_cpu_us":
            return self.path in config.paths
        if self.kind == "node":
            return config.node_load_s > 0 and any(p in RAY_PATHS for p in config.paths)
        return self.kind != "mbps_vs" or {self.path, self.baseline} <= set(config.paths)

    def measure(self, result: ModelResult) -> float | None:
        """The ratio this goal is about, or ``None`` if not measurable."""
        if self.kind == "mbps_vs_grpc":
            return result.mbps_vs("shm-client", "grpc")
        if self.kind == "mbps_vs":
            return result.mbps_vs(self.path, self.baseline)
        if self.kind == "actor_cpu_us":
            path = result.paths.get(self.path)
            return path.side_cpu_us_per_request if path else None
        if self.kind == "node":
            return result.node_ratio(self.path)
        return result.cpu_vs("shm-client", "memcpy")

    def is_met(self, value: float) -> bool:
        """Whether ``value`` meets the goal."""
        at_most = self.kind in ("cpu_vs_memcpy", "actor_cpu_us")
        return value <= self.target if at_most else value >= self.target


#: The project's performance goals.
GOALS: tuple[Goal, ...] = (
    Goal("identity", "mbps_vs_grpc", 1.0),
    Goal("classifier", "mbps_vs_grpc", 3.0),
    Goal("my_model", "mbps_vs_grpc", 3.0),
    Goal("large_image", "mbps_vs_grpc", 8.0),
    Goal("classifier", "cpu_vs_memcpy", 1.5),
    Goal("large_image", "cpu_vs_memcpy", 1.5),
    Goal("upper-short", "mbps_vs_grpc", 1.0),
    Goal("upper-long", "mbps_vs_grpc", 1.5),
    # bench --ray: the same Serve deployment with its replica on each client, and the same
    # Ray Data job with each predictor.
    Goal("identity", "mbps_vs", 1.0, "serve-shm", "serve-grpc"),
    Goal("classifier-1", "mbps_vs", 1.0, "serve-shm", "serve-grpc"),
    Goal("classifier", "mbps_vs", 2.3, "serve-shm", "serve-grpc"),
    Goal("large_image", "mbps_vs", 3.5, "serve-shm", "serve-grpc"),
    *(
        Goal(case, "mbps_vs", 0.95, "serve-shm", "serve-inproc")
        for case in ("identity", "classifier-1", "classifier", "my_model", "large_image")
    ),
    Goal("classifier", "mbps_vs", 0.95, "data-shm", "data-noop"),
    # bench --ray, the node under load: 16 caller processes on 4 node slots.
    *(Goal(case, "node", 0.9, "16_vs_4") for case in ("identity", "classifier-1", "classifier")),
    Goal("identity", "node", 0.85, "shm_vs_grpc"),
    Goal("classifier-1", "node", 2.5, "shm_vs_grpc"),
    Goal("classifier", "node", 4.5, "shm_vs_grpc"),
    *(Goal(case, "node", 0.5, "fairness") for case in ("identity", "classifier-1", "classifier")),
    Goal("classifier", "mbps_vs", 1.0, "data-shm", "data-grpc"),
    # The node actor before it left the request path: about 1.17 ms of CPU per request.
    Goal("classifier", "actor_cpu_us", 0.05 * 1170, "serve-shm"),
    Goal("classifier", "actor_cpu_us", 0.05 * 1170, "data-shm"),
)


@dataclasses.dataclass(frozen=True)
class GoalResult:
    """A goal and what was measured.

    Attributes:
        goal: The goal.
        value: The measured ratio (``None``: not measured, e.g. model or path not run).
    """

    goal: Goal
    value: float | None

    @property
    def met(self) -> bool | None:
        """``None`` if not measured."""
        return None if self.value is None else self.goal.is_met(self.value)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "model": self.goal.model,
            "kind": self.goal.kind,
            "target": self.goal.target,
            "description": self.goal.description,
            "value": self.value,
            "met": self.met,
        }


@dataclasses.dataclass
class BenchResults:
    """Everything one run measured.

    Attributes:
        config: What was run.
        models: Per-model results, in order.
        server: ``"embedded"`` or the URL of the server used.
        duration_s: Total wall time.
    """

    config: BenchConfig
    models: list[ModelResult]
    server: str
    duration_s: float = 0.0

    def goals(self) -> list[GoalResult]:
        """Every goal whose model was run, with its measured value."""
        by_model = {m.case.name: m for m in self.models}
        return [
            GoalResult(goal, goal.measure(by_model[goal.model]))
            for goal in GOALS
            if goal.model in by_model and goal.applies_to(self.config)
        ]

    @property
    def failures(self) -> list[str]:
        """``"model/path: error"`` for every path that failed (not skipped)."""
        return [
            f"{m.case.name}/{name}: {r.error}"
            for m in self.models
            for name, r in m.paths.items()
            if r.error is not None
        ]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        import platform

        return {
            "schema": "ray-triton-shm-bench/1",
            "units": {"mb": "1e6 bytes of input", "gb": "1e9 bytes of input"},
            "config": {
                **dataclasses.asdict(self.config),
                "models": list(self.config.models),
                "paths": list(self.config.paths),
            },
            "server": self.server,
            "host": {"machine": platform.machine(), "python": platform.python_version()},
            "duration_s": self.duration_s,
            "models": {m.case.name: m.to_dict() for m in self.models},
            "goals": [g.to_dict() for g in self.goals()],
            "failures": self.failures,
        }


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------

#: Advances the progress bar (``advance=``) and/or sets its text (``description=``).
_Step = Callable[..., None]


def _reference_outputs(
    target: BenchTarget, case: ModelCase, inputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """One plain gRPC request: the outputs every path must reproduce."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(target.grpc_url)
    try:
        infer_inputs, outputs = grpc_request(inputs, case.outputs)
        result = client.infer(case.model, infer_inputs, outputs=outputs)
        reference = {name: np.array(result.as_numpy(name)) for name in case.outputs}
    finally:
        with contextlib.suppress(Exception):
            client.close()
    for name, spec in case.outputs.items():
        expected_shape = case.batched_shape(spec)
        got = reference[name]
        if got is None or got.shape != expected_shape or got.dtype != spec.dtype:
            raise OutputMismatch(
                f"{case.model}: reference output {name} is "
                f"{None if got is None else (got.shape, got.dtype)}, expected "
                f"{(expected_shape, spec.dtype)}"
            )
    if case.identity and not np.array_equal(reference["OUTPUT0"], inputs["INPUT0"]):
        raise OutputMismatch(f"{case.model}: OUTPUT0 is not INPUT0")
    return reference


def _run_slice(path: BenchPath, *, round_index: int, slice_s: float) -> SliceStats:
    side0 = path.side_cpu_time()
    cpu0 = path.cpu_time()
    t0 = time.perf_counter()
    requests = path.run_slice(slice_s)
    elapsed = time.perf_counter() - t0
    cpu_s = path.cpu_time() - cpu0
    side1 = path.side_cpu_time()
    side_cpu_s = None if side0 is None or side1 is None else side1 - side0
    return SliceStats(round_index, requests, elapsed, cpu_s, side_cpu_s)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


@contextlib.contextmanager
def _server_target(config: BenchConfig) -> Iterator[tuple[BenchTarget, str]]:
    if config.url is not None:
        yield BenchTarget(config.url, config.http_url), config.url
        return
    from ray_triton_shm.local._server import LocalTritonServer

    server = LocalTritonServer(startup_timeout_s=config.startup_timeout_s, install=True)
    try:
        server.start()
        yield BenchTarget(server.grpc_url, server.http_url), "embedded"
    finally:
        server.close()


def _run_model(
    case: ModelCase,
    target: BenchTarget,
    config: BenchConfig,
    ray_session: RayBenchSession | None,
    step: _Step,
    units_per_path: int,
) -> ModelResult:
    result = ModelResult(case)
    for name in config.paths:
        result.paths[name] = PathResult(name, PATHS[name].label, case.input_nbytes)
    inputs = case.make_inputs(seed=zlib.crc32(case.model.encode()))
    step(description=f"{case.name}: reference request")
    try:
        reference = _reference_outputs(target, case, inputs)
    except Exception as exc:
        for r in result.paths.values():
            r.error = f"reference gRPC request failed: {_describe(exc)}"
        step(advance=units_per_path * len(config.paths))
        return result

    with contextlib.ExitStack() as stack:
        active: dict[str, BenchPath] = {}
        for name in config.paths:
            r = result.paths[name]
            cls = PATHS[name]
            kwargs: dict[str, Any] = dict(
                target=target, case=case, inputs=inputs, reference=reference
            )
            if issubclass(cls, RayPath):
                assert ray_session is not None
                kwargs["session"] = ray_session
            path = cls(**kwargs)
            stack.callback(path.teardown)
            step(description=f"{case.name}: setting up {name}")
            try:
                path.setup()
                path_outputs = path.run_once()
                check_outputs(path_outputs, reference)
                r.verified = True
                for _ in range(max(0, config.warmup_requests - 1)):
                    path.run_once()
            except SkipPath as exc:
                r.skipped = str(exc)
            except Exception as exc:
                r.error = _describe(exc)
            if r.verified and r.skipped is None and r.error is None:
                active[name] = path
                step(advance=1)
            else:
                step(advance=units_per_path)
        names = list(active)
        for round_index in range(config.rounds):
            # Rotate the order so no path always runs right after the same neighbour.
            shift = round_index % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                r = result.paths[name]
                if r.error is not None:
                    step(advance=1)
                    continue
                step(description=f"{case.name}: {name} (round {round_index + 1}/{config.rounds})")
                try:
                    r.slices.append(
                        _run_slice(active[name], round_index=round_index, slice_s=config.slice_s)
                    )
                except Exception as exc:
                    r.error = _describe(exc)
                step(advance=1)
        step(description=f"{case.name}: cleaning up")
    return result


@contextlib.contextmanager
def _ray_session(
    config: BenchConfig, target: BenchTarget, step: _Step
) -> Iterator[RayBenchSession | None]:
    """The Ray session of the run if a Ray path is selected (once for all models), else
    ``None``."""
    if not any(issubclass(PATHS[name], RayPath) for name in config.paths):
        yield None
        return
    step(description="starting Ray")
    with RayBenchSession(target, callers=config.ray_callers) as session:
        yield session
        step(description="stopping Ray")


def run_bench(config: BenchConfig, *, progress: Progress | None = None) -> BenchResults:
    """Run the benchmark.

    Everything acquired (server, regions, registrations, connections, Ray) is released
    before this returns or raises, including on ``KeyboardInterrupt``.

    Args:
        config: What to run.
        progress: Where to show progress (one task is added); none is shown if ``None``.

    Returns:
        The results.

    Raises:
        KeyError: If a model or path name is unknown.
        ray_triton_shm.local._server.LocalServerError: If the embedded server fails to start.
    """
    cases = [CASES[m] for m in config.models]
    unknown = [name for name in config.paths if name not in PATHS]
    if unknown:
        raise KeyError(f"unknown path(s): {', '.join(unknown)}")
    units_per_path = 1 + config.rounds
    if progress is None:
        progress = Progress(disable=True)
    task = progress.add_task("", total=len(cases) * len(config.paths) * units_per_path)
    # Drawn on updates only: a refresh thread would take CPU from the timed slices.
    step: _Step = functools.partial(progress.update, task, refresh=True)
    start = time.perf_counter()
    models: list[ModelResult] = []
    step(description="starting the Triton server" if config.url is None else "connecting")
    with (
        _server_target(config) as (target, server_desc),
        _ray_session(config, target, step) as ray_session,
    ):
        for case in cases:
            models.append(_run_model(case, target, config, ray_session, step, units_per_path))
        if ray_session is not None and ray_session.error is None and config.node_load_s > 0:
            runs = run_node_load(cases, target.grpc_url, duration_s=config.node_load_s, step=step)
            for model in models:
                model.node_load = [r for r in runs if r.model == model.case.name]
        step(description="stopping the server" if config.url is None else "done")
    return BenchResults(
        config=config,
        models=models,
        server=server_desc,
        duration_s=time.perf_counter() - start,
    )
