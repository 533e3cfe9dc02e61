"""The Ray paths of ``bench --ray``: Ray Serve over plain gRPC against the node actor.

Three paths, each driven by the same number of concurrent callers (Ray actors, default 4),
so every one of them sees the same client-side parallelism:

* ``serve-grpc``: a Ray Serve deployment whose replica calls Triton with
  ``tritonclient.grpc.aio``; callers go through a ``DeploymentHandle`` (arrays travel through
  Ray's object store to the replica, then through gRPC to Triton). What Ray users do today.
* ``actor-by-value``: ``ShmModel(..., zero_copy=False)``: arrays through Ray's object store
  to the node actor, which writes them into shared memory.
* ``actor-zero-copy``: ``ShmModel(...)``: each caller writes into a slot of its own and makes
  one small Ray call.

Ray is started once per benchmark (:class:`RayBenchSession`, entered by the runner through
:attr:`BenchPath.session_factory`) with ``$RAY_TRITON_SHM_URL`` set to the server being benchmarked,
and everything it created (callers, Serve, the node actor and its regions) is gone when the
benchmark returns. A request counts once per caller: a slice in which 4 callers each finish 10
requests counts 40. CPU time is that of every process doing client work: the driver, the
callers, and the Serve replica or the node actor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._paths import (
    BenchPath,
    BenchTarget,
    PathUnavailableError,
    register_path,
)

__all__ = [
    "ActorByValuePath",
    "ActorZeroCopyPath",
    "DEFAULT_RAY_CALLERS",
    "RAY_GROUP",
    "RAY_PATHS",
    "RayBenchSession",
    "ServeGrpcPath",
    "ray_session",
]

#: The registry group of the Ray paths (``bench --ray``).
RAY_GROUP = "ray"
#: Concurrent callers per Ray path unless ``--ray-callers`` says otherwise.
DEFAULT_RAY_CALLERS = 4
#: The Ray paths, in table order.
RAY_PATHS: tuple[str, ...] = ("serve-grpc", "actor-by-value", "actor-zero-copy")

_SERVE_APP = "ray-triton-shm-bench"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

#: The session the Ray paths of the running benchmark use (set by :func:`ray_session`).
_ACTIVE: RayBenchSession | None = None


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all threads); 0 when it is gone."""
    if pid == os.getpid():
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


# --------------------------------------------------------------------------------------
# What runs inside Ray
# --------------------------------------------------------------------------------------


class _Caller:
    """A Ray actor sending one request at a time through a path, in a closed loop.

    It holds one "target" per (path, model): the callable that sends one request, the
    request's inputs (resolved once from the object store) and how to close it.
    """

    def __init__(self) -> None:
        self._targets: dict[str, tuple[Any, Mapping[str, np.ndarray], Any]] = {}

    def pid(self) -> int:
        """This process's id."""
        return os.getpid()

    def add_model(self, key: str, shm_model: Any, inputs: Mapping[str, np.ndarray]) -> bool:
        """Sends requests of ``key`` through ``shm_model`` (a ``ShmModel``); binds it now.

        Returns:
            Whether calls in this process go zero-copy.
        """
        shm_model.infer(inputs)  # binds, registers, claims its slot
        self._targets[key] = (shm_model.infer, inputs, shm_model.close)
        return bool(shm_model.zero_copy)

    def add_serve(
        self,
        key: str,
        handle: Any,
        model: str,
        outputs: list[str],
        inputs: Mapping[str, np.ndarray],
    ) -> None:
        """Sends requests of ``key`` through a Serve ``DeploymentHandle``."""

        def call(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return handle.remote(model, arrays, outputs).result()

        call(inputs)
        self._targets[key] = (call, inputs, None)

    def once(self, key: str) -> dict[str, np.ndarray]:
        """One request; returns its outputs."""
        call, inputs, _ = self._targets[key]
        return dict(call(inputs))

    def loop(self, key: str, duration_s: float) -> int:
        """Requests back to back for ``duration_s`` (at least one); returns how many."""
        call, inputs, _ = self._targets[key]
        done = 0
        deadline = time.perf_counter() + duration_s
        while True:
            call(inputs)
            done += 1
            if time.perf_counter() >= deadline:
                return done

    def remove(self, key: str) -> None:
        """Forgets ``key``; closes its ``ShmModel`` (its claimed slot goes back)."""
        target = self._targets.pop(key, None)
        if target is not None and target[2] is not None:
            with contextlib.suppress(Exception):
                target[2]()


class _TritonGrpcReplica:
    """The Serve deployment of ``serve-grpc``: plain ``tritonclient.grpc.aio`` to Triton."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: Any = None

    def pid(self) -> int:
        """The replica's process id."""
        return os.getpid()

    async def __call__(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str]
    ) -> dict[str, np.ndarray]:
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import np_to_triton_dtype

        if self._client is None:  # made on the replica's event loop
            self._client = grpcclient.InferenceServerClient(self._url)
        infer_inputs = []
        for name, array in inputs.items():
            infer_input = grpcclient.InferInput(
                name, list(array.shape), np_to_triton_dtype(array.dtype)
            )
            infer_input.set_data_from_numpy(np.ascontiguousarray(array))
            infer_inputs.append(infer_input)
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
        result = await self._client.infer(model, infer_inputs, outputs=requested)
        return {name: result.as_numpy(name) for name in outputs}


# --------------------------------------------------------------------------------------
# The session: Ray, the callers, Serve and the node actor, once per benchmark
# --------------------------------------------------------------------------------------


class RayBenchSession:
    """Starts a private local Ray for the benchmark and removes everything at the end.

    Args:
        target: The server benchmarked; its gRPC URL goes to the node actor through
            ``$RAY_TRITON_SHM_URL`` (set before ``ray.init``, so Ray's processes inherit it).
        callers: Concurrent callers per path.
        num_cpus: CPUs Ray advertises (callers, replica and node actor ask for none).
    """

    def __init__(self, target: BenchTarget, *, callers: int, num_cpus: int | None = None) -> None:
        self.target = target
        self.callers = callers
        self.num_cpus = num_cpus or os.cpu_count() or 2
        self.error: BaseException | None = None
        self.actors: list[Any] = []
        self.caller_pids: list[int] = []
        self._serve_handle: Any = None
        self._replica_pid: int | None = None
        self._node_actor_pid: int | None = None
        self._started_ray = False
        self._old_url: str | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Starts Ray and the callers; on failure :attr:`error` says why (paths then fail)."""
        try:
            import ray
        except ImportError as exc:
            self.error = PathUnavailableError(
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
                    num_cpus=self.num_cpus,
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
            if isinstance(self.error, PathUnavailableError):
                raise self.error
            raise RuntimeError(f"Ray could not be started: {self.error}") from self.error

    def serve_handle(self) -> Any:
        """The ``DeploymentHandle`` of the ``serve-grpc`` replica (deployed on first use)."""
        if self._serve_handle is None:
            from ray import serve

            logging.getLogger("ray.serve").setLevel(logging.WARNING)
            serve.start(proxy_location="Disabled", logging_config={"log_level": "WARNING"})
            deployment = serve.deployment(
                _TritonGrpcReplica,
                name="triton-grpc",
                num_replicas=1,
                max_ongoing_requests=max(8, 2 * self.callers),
                ray_actor_options={"num_cpus": 0},
            )
            handle = serve.run(
                deployment.bind(self.target.grpc_url),  # type: ignore[attr-defined]
                name=_SERVE_APP,
                route_prefix=None,
            )
            self._replica_pid = handle.pid.remote().result()
            self._serve_handle = handle
        return self._serve_handle

    def note_node_actor(self) -> None:
        """Remembers the node actor's pid (for CPU accounting)."""
        if self._node_actor_pid is None:
            self._node_actor_pid = self.node_actor_stats().pid

    def node_actor(self) -> Any:
        """This node's actor (it exists once a caller bound a ``ShmModel``)."""
        import ray

        from ray_triton_shm.ray import NAMESPACE, actor_name

        node = ray.get_runtime_context().get_node_id()
        return ray.get_actor(actor_name(node), namespace=NAMESPACE)

    def node_actor_stats(self) -> Any:
        """The node actor's ``stats()``."""
        import ray

        return ray.get(self.node_actor().stats.remote(), timeout=60)

    def pids(self, kind: str) -> list[int]:
        """The processes doing client work for a path of ``kind`` (``"serve"``/``"actor"``)."""
        extra = self._replica_pid if kind == "serve" else self._node_actor_pid
        return [os.getpid(), *self.caller_pids, *([extra] if extra else [])]

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
                if self._serve_handle is not None:
                    from ray import serve

                    with contextlib.suppress(Exception):
                        serve.shutdown()
                    self._serve_handle = None
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


@contextlib.contextmanager
def ray_session(target: BenchTarget, config: Any) -> Iterator[RayBenchSession]:
    """The Ray session of one benchmark run (``config.ray_callers`` callers per path)."""
    global _ACTIVE
    session = RayBenchSession(target, callers=getattr(config, "ray_callers", DEFAULT_RAY_CALLERS))
    _ACTIVE = session
    try:
        session.start()
        yield session
    finally:
        _ACTIVE = None
        session.close()


# --------------------------------------------------------------------------------------
# The paths
# --------------------------------------------------------------------------------------


class _RayPath(BenchPath):
    """Shared by the Ray paths: every caller sends requests through the same target."""

    group = RAY_GROUP
    session_factory = staticmethod(ray_session)  # type: ignore[assignment]
    #: ``"serve"`` or ``"actor"``: which process besides the callers does client work.
    kind: ClassVar[str] = "actor"

    def __init__(
        self,
        *,
        target: BenchTarget,
        case: ModelCase,
        inputs: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray],
    ) -> None:
        super().__init__(target=target, case=case, inputs=inputs, reference=reference)
        self._session: RayBenchSession | None = None
        self._key = f"{self.name}:{case.model}"
        self._added = False

    def setup(self) -> None:
        session = _ACTIVE
        if session is None:
            raise PathUnavailableError("the Ray paths run only inside `bench --ray`")
        session.check()
        self._session = session
        import ray

        inputs_ref = ray.put(self.inputs)
        self._added = True
        answers = ray.get([self._add(actor, inputs_ref) for actor in session.actors])
        self._check_added(answers)

    def _add(self, actor: Any, inputs_ref: Any) -> Any:
        raise NotImplementedError

    def _check_added(self, answers: list[Any]) -> None:
        """Checks what the callers answered to ``_add``."""

    def run_once(self) -> Mapping[str, np.ndarray]:
        """One request from every caller at once; checks them all, returns the first."""
        import ray

        assert self._session is not None
        answers = ray.get([a.once.remote(self._key) for a in self._session.actors])
        from ray_triton_shm._bench._runner import _check_outputs

        for answer in answers[1:]:
            _check_outputs(answer, self.reference)
        return answers[0]

    def run_slice(self, slice_s: float) -> int:
        import ray

        assert self._session is not None
        return sum(ray.get([a.loop.remote(self._key, slice_s) for a in self._session.actors]))

    def cpu_time(self) -> float:
        assert self._session is not None
        return sum(_process_cpu_s(pid) for pid in self._session.pids(self.kind))

    def teardown(self) -> None:
        session = self._session
        if session is None or not self._added:
            return
        self._added = False
        with contextlib.suppress(Exception):
            import ray

            ray.get([a.remove.remote(self._key) for a in session.actors], timeout=60)


@register_path
class ServeGrpcPath(_RayPath):
    """Ray Serve: callers -> ``DeploymentHandle`` -> replica -> ``tritonclient.grpc.aio``."""

    name = "serve-grpc"
    label = "Ray Serve replica, plain gRPC"
    kind = "serve"

    def _add(self, actor: Any, inputs_ref: Any) -> Any:
        assert self._session is not None
        handle = self._session.serve_handle()
        return actor.add_serve.remote(
            self._key, handle, self.case.model, list(self.case.outputs), inputs_ref
        )


class _ShmModelPath(_RayPath):
    zero_copy: ClassVar[bool] = True

    def _add(self, actor: Any, inputs_ref: Any) -> Any:
        from ray_triton_shm.ray import ShmModel

        assert self._session is not None
        shm_model = ShmModel(
            self.case.model,
            max_batch_size=self.case.batch_size,
            max_shapes=dict(self.case.max_shapes) if self.case.max_shapes else None,
            url=self.target.grpc_url,
            zero_copy=self.zero_copy,
            local_slots=1,
            actor_options={"slots": max(8, self._session.callers)},
        )
        return actor.add_model.remote(self._key, shm_model, inputs_ref)

    def _check_added(self, answers: list[Any]) -> None:
        if self.zero_copy and not all(answers):
            raise RuntimeError(
                "the callers could not go zero-copy (no claimed slot, or the region could not "
                "be attached); they would silently pass arrays by value"
            )
        if not self.zero_copy and any(answers):
            raise RuntimeError("ShmModel(zero_copy=False) went zero-copy")

    def setup(self) -> None:
        super().setup()
        assert self._session is not None
        self._session.note_node_actor()


@register_path
class ActorByValuePath(_ShmModelPath):
    """``ShmModel(zero_copy=False)``: arrays through Ray's object store to the node actor."""

    name = "actor-by-value"
    label = "node actor, arrays by value"
    zero_copy = False


@register_path
class ActorZeroCopyPath(_ShmModelPath):
    """``ShmModel``: each caller writes its own claimed slot; one small Ray call."""

    name = "actor-zero-copy"
    label = "node actor, zero-copy slots"
    zero_copy = True
