"""The Ray paths of ``bench --ray``: the choices a Ray user makes, each in one topology.

**Serve**: the same deployment (one replica, fed by ``ray_callers`` caller actors through a
``DeploymentHandle``, default 4), whose replica calls Triton one of three ways:

* ``serve-grpc``: ``tritonclient.grpc.aio``, what Serve users write today;
* ``serve-shm``: ``ShmModel`` (the node's slots, taken through the region; straight to Triton);
* ``serve-inproc``: a ``TritonSHMClient`` of the replica's own: the upper bound.

**Ray Data**: the same ``map_batches`` job (every batch is the case's request, ``ray_callers``
predictor actors), with a plain gRPC predictor (``data-grpc``), ``ShmPredictor``
(``data-shm``), or a predictor that calls nothing (``data-noop``): the ceiling the job itself
sets. Only on the ``classifier`` case; a slice is one whole job.

For the paths that use the node actor, its CPU time per request is reported too. The runner
starts Ray once per benchmark (:class:`RayBenchSession`, given to every Ray path) with
``$RAY_TRITON_SHM_URL`` set to the server benchmarked, and everything it created is gone when
the benchmark returns. A request
counts once per caller. The CPU time of a Serve path is that of the driver, the callers and
the replica; of a Ray Data path, the driver's only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._paths import (
    BenchPath,
    BenchTarget,
    SkipPath,
    check_outputs,
    grpc_request,
)

__all__ = [
    "DATA_CASE",
    "PATHS",
    "DataGrpcPath",
    "DataNoopPath",
    "DataShmPath",
    "RayBenchSession",
    "RayPath",
    "ServeGrpcPath",
    "ServeInProcessPath",
    "ServeShmPath",
]

_SERVE_APP = "ray-triton-shm-bench"


def _process_cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` ran so far, over all its threads, to the nanosecond (from
    ``/proc/<pid>/task/*/schedstat``; clock-tick counts are too coarse for short slices)."""
    if pid == os.getpid():
        return time.process_time()
    total_ns = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stat:
                total_ns += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total_ns / 1e9


# --------------------------------------------------------------------------------------
# What runs inside Ray
# --------------------------------------------------------------------------------------


class _Caller:
    """A Ray actor sending one request at a time through a path, in a closed loop.

    It holds one "target" per (path, model): the callable that sends one request and the
    request's inputs (resolved once from the object store).
    """

    def __init__(self) -> None:
        self._targets: dict[str, tuple[Any, Mapping[str, np.ndarray]]] = {}

    def pid(self) -> int:
        """This process's id."""
        return os.getpid()

    def add_serve(self, key: str, handle: Any, inputs: Mapping[str, np.ndarray]) -> None:
        """Sends requests of ``key`` through a Serve ``DeploymentHandle``."""

        def call(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return handle.remote(arrays).result()  # type: ignore[no-any-return]

        call(inputs)
        self._targets[key] = (call, inputs)

    def once(self, key: str) -> dict[str, np.ndarray]:
        """One request; returns its outputs."""
        call, inputs = self._targets[key]
        return dict(call(inputs))

    def loop(self, key: str, duration_s: float) -> int:
        """Requests back to back for ``duration_s`` (at least one); returns how many."""
        call, inputs = self._targets[key]
        done = 0
        deadline = time.perf_counter() + duration_s
        while True:
            call(inputs)
            done += 1
            if time.perf_counter() >= deadline:
                return done

    def remove(self, key: str) -> None:
        """Forgets ``key``."""
        self._targets.pop(key, None)


class _BenchReplica:
    """The one Serve deployment of the Serve paths; ``backend`` is the user's choice.

    * ``"grpc"``: plain ``tritonclient.grpc.aio``, what Serve users write today;
    * ``"shm"``: :class:`~ray_triton_shm.ray.ShmModel` (the node's slots, straight to Triton);
    * ``"inproc"``: a ``TritonSHMClient`` of the replica's own (the upper bound: shared
      memory with nothing shared with other processes).
    """

    def __init__(self, backend: str, url: str, case: ModelCase, slots: int) -> None:
        self._backend = backend
        self._url = url
        self._model = case.model
        self._outputs = list(case.outputs)
        self._max_shapes = dict(case.max_shapes) if case.max_shapes else None
        self._slots = slots
        self._client: Any = None

    def pid(self) -> int:
        """The replica's process id."""
        return os.getpid()

    async def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._client is None:  # made on the replica's event loop
            self._client = self._connect()
        if self._backend == "shm":
            return await self._client.infer_async(inputs)  # type: ignore[no-any-return]
        if self._backend == "inproc":
            return await self._client.infer_shm_async(self._model, inputs)  # type: ignore[no-any-return]
        return await self._grpc(inputs)

    def _connect(self) -> Any:
        if self._backend == "shm":
            from ray_triton_shm.ray import ShmModel

            return ShmModel(
                self._model,
                max_shapes=self._max_shapes,
                actor_options={"slots": self._slots},
            )
        if self._backend == "inproc":
            from ray_triton_shm import TritonSHMClient

            client = TritonSHMClient(self._url)
            client.register_shm_model(
                self._model, pool_size=self._slots, max_shapes=self._max_shapes
            )
            return client
        import tritonclient.grpc.aio as grpcclient

        return grpcclient.InferenceServerClient(self._url)

    async def _grpc(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        infer_inputs, requested = grpc_request(inputs, self._outputs)
        result = await self._client.infer(self._model, infer_inputs, outputs=requested)
        return {name: result.as_numpy(name) for name in self._outputs}


class _GrpcPredictor:
    """The Ray Data predictor a user writes without this library: plain tritonclient gRPC."""

    def __init__(self, url: str, model: str, outputs: list[str]) -> None:
        import tritonclient.grpc as grpcclient

        self._client = grpcclient.InferenceServerClient(url)
        self._model = model
        self._outputs = outputs

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        infer_inputs, requested = grpc_request(batch, self._outputs)
        result = self._client.infer(self._model, infer_inputs, outputs=requested)
        return {name: result.as_numpy(name) for name in self._outputs}


class _NoopPredictor:
    """The ceiling Ray Data itself sets: answers every batch with outputs computed before."""

    def __init__(self, outputs: Mapping[str, np.ndarray]) -> None:
        self._outputs = dict(outputs)

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(next(iter(batch.values())))
        return {name: array[:rows] for name, array in self._outputs.items()}


# --------------------------------------------------------------------------------------
# The session: Ray, the callers, Serve and the node actor, once per benchmark
# --------------------------------------------------------------------------------------


class RayBenchSession:
    """A private local Ray for the benchmark: started on entry, everything removed on exit.

    Args:
        target: The server benchmarked; its gRPC URL goes to the node actor through
            ``$RAY_TRITON_SHM_URL`` (set before ``ray.init``, so Ray's processes inherit it).
        callers: Concurrent callers per path.
    """

    def __init__(self, target: BenchTarget, *, callers: int) -> None:
        self.target = target
        self.callers = callers
        self.error: BaseException | None = None
        self.actors: list[Any] = []
        self.caller_pids: list[int] = []
        self._serve_started = False
        self.replica_pids: dict[str, int] = {}
        self._node_actor_pid: int | None = None
        self._started_ray = False
        self._old_url: str | None = None

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> RayBenchSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Starts Ray and the callers; on failure :attr:`error` says why (paths then fail)."""
        try:
            import ray
        except ImportError as exc:
            self.error = SkipPath(
                f"Ray is not installed ({exc}); pip install 'ray-triton-shm[ray]'"
            )
            return
        from ray_triton_shm.ray import URL_ENV_VAR

        try:
            self._old_url = os.environ.get(URL_ENV_VAR)
            os.environ[URL_ENV_VAR] = self.target.grpc_url
            if not ray.is_initialized():
                ray.init(
                    address="local",
                    # The callers, replica and node actor ask for no CPU.
                    num_cpus=os.cpu_count() or 2,
                    include_dashboard=False,
                    logging_level=logging.ERROR,
                    log_to_driver=False,
                )
                self._started_ray = True
            caller_class = ray.remote(num_cpus=0, max_concurrency=2)(_Caller)  # type: ignore[call-overload]
            self.actors = [caller_class.remote() for _ in range(self.callers)]
            self.caller_pids = ray.get([a.pid.remote() for a in self.actors])
        except Exception as exc:
            self.error = exc

    def check(self) -> None:
        """Raises why the session is unusable, if it is."""
        if self.error is not None:
            if isinstance(self.error, SkipPath):
                raise self.error
            raise RuntimeError(f"Ray could not be started: {self.error}") from self.error

    def deploy(self, backend: str, case: ModelCase) -> Any:
        """Runs the bench deployment with ``backend`` for ``case`` (one replica); returns its
        ``DeploymentHandle``. Each backend is an app of its own, replaced per case."""
        from ray import serve

        if not self._serve_started:
            logging.getLogger("ray.serve").setLevel(logging.WARNING)
            serve.start(proxy_location="Disabled", logging_config={"log_level": "WARNING"})
            self._serve_started = True
        deployment = serve.deployment(
            _BenchReplica,
            name=f"triton-{backend}",
            num_replicas=1,
            max_ongoing_requests=max(8, 2 * self.callers),
            ray_actor_options={"num_cpus": 0},
        )
        slots = max(8, self.callers)
        handle = serve.run(
            deployment.bind(backend, self.target.grpc_url, case, slots),  # type: ignore[attr-defined]
            name=f"{_SERVE_APP}-{backend}",
            route_prefix=None,
        )
        self.replica_pids[backend] = handle.pid.remote().result()
        return handle

    def node_actor_cpu_s(self) -> float:
        """CPU seconds the node actor used so far (it exists once something bound to it)."""
        if self._node_actor_pid is None:
            self._node_actor_pid = self.node_actor_stats().pid
        return _process_cpu_s(self._node_actor_pid)

    def node_actor(self) -> Any:
        """This node's actor (it exists once a caller bound a ``ShmModel``)."""
        import ray

        from ray_triton_shm.ray._actor import NAMESPACE, actor_name

        node = ray.get_runtime_context().get_node_id()
        return ray.get_actor(actor_name(node), namespace=NAMESPACE)

    def node_actor_stats(self) -> Any:
        """The node actor's ``stats()``."""
        import ray

        return ray.get(self.node_actor().stats.remote(), timeout=60)

    def pids(self, backend: str) -> list[int]:
        """The processes doing client work for a Serve path: driver, callers, replica."""
        replica = self.replica_pids.get(backend)
        return [os.getpid(), *self.caller_pids, *([replica] if replica else [])]

    def close(self) -> None:
        """Removes the callers, Serve, the node actor, and Ray if it started it; never raises."""
        try:
            import ray
        except ImportError:
            return
        try:
            if ray.is_initialized():
                for actor in self.actors:
                    with contextlib.suppress(Exception):
                        ray.kill(actor)
                self.actors = []
                if self._serve_started:
                    from ray import serve

                    with contextlib.suppress(Exception):
                        serve.shutdown()
                    self._serve_started = False
                with contextlib.suppress(Exception):
                    actor = self.node_actor()
                    with contextlib.suppress(Exception):
                        ray.get(actor.shutdown.remote(), timeout=60)
                    ray.kill(actor)
                if self._started_ray:
                    with contextlib.suppress(Exception):
                        ray.shutdown()
        finally:
            from ray_triton_shm.ray import URL_ENV_VAR

            if self._old_url is None:
                os.environ.pop(URL_ENV_VAR, None)
            else:
                os.environ[URL_ENV_VAR] = self._old_url


# --------------------------------------------------------------------------------------
# The paths
# --------------------------------------------------------------------------------------


class RayPath(BenchPath):
    """Shared by the Ray paths: the session, and the node actor's CPU when it is used.

    Args:
        session: The benchmark's Ray session (the other arguments are :class:`BenchPath`'s).
    """

    #: Whether the path uses the node actor (its CPU per request is reported).
    uses_node_actor: ClassVar[bool] = False

    def __init__(
        self,
        *,
        target: BenchTarget,
        case: ModelCase,
        inputs: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray],
        session: RayBenchSession,
    ) -> None:
        super().__init__(target=target, case=case, inputs=inputs, reference=reference)
        self._session = session
        self._key = f"{self.name}:{case.name}"

    def setup(self) -> None:
        if self.case.has_bytes:
            raise SkipPath("the string cases run in the core paths only")
        self._session.check()

    def side_cpu_time(self) -> float | None:
        if not self.uses_node_actor:
            return None
        return self._session.node_actor_cpu_s()


class _ServePath(RayPath):
    """The same Serve deployment, fed the same way (``ray_callers`` caller actors through a
    ``DeploymentHandle``); only its ``backend`` differs."""

    backend: ClassVar[str]
    _deployed = False

    def setup(self) -> None:
        super().setup()
        import ray

        self._deployed = True
        handle = self._session.deploy(self.backend, self.case)
        inputs_ref = ray.put(self.inputs)
        ray.get([a.add_serve.remote(self._key, handle, inputs_ref) for a in self._session.actors])

    def run_once(self) -> Mapping[str, np.ndarray]:
        """One request from every caller at once; checks them all, returns the first."""
        import ray

        answers = ray.get([a.once.remote(self._key) for a in self._session.actors])
        for answer in answers[1:]:
            check_outputs(answer, self.reference)
        return answers[0]  # type: ignore[no-any-return]

    def run_slice(self, slice_s: float) -> int:
        import ray

        return sum(ray.get([a.loop.remote(self._key, slice_s) for a in self._session.actors]))

    def cpu_time(self) -> float:
        return sum(_process_cpu_s(pid) for pid in self._session.pids(self.backend))

    def teardown(self) -> None:
        if not self._deployed:
            return
        with contextlib.suppress(Exception):
            import ray
            from ray import serve

            ray.get([a.remove.remote(self._key) for a in self._session.actors], timeout=60)
            serve.delete(f"{_SERVE_APP}-{self.backend}")


class ServeGrpcPath(_ServePath):
    """The Serve replica calls Triton with ``tritonclient.grpc.aio``."""

    name = "serve-grpc"
    label = "Serve replica, plain gRPC"
    backend = "grpc"


class ServeShmPath(_ServePath):
    """The Serve replica calls Triton through ``ShmModel`` (the node's shared slots)."""

    name = "serve-shm"
    label = "Serve replica, ShmModel"
    backend = "shm"
    uses_node_actor = True


class ServeInProcessPath(_ServePath):
    """The Serve replica owns a ``TritonSHMClient`` (upper bound of shared memory)."""

    name = "serve-inproc"
    label = "Serve replica, own TritonSHMClient"
    backend = "inproc"


#: The case the Ray Data job runs on, and its size in batches.
DATA_CASE = "classifier"
DATA_JOB_BATCHES = 64


class _DataPath(RayPath):
    """The same Ray Data job, ``map_batches`` with one predictor or another: every batch is
    the case's request; ``ray_callers`` predictor actors. A slice is one whole job."""

    def setup(self) -> None:
        if self.case.name != DATA_CASE:
            raise SkipPath(f"the Ray Data job runs on the {DATA_CASE} case")
        super().setup()

    def _predictor(self) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError

    def _job(self, batches: int) -> Any:
        import ray

        inputs_ref = ray.put(dict(self.inputs))

        def source(ids: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            rows = len(ids["id"])
            return {name: array[:rows] for name, array in ray.get(inputs_ref).items()}

        size = self.case.batch_size
        predictor, kwargs = self._predictor()
        return (
            ray.data.range(batches * size, override_num_blocks=batches)
            .map_batches(source, batch_size=size, batch_format="numpy")
            .map_batches(
                predictor,
                fn_constructor_kwargs=kwargs,
                batch_size=size,
                batch_format="numpy",
                concurrency=self._session.callers,
                num_cpus=0,
            )
        )

    def run_once(self) -> Mapping[str, np.ndarray]:
        return dict(self._job(1).take_batch(self.case.batch_size, batch_format="numpy"))

    def run_slice(self, slice_s: float) -> int:
        rows = sum(len(b[next(iter(b))]) for b in self._job(DATA_JOB_BATCHES).iter_batches())
        return rows // self.case.batch_size

    def teardown(self) -> None:
        """Nothing to undo: each job's predictor actors end with the job."""


class DataGrpcPath(_DataPath):
    """Ray Data with a predictor calling Triton over plain gRPC."""

    name = "data-grpc"
    label = "Ray Data, plain gRPC predictor"

    def _predictor(self) -> tuple[Any, dict[str, Any]]:
        url, outputs = self.target.grpc_url, list(self.case.outputs)
        return _GrpcPredictor, {"url": url, "model": self.case.model, "outputs": outputs}


class DataShmPath(_DataPath):
    """Ray Data with ``ShmPredictor``."""

    name = "data-shm"
    label = "Ray Data, ShmPredictor"
    uses_node_actor = True

    def _predictor(self) -> tuple[Any, dict[str, Any]]:
        from ray_triton_shm.ray import ShmPredictor

        options = {"slots": max(8, self._session.callers)}
        return ShmPredictor, {"model_name": self.case.model, "actor_options": options}


class DataNoopPath(_DataPath):
    """Ray Data with a predictor that calls nothing (the ceiling of the job itself)."""

    name = "data-noop"
    label = "Ray Data, no-op predictor (ceiling)"

    def _predictor(self) -> tuple[Any, dict[str, Any]]:
        return _NoopPredictor, {"outputs": dict(self.reference)}


#: The Ray paths, in table order (their names are ``_config.RAY_PATHS``).
PATHS: tuple[type[RayPath], ...] = (
    ServeGrpcPath,
    ServeShmPath,
    ServeInProcessPath,
    DataGrpcPath,
    DataShmPath,
    DataNoopPath,
)
