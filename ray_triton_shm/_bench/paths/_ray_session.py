"""The bench's private local Ray (:class:`RayBenchSession`), and what every Ray path shares
(:class:`RayPath`): the Ray paths themselves are in :mod:`._ray` and :mod:`._http`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from ray_triton_shm._bench._config import DATA_JOB_BATCHES
from ray_triton_shm._bench.paths._base import BenchPath, BenchTarget, SkipPath
from ray_triton_shm._bench.paths._clients import Backend

try:
    import ray

    from ray_triton_shm.ray import URL_ENV_VAR
    from ray_triton_shm.ray._actor import find_node_actor
    from ray_triton_shm.ray._ray_internals import quiet_raylet_messages
except ImportError as exc:  # without the ray extra: the session says so, and the paths skip
    _NO_RAY: ImportError | None = exc
else:
    _NO_RAY = None

__all__ = ["RECONNECT_ENV_VAR", "SERVE_APP", "RayBenchSession", "RayPath", "example_app_root"]
__all__ += ["end_handle", "process_cpu_s", "reconnect_timeout_s"]

#: The prefix of the names of the Serve apps the bench runs.
SERVE_APP = "ray-triton-shm-bench"
#: The bench's ``--reconnect-timeout-s``, for the Ray paths' processes (set by the session,
#: as ``$RAY_TRITON_SHM_URL`` is, before ``ray.init``).
RECONNECT_ENV_VAR = "RAY_TRITON_SHM_BENCH_RECONNECT_TIMEOUT_S"


def reconnect_timeout_s() -> float:
    """How long the Ray paths' requests and their node actor's registrations wait for an
    unreachable Triton: the bench's ``--reconnect-timeout-s`` in its Ray's processes."""
    from ray_triton_shm._defaults import DEFAULT_RECONNECT_TIMEOUT_S

    return float(os.environ.get(RECONNECT_ENV_VAR, DEFAULT_RECONNECT_TIMEOUT_S))


def process_cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` ran so far, over all its threads, to the nanosecond (from
    ``/proc/<pid>/task/*/schedstat``; clock-tick counts are too coarse for short slices)."""
    if pid == os.getpid():
        return time.process_time()
    total_ns = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stat:
                    total_ns += int(stat.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
    return total_ns / 1e9


def end_handle(handle: Any) -> None:
    """Stops a Serve handle's router (best effort: Serve may be gone already)."""
    with contextlib.suppress(Exception):
        handle.shutdown()


def example_app_root() -> Path | None:
    """The directory holding ``deployments/classifier.py`` (a checkout of this repository),
    or ``None``: an installed package comes without the example app."""
    here = Path(__file__).resolve().parents[3]
    for root in (here, Path.cwd()):
        if (root / "deployments" / "classifier.py").is_file():
            return root
    return None


class RayBenchSession:
    """A private local Ray for the benchmark, quiet: started on entry, everything it made
    removed on exit (:attr:`error`: why it could not start). ``$RAY_TRITON_SHM_URL`` is the
    ``target``'s gRPC URL meanwhile, set before ``ray.init`` for Ray's processes to inherit.
    A Ray Data slice is a job of ``data_job_batches`` batches."""

    def __init__(self, target: BenchTarget, *, data_job_batches: int = DATA_JOB_BATCHES) -> None:
        self.target = target
        self.data_job_batches = data_job_batches
        self.error: BaseException | None = None
        self._actors: dict[type, list[Any]] = {}
        #: What the paths keep for the session's life (Serve apps they ran, by a key of theirs).
        self.apps: dict[str, Any] = {}
        self._undo: list[Callable[[], Any]] = []
        #: The port of Serve's HTTP proxy (once Serve runs).
        self.http_port = 0
        #: Whether the session started Ray itself (and so ends everything in it at once).
        self._owns_ray = False

    def __enter__(self) -> RayBenchSession:
        try:
            if _NO_RAY is not None:
                raise SkipPath(
                    f"Ray is not installed ({_NO_RAY}); pip install 'ray-triton-shm[ray]'"
                )
            import ray.data

            self._set_env(URL_ENV_VAR, self.target.grpc_url)
            self._set_env(RECONNECT_ENV_VAR, str(self.target.reconnect_timeout_s))
            self._example_app_on_path()
            if not ray.is_initialized():
                # The callers, replica and node actor ask for no CPU.
                ray.init(
                    address="local",
                    num_cpus=os.cpu_count() or 2,
                    include_dashboard=False,
                    logging_level=logging.ERROR,
                    log_to_driver=False,
                )
                self._undo.append(ray.shutdown)
                self._owns_ray = True
            context = ray.data.DataContext.get_current()
            for field in ("enable_progress_bars", "print_on_execution_start"):
                self._set(context, field, False)
            self._set_level("ray.data", logging.CRITICAL)  # its errors: the bench's
            # The raylet's warnings ("N worker processes have been started") stay out of
            # the bench's output.
            self._undo.append(quiet_raylet_messages())
        except Exception as exc:
            self.error = exc
        return self

    def _set(self, obj: object, name: str, value: object) -> None:
        """``obj.name`` is ``value`` for the session's life: a process that goes on after the
        bench (a driver of its own on that Ray) gets it back as it was."""
        before = getattr(obj, name)
        self._undo.append(lambda: setattr(obj, name, before))
        setattr(obj, name, value)

    def _set_level(self, logger: str, level: int) -> None:
        """The level of ``logger`` is ``level`` for the session's life."""
        log = logging.getLogger(logger)
        before = log.level
        self._undo.append(lambda: log.setLevel(before))
        log.setLevel(level)

    def _set_env(self, name: str, value: str) -> None:
        """``$name`` is ``value`` for the session's life (Ray's processes inherit it)."""
        before = os.environ.get(name)
        # Undone in reverse: the value set here goes, then the one before comes back.
        self._undo.append(lambda: os.environ.update({name: before} if before else {}))
        self._undo.append(lambda: os.environ.pop(name, None))
        os.environ[name] = value

    def check(self) -> None:
        """Raises why the session is unusable, if it is."""
        if isinstance(self.error, SkipPath):
            raise self.error
        if self.error is not None:
            raise RuntimeError(f"Ray could not be started: {self.error}") from self.error

    def actors(self, cls: type, count: int) -> list[Any]:
        """``count`` actors of ``cls`` (no CPU, two calls at once): the same ones for every
        path, more started when needed, killed when the session ends."""
        mine = self._actors.setdefault(cls, [])
        remote = ray.remote(num_cpus=0, max_concurrency=2)(cls)  # type: ignore[call-overload]
        mine += [remote.remote() for _ in range(count - len(mine))]
        return mine[:count]

    def _example_app_on_path(self) -> None:
        """``deployments`` importable here and in Ray's workers (they inherit the variable)."""
        import sys

        root = example_app_root()
        if root is None:
            return
        before = os.environ.get("PYTHONPATH")
        self._undo.append(
            lambda: (
                os.environ.update({"PYTHONPATH": before})
                if before is not None
                else os.environ.pop("PYTHONPATH", None)
            )
        )
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [before])])
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
            self._undo.append(lambda: sys.path.remove(str(root)))

    def serve(self) -> None:
        """Starts Serve once, with its HTTP proxy on a free local port."""
        from ray import serve

        if self.http_port:
            return
        self._set_level("ray.serve", logging.WARNING)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        serve.start(
            proxy_location="HeadOnly",
            http_options={"host": "127.0.0.1", "port": port},
            logging_config={"log_level": "WARNING"},
        )
        if not self._owns_ray:  # else the Ray it ends takes Serve with it, seconds sooner
            self._undo.append(serve.shutdown)
        self._undo.append(self._end_handles)
        self.http_port = port

    def _end_handles(self) -> None:
        """Stops the routers of the Serve handles the paths kept: they would go on asking
        Serve's controller for changes after Ray ends, and start a Ray of their own to ask."""
        while self.apps:
            _, kept = self.apps.popitem()
            end_handle(kept[1] if isinstance(kept, tuple) else kept)

    def node_actor(self) -> Any:
        """This node's actor (``ValueError`` if there is none)."""
        actor = find_node_actor()
        if actor is None:
            raise ValueError("this node has no node actor")
        return actor

    def end_node_actor(self) -> None:
        """Shuts the node actor down and kills it, so that the next run starts a fresh one."""
        with contextlib.suppress(ValueError):  # there is none (any more)
            actor = self.node_actor()
            with contextlib.suppress(Exception):
                ray.get(actor.shutdown.remote(), timeout=60)
            ray.kill(actor)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # its name is free once it is gone
                self.node_actor()
                time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        for actor in (actor for actors in self._actors.values() for actor in actors):
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self._undo:
            with contextlib.suppress(Exception):
                self.end_node_actor()
        for undo in reversed(self._undo):
            with contextlib.suppress(Exception):
                undo()


class RayPath(BenchPath):
    """Shared by the Ray paths: their ``backend`` and its argument (:meth:`_arg`), the
    session, and the node actor's CPU when the path uses it."""

    #: What the path's requests go through to Triton, in the end.
    backend: ClassVar[Backend]
    _actor_pid: int | None = None

    def _arg(self) -> Any:
        return self.target.grpc_url

    def setup(self) -> None:
        self.session.check()

    def _node_stats(self) -> Any:
        return ray.get(self.session.node_actor().stats.remote(), timeout=60)

    def _node_transport(self) -> dict[str, Any]:
        """How the model's pool on the node reaches Triton (``transport``: ``"shm"``, or
        ``"inline"`` by value) and why (``transport_reason``), from the node actor."""
        model = self._node_stats().models.get(self.case.model, {})
        return {key: model[key] for key in ("transport", "transport_reason") if key in model}

    def side_cpu_time(self) -> float | None:
        if not self.uses_node_actor:
            return None
        self._actor_pid = self._actor_pid or self._node_stats().pid
        return process_cpu_s(self._actor_pid)
