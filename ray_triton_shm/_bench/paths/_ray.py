"""The Ray paths of ``bench --ray``, on a private local Ray
(:class:`~._ray_session.RayBenchSession`).

* Caller processes (Ray actors), each sending one request at a time: ``shm-model``
  (``ShmModel``, the model given ``slots`` node slots) and ``grpc-procs`` (plain gRPC).
* Serve: the same deployment (one replica, fed by the callers) whose replica uses
  ``tritonclient.grpc.aio``, ``ShmModel``, or a ``TritonSHMClient`` of its own.
* Churn: ``ShmModel`` in caller processes on inputs of their own, every answer checked, once
  undisturbed and once with one caller SIGKILLed (mid-request) and replaced at intervals.
* Ray Data: the same ``map_batches`` job (one predictor actor per caller) with a plain gRPC
  predictor, ``ShmPredictor`` or a no-op one (the job's own ceiling), on ``classifier``. A
  slice is a whole job; a request's latency, the predictor's call.
* A streaming model's: caller processes, each running one stream at a time on requests of its
  own, every response checked: ``stream-model`` (``ShmModel.stream``) and
  ``stream-grpc-procs`` (tritonclient's streaming client, a client per process); and the same
  Serve deployment streaming to the callers' handles (``stream=True``), its replica on
  ``ShmModel.stream_async`` (``serve-stream``) or on tritonclient's streaming client
  (``serve-stream-grpc``: one gRPC stream, its requests told apart by their ids).

What runs in those processes is in :mod:`._ray_callers`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ray_triton_shm._bench._config import (
    CHURN_CASE,
    CHURN_KILL_EVERY_S,
    DATA_CASE,
    DATA_JOB_ROUNDS,
    ELASTIC,
    POOL_SAMPLE_S,
)
from ray_triton_shm._bench._load import (
    OpenLoop,
    StreamSlice,
    merge_open_loops,
    merge_stream_slices,
)
from ray_triton_shm._bench.paths._base import SkipPath, check_outputs
from ray_triton_shm._bench.paths._clients import Backend, infer
from ray_triton_shm._bench.paths._ray_callers import (
    LATENCY,
    STREAM_GRPC,
    STREAM_SHM,
    BenchReplica,
    Caller,
    ChurnCaller,
    Predictor,
    shm_model_options,
)
from ray_triton_shm._bench.paths._ray_session import (
    SERVE_APP,
    RayBenchSession,
    RayPath,
    process_cpu_s,
)
from ray_triton_shm._wire._plain_client import tritonclient_for

with contextlib.suppress(ImportError):  # without the ray extra: the session says so
    import ray

__all__ = ["PATHS", "STREAM_PATHS", "ShmModelPath"]


class _CallerPath(RayPath):
    """``concurrency`` caller processes, each sending one request at a time through
    :meth:`_through` (see :func:`~._ray_callers.connect`): the same inputs, its first answers
    checked; with :attr:`~._base.BenchPath.own_inputs`, each caller its own, every answer
    checked in the caller (:meth:`_own_inputs`)."""

    _callers: list[Any] = []
    _replica: int | None = None

    def setup(self) -> None:
        super().setup()
        self._key = f"{self.name}:{self.concurrency}:{self.slots}"
        self._callers = self.session.actors(Caller, self.concurrency)
        arg, through = self._arg(), self._through()
        if self.own_inputs:
            mine = self._own_inputs()
            added = [
                c.add.remote(self._key, through, arg, self.case, ray.put(inputs), reference)
                for c, (inputs, reference) in zip(self._callers, mine)
            ]
        else:
            inputs = ray.put(self.inputs)
            added = [
                c.add.remote(self._key, through, arg, self.case, inputs) for c in self._callers
            ]
        self._pids = [os.getpid(), *ray.get(added)]

    def _own_inputs(self) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
        """Each caller's inputs and the answer to them: the first caller's the bench's, the
        others' of seeds of their own, answered by plain gRPC on this path's Triton."""
        mine = [(dict(self.inputs), dict(self.reference))]
        client = tritonclient_for(self.target.grpc_url)
        try:
            for seat in range(1, len(self._callers)):
                inputs = self.case.make_inputs(seed=zlib.crc32(self.case.model.encode()) + seat)
                answer = infer(client, self.case, inputs)
                mine.append((inputs, {name: np.array(a) for name, a in answer.items()}))
        finally:
            client.close()
        return mine

    def answers_checked(self) -> int | None:
        if not self.own_inputs or not self._callers:
            return None
        return sum(ray.get([c.checked.remote(self._key) for c in self._callers], timeout=60))

    def _through(self) -> Backend:
        """What the callers send their requests through: :attr:`backend`."""
        return self.backend

    def run_once(self) -> Mapping[str, np.ndarray]:
        """One request from every caller at once; checks them all (each caller its own,
        with :attr:`~._base.BenchPath.own_inputs`), returns the first."""
        answers = ray.get([c.once.remote(self._key) for c in self._callers])
        for answer in [] if self.own_inputs else answers[1:]:
            check_outputs(answer, self.reference)
        return answers[0]  # type: ignore[no-any-return]

    def run_slice(self, slice_s: float) -> tuple[list[np.ndarray], float]:
        start_at = time.time() + 0.05 + 0.005 * len(self._callers)  # every caller at once
        runs = ray.get([c.loop.remote(self._key, start_at, slice_s) for c in self._callers])
        return [latencies for latencies, _ in runs], max(wall for _, wall in runs)

    def run_rate(self, due: np.ndarray, threads: int, give_up_s: float) -> OpenLoop:
        """The arrivals dealt out to the callers in turn, each with its share of ``threads``."""
        start_at = time.time() + 0.05 + 0.005 * len(self._callers)
        count = len(self._callers)
        each = max(1, threads // count)
        loops = ray.get(
            [
                caller.open_loop.remote(self._key, start_at, due[seat::count], each, give_up_s)
                for seat, caller in enumerate(self._callers)
                if len(due[seat::count])
            ]
        )
        return merge_open_loops(loops)

    def cpu_time(self) -> float:
        return sum(map(process_cpu_s, self._pids + ([self._replica] if self._replica else [])))

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            ray.get([c.remove.remote(self._key) for c in self._callers], timeout=60)
        self._callers = []


class _PoolSizes:
    """A thread reading the size of ``model``'s pool from the node ``actor`` every
    :data:`POOL_SAMPLE_S` until stopped: ``samples`` are ``[seconds since the start, slots]``,
    ``limits`` what stopped it growing while callers waited, as seen (``limited_by``), and
    ``cpu_s`` the CPU time the thread took (the driver's, not the callers')."""

    def __init__(self, actor: Any, model: str) -> None:
        self._actor, self._model = actor, model
        self.samples: list[list[float]] = []
        self.limits: list[str] = []
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="bench-pool-sizes", daemon=True)
        self._thread.start()

    def sample(self) -> dict[str, Any]:
        """Reads the pool's stats once, and keeps its size (``{}``: not registered)."""
        stats = ray.get(self._actor.stats.remote(), timeout=60).models.get(self._model, {})
        if stats:
            self.samples.append([round(time.perf_counter() - self._start, 3), stats["slots"]])
            limit = stats["limited_by"]
            self.limits += [limit] if limit and limit not in self.limits else []
        return stats  # type: ignore[no-any-return]

    def _run(self) -> None:
        while not self._stop.is_set():
            cpu = time.thread_time()
            with contextlib.suppress(Exception):  # the run ends, or the actor with it
                self.sample()
            self.cpu_s += time.thread_time() - cpu
            self._stop.wait(POOL_SAMPLE_S)

    def stop(self) -> None:
        """Ends the thread (idempotent)."""
        self._stop.set()
        self._thread.join(timeout=70)


class ShmModelPath(_CallerPath):
    """``ShmModel`` in every caller process, the model given ``slots`` node slots; on
    :data:`~.._config.ELASTIC`, its pool follows its load, and its size is read from its
    warm-up on (:class:`_PoolSizes`; the node actor's CPU includes its answers)."""

    name, label, uses_node_actor = "shm-model", "ShmModel in each caller", True
    backend = Backend.SHM_MODEL
    _sizes: _PoolSizes | None = None
    _warmup: tuple[int, float] = (0, 0.0)

    def _arg(self) -> Any:
        return self.slots

    def warm_up(self, seconds: float) -> None:
        if self.slots == ELASTIC and self._sizes is None:
            self._sizes = _PoolSizes(self.session.node_actor(), self.case.model)
        if seconds > 0:
            latencies, wall_s = self.run_slice(seconds)
            self._warmup = sum(map(len, latencies)), wall_s

    def cpu_time(self) -> float:
        return super().cpu_time() - (self._sizes.cpu_s if self._sizes else 0.0)

    def stats(self) -> dict[str, Any]:
        """The p99 wait for a slot among requests that waited, and the ``/dev/shm`` taken;
        for an elastic pool, its size over time (``pool_sizes``: ``[seconds since its
        warm-up began, slots]``, read on through the slices of the runs beside it), where it
        started (``min_slots``), the most it reached and when (``pool_size_max``,
        ``pool_size_max_s``), its size at the end (``pool_size_settled``), how often it grew
        and shrank, what stopped it growing while callers waited, if anything
        (``limited_by``, ``""``: nothing), and the requests per second of its warm-up's
        untimed load (``warmup_requests_per_s``, over ``warmup_s``; ``None``: none)."""
        sizes = self._sizes
        if sizes is not None:
            sizes.stop()
            model = sizes.sample()
        else:
            model = self._node_stats().models.get(self.case.model, {})
        wait_ms = model["wait_p99_us"] / 1000 if model.get("waits") else None
        numbers = {"wait_p99_ms": wait_ms, "shm_bytes": model.get("shm_bytes")}
        for key in ("transport", "transport_reason"):
            numbers |= {key: model[key]} if key in model else {}
        if sizes is None or not sizes.samples:
            return numbers
        most = max(size for _, size in sizes.samples)
        return numbers | {
            "pool_sizes": sizes.samples,
            "min_slots": model["min_slots"],
            "max_slots": model["max_slots"],
            "pool_size_max": most,
            "pool_size_max_s": next(t for t, size in sizes.samples if size == most),
            "pool_size_settled": model["slots"],
            "pool_grows": model["grows"],
            "pool_shrinks": model["shrinks"],
            "limited_by": ",".join(sizes.limits),
            "warmup_s": self._warmup[1],
            "warmup_requests_per_s": self._warmup[0] / self._warmup[1] if self._warmup[1] else None,
        }

    def teardown(self) -> None:
        if self._sizes is not None:
            self._sizes.stop()
        super().teardown()


class GrpcProcsPath(_CallerPath):
    """Plain ``tritonclient.grpc`` in every caller process: no limit."""

    name, label, backend = "grpc-procs", "gRPC client in each caller", Backend.GRPC


class _ChurnPath(ShmModelPath):
    """``concurrency`` caller processes (:class:`ChurnCaller`; the first on the bench's inputs,
    the others on inputs of their own), the model given ``slots`` node slots; with ``kills``,
    one of them is SIGKILLed every :data:`CHURN_KILL_EVERY_S` of the run (mid-request, as they
    loop) and replaced at once by a fresh one. The requests a killed caller had in flight are
    lost; those it completed count."""

    kills: ClassVar[bool]

    def setup(self) -> None:
        if self.case.name != CHURN_CASE:
            raise SkipPath(f"the churn runs on the example {CHURN_CASE!r} model only")
        RayPath.setup(self)
        self._class = ray.remote(num_cpus=0, max_concurrency=2)(ChurnCaller)  # type: ignore[call-overload]
        self._started = self._killed = self._wrong = 0
        self._run_s, self._next_kill_s = 0.0, CHURN_KILL_EVERY_S
        self._cpu: dict[int, float] = {}  # by pid, the last read (killed callers' included)
        self._callers = [self._start() for _ in range(self.concurrency)]
        self._pids = [os.getpid(), *ray.get([pid for _, pid in self._callers])]

    def _start(self) -> tuple[Any, Any]:
        """A fresh caller: its actor, and the ref of its pid once started."""
        actor = self._class.remote()
        inputs = ray.put(self.inputs) if self._started == 0 else self._started
        self._started += 1
        return actor, actor.start.remote(self.case, self.target.grpc_url, self.slots, inputs)

    def run_once(self) -> Mapping[str, np.ndarray]:
        """One request from every caller at once, each checked; returns the first's."""
        return ray.get([actor.once.remote() for actor, _ in self._callers])[0]  # type: ignore[no-any-return]

    def run_slice(self, slice_s: float) -> tuple[list[np.ndarray], float]:
        start_at = time.time() + 0.05 + 0.005 * len(self._callers)
        end_at = start_at + slice_s
        loops = [actor.loop.remote(end_at) for actor, _ in self._callers]
        latencies: list[list[float]] = [[] for _ in self._callers]
        lost = []
        while self.kills and self._next_kill_s < self._run_s + slice_s:
            time.sleep(max(0.0, start_at + self._next_kill_s - self._run_s - time.time()))
            seat = self._killed % len(self._callers)
            actor, pid = self._callers[seat]
            done, wrong = ray.get(actor.take.remote(), timeout=60)
            pid = ray.get(pid, timeout=60)
            self._cpu[pid] = process_cpu_s(pid)
            os.kill(pid, signal.SIGKILL)
            latencies[seat] += done
            self._wrong += wrong
            self._killed += 1
            self._next_kill_s += CHURN_KILL_EVERY_S
            lost.append(loops[seat])
            self._callers[seat] = self._start()
            loops[seat] = self._callers[seat][0].loop.remote(end_at)
        lasts = []
        for seat, (done, wrong, last) in enumerate(ray.get(loops)):
            latencies[seat] += done
            self._wrong += wrong
            lasts.append(last or end_at)
        for ref in lost:  # gotten, or Ray reports their errors as unhandled
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=10)
        self._run_s += slice_s
        self._pids = [*dict.fromkeys([*self._pids, *ray.get([p for _, p in self._callers])])]
        return [np.array(seat) for seat in latencies], max(lasts) - start_at

    def cpu_time(self) -> float:
        for pid in self._pids:
            self._cpu[pid] = max(self._cpu.get(pid, 0.0), process_cpu_s(pid))
        return sum(self._cpu.values())

    def stats(self) -> dict[str, Any]:
        """Callers killed, wrong answers, the slots abandoned at the end (waiting for Triton to
        finish a killed caller's request), and :class:`ShmModelPath`'s numbers."""
        numbers: dict[str, Any] = {"kills": self._killed, "wrong_answers": self._wrong}
        with contextlib.suppress(Exception):
            numbers |= super().stats()
            model = self._node_stats().models[self.case.model]
            numbers["abandoned"] = model["abandoned"]
            numbers["settle_p99_us"] = model["settle_p99_us"]
        return numbers

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            ray.get([actor.close.remote() for actor, _ in self._callers], timeout=60)
        for actor, _ in self._callers:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._callers = []


class ShmModelNoKillPath(_ChurnPath):
    """The churn runs' callers, none killed."""

    name, label, kills = "shm-model-nokill", "ShmModel, callers never killed", False


class ShmModelChurnPath(_ChurnPath):
    """The churn runs' callers, one killed and replaced every :data:`CHURN_KILL_EVERY_S`."""

    name, label, kills = "shm-model-churn", "ShmModel, a caller killed every 2 s", True


def _deploy(
    session: RayBenchSession, backend: Backend, callers: int, slots: int | None = None
) -> Any:
    """A ``DeploymentHandle`` on ``backend``'s method of the bench deployment (an app of its
    own, one replica for every backend), run on first use: its replica's pool of ``slots``
    slots (``None``: as many as its callers, 8 at least), an app for each size."""
    from ray import serve

    session.serve()
    slots = max(8, callers) if slots is None else slots
    key = "bench" if slots == 8 else f"bench-{slots}"
    if key not in session.apps:
        deployment = serve.deployment(
            BenchReplica,
            name="triton-bench",
            max_ongoing_requests=max(8, 2 * callers),
            ray_actor_options={"num_cpus": 0},
        )
        app = deployment.bind(session.target.grpc_url, slots)  # type: ignore[attr-defined]
        name = SERVE_APP if slots == 8 else f"{SERVE_APP}-{slots}"
        session.apps[key] = serve.run(app, name=name, route_prefix=None)
    return session.apps[key].options(method_name=backend.value)


class _ServePath(_CallerPath):
    """The same Serve deployment, fed by the callers; only its replica's ``backend`` differs."""

    _handle: Any = None

    def _through(self) -> Backend:
        return Backend.SERVE

    def _arg(self) -> Any:
        # In the many-callers case (its callers on inputs of their own), as many slots as
        # callers: the model's registration on the node is its Ray tasks' beside it.
        slots = self.concurrency if self.own_inputs else None
        self._handle = _deploy(self.session, self.backend, self.concurrency, slots)
        self._replica = self._handle.prepare.remote(self.case).result()
        return self._handle

    def stats(self) -> dict[str, Any]:
        """How the replica's client reached Triton, for the library's (``transport``, and
        ``transport_reason``)."""
        if self.backend == Backend.GRPC:
            return {}
        return self._handle.transport.remote(self.backend).result()  # type: ignore[no-any-return]

    def teardown(self) -> None:
        super().teardown()
        with contextlib.suppress(Exception):
            self._handle.prepare.remote(None).result()


class ServeGrpcPath(_ServePath):
    """The Serve replica calls Triton with ``tritonclient.grpc.aio``."""

    name, label, backend = "serve-grpc", "Serve replica, plain gRPC", Backend.GRPC


class ServeShmPath(_ServePath):
    """The Serve replica calls Triton through ``ShmModel`` (the node's shared slots)."""

    name, label, uses_node_actor = "serve-shm", "Serve replica, ShmModel", True
    backend = Backend.SHM_MODEL


class ServeInProcessPath(_ServePath):
    """The Serve replica owns a ``TritonSHMClient`` (the upper bound of shared memory)."""

    name, label = "serve-inproc", "Serve replica, own TritonSHMClient"
    backend = Backend.SHM_CLIENT


class _DataPath(RayPath):
    """The same Ray Data job with the predictor on ``backend`` (see
    :class:`~._ray_callers.Predictor`)."""

    # A slice is a whole job of the session's data_job_batches (seconds, whatever --slice-s
    # says).
    max_rounds = DATA_JOB_ROUNDS

    def setup(self) -> None:
        if self.case.name != DATA_CASE:
            raise SkipPath(
                f"the bench's Ray Data job is made for the example {DATA_CASE!r} model only; "
                "for yours, time your own job with ShmPredictor against a plain gRPC one"
            )
        super().setup()

    def _job(self, batches: int, actors: int) -> list[dict[str, np.ndarray]]:
        inputs, size = ray.put(self.inputs), self.case.batch_size

        def source(ids: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            rows = len(ids["id"])
            return {"id": ids["id"], **{n: a[:rows] for n, a in ray.get(inputs).items()}}

        dataset = (
            ray.data.range(batches * size, override_num_blocks=batches)
            .map_batches(source, batch_size=size, batch_format="numpy")
            .map_batches(
                Predictor,
                fn_constructor_args=(self.backend, self._arg(), self.case),
                batch_size=size,
                batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=actors),
                num_cpus=0,
            )
        )
        return list(dataset.iter_batches(batch_size=size, batch_format="numpy"))

    def run_once(self) -> Mapping[str, np.ndarray]:
        # One batch on one actor checks the path: a job's start is mostly its actors' processes,
        # and more would not warm it up (each slice is a job of its own, its actors fresh).
        if not hasattr(self, "_first"):
            self._first = self._job(1, 1)[0]
        return {name: array for name, array in self._first.items() if name != LATENCY}

    def run_slice(self, slice_s: float) -> tuple[list[np.ndarray], float]:
        start = time.perf_counter()
        batches = self._job(self.session.data_job_batches, self.concurrency)
        wall_s = time.perf_counter() - start
        for batch in batches:  # every answer, as the first was
            check_outputs({n: a for n, a in batch.items() if n in self.reference}, self.reference)
        latencies = np.concatenate([batch[LATENCY] for batch in batches])
        return [latencies[~np.isnan(latencies)]], wall_s


class DataGrpcPath(_DataPath):
    """Ray Data with a predictor calling Triton over plain gRPC."""

    name, label, backend = "data-grpc", "Ray Data, plain gRPC predictor", Backend.GRPC


class DataShmPath(_DataPath):
    """Ray Data with ``ShmPredictor``."""

    name, label, uses_node_actor = "data-shm", "Ray Data, ShmPredictor", True
    backend = Backend.SHM_MODEL

    def _arg(self) -> Any:
        return {
            "model_name": self.case.model,
            **shm_model_options(self.case, max(8, self.concurrency)),
        }

    def stats(self) -> dict[str, Any]:
        """How the predictors' pool on the node reached Triton (``transport``, and
        ``transport_reason``)."""
        return self._node_transport()


class DataNoopPath(_DataPath):
    """Ray Data with a predictor that calls nothing (the ceiling of the job itself)."""

    name, label, backend = "data-noop", "Ray Data, no-op predictor (ceiling)", Backend.NOOP

    def _arg(self) -> Any:
        return self.reference


class _StreamCallerPath(_CallerPath):
    """``concurrency`` caller processes, each running one stream at a time on requests of its
    own (:meth:`~._base.BenchPath.stream_requests`) through :meth:`_through`, every response
    checked (:meth:`~._ray_callers.Caller.add_stream`)."""

    streaming = True

    def setup(self) -> None:
        if not self.case.streaming:
            raise SkipPath(f"{self.name} runs on a streaming (decoupled) model only")
        RayPath.setup(self)
        self._key = f"{self.name}:{self.concurrency}:{self.slots}"
        self._callers = self.session.actors(Caller, self.concurrency)
        through, arg = self._through(), self._arg()
        added = [
            caller.add_stream.remote(self._key, through, arg, self.case, self.stream_requests(seat))
            for seat, caller in enumerate(self._callers)
        ]
        self._pids = [os.getpid(), *ray.get(added)]

    def run_once(self) -> Mapping[str, np.ndarray]:
        """A stream from every caller at once, each response checked; no outputs to return."""
        ray.get([caller.stream_once.remote(self._key) for caller in self._callers])
        return {}

    def warm_up(self, seconds: float) -> None:
        if seconds > 0:
            self.run_stream_slice(seconds)

    def run_stream_slice(self, slice_s: float) -> StreamSlice:
        start_at = time.time() + 0.05 + 0.005 * len(self._callers)  # every caller at once
        loops = [c.stream_loop.remote(self._key, start_at, slice_s) for c in self._callers]
        return merge_stream_slices(ray.get(loops))


class StreamModelPath(_StreamCallerPath):
    """``ShmModel.stream`` in every caller process, the model given ``slots`` node slots."""

    name, label, uses_node_actor = "stream-model", "ShmModel.stream in each caller", True
    backend = Backend.SHM_MODEL

    def _arg(self) -> Any:
        return self.slots

    def stats(self) -> dict[str, Any]:
        """How the model's pool on the node reached Triton (``transport``, and
        ``transport_reason``), and its ``/dev/shm`` (``shm_bytes``)."""
        model = self._node_stats().models.get(self.case.model, {})
        numbers = {"shm_bytes": model.get("shm_bytes")}
        return numbers | {k: model[k] for k in ("transport", "transport_reason") if k in model}


class StreamGrpcProcsPath(_StreamCallerPath):
    """tritonclient's streaming client in every caller process (a client each), by value."""

    name, label = "stream-grpc-procs", "tritonclient streaming in each caller"
    backend = Backend.GRPC


class _ServeStreamPath(_StreamCallerPath):
    """The same Serve deployment, its replica streaming to the callers' handles
    (``stream=True``) through its :attr:`method`; only that differs."""

    #: The bench replica's streaming method.
    method: ClassVar[str]
    _handle: Any = None

    def _through(self) -> Backend:
        return Backend.SERVE

    def _arg(self) -> Any:
        self._handle = _deploy(self.session, self.backend, self.concurrency)
        self._replica = self._handle.prepare.remote(self.case).result()
        return self._handle.options(method_name=self.method, stream=True)

    def stats(self) -> dict[str, Any]:
        """How the replica's ``ShmModel`` reached Triton (``transport``, and
        ``transport_reason``)."""
        if self.backend == Backend.GRPC:
            return {}
        return self._handle.transport.remote(self.backend).result()  # type: ignore[no-any-return]

    def teardown(self) -> None:
        super().teardown()
        with contextlib.suppress(Exception):
            self._handle.prepare.remote(None).result()


class ServeStreamPath(_ServeStreamPath):
    """The Serve replica streams through ``ShmModel.stream_async`` (the node's slots)."""

    name, label, uses_node_actor = "serve-stream", "Serve replica, ShmModel.stream_async", True
    backend, method = Backend.SHM_MODEL, STREAM_SHM


class ServeStreamGrpcPath(_ServeStreamPath):
    """The Serve replica streams through tritonclient's streaming client, by value."""

    name, label = "serve-stream-grpc", "Serve replica, tritonclient streaming"
    backend, method = Backend.GRPC, STREAM_GRPC


#: The Ray paths, in table order (their names are ``_config.RAY_PATHS``).
PATHS: tuple[type[RayPath], ...] = (
    ShmModelPath,
    GrpcProcsPath,
    ServeGrpcPath,
    ServeShmPath,
    ServeInProcessPath,
    DataGrpcPath,
    DataShmPath,
    DataNoopPath,
    ShmModelNoKillPath,
    ShmModelChurnPath,
)
#: The Ray paths of a streaming model, in table order (``_config.RAY_STREAM_PATHS``).
STREAM_PATHS: tuple[type[RayPath], ...] = (
    StreamModelPath,
    StreamGrpcProcsPath,
    ServeStreamPath,
    ServeStreamGrpcPath,
)
