"""The node under load (``bench --ray``): many caller processes on few node slots.

Caller actors (one process each) loop on one request at a time for ``duration_s``, all starting
at the same instant, on one of two choices:

* ``shm-model``: :class:`~ray_triton_shm.ray.ShmModel`, the model given ``slots`` node slots:
  ``callers`` > ``slots`` is backpressure at work, slots changing hands between processes;
* ``grpc``: plain ``tritonclient.grpc``, one client per caller, no limit.

Each run reports requests/s, the p50 and p99 latency of a request (as its caller saw it),
fairness (the fewest requests a caller completed over the mean) and, for ``shm-model``, the
p99 wait for a slot (from the region's header, among requests that waited). Every
``shm-model`` run starts a fresh node actor, so that its slots and counters are its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._paths import grpc_request

__all__ = ["LOAD_CASES", "LoadRun", "run_node_load"]

#: The cases the node is loaded with, and the (path, callers) runs of each.
LOAD_CASES = ("identity", "classifier-1", "classifier")
RUNS = (("shm-model", 4), ("shm-model", 16), ("grpc", 16))
#: Node slots given to the model on the ``shm-model`` runs.
SLOTS = 4


@dataclasses.dataclass(frozen=True)
class LoadRun:
    """One run: ``callers`` processes on ``path`` for one model.

    Attributes:
        model: The case.
        path: ``"shm-model"`` or ``"grpc"``.
        callers: Caller processes.
        slots: Node slots of the model (``None`` for gRPC: no limit).
        requests_per_s: Requests completed per second, over every caller.
        p50_ms: Median latency of a request.
        p99_ms: 99th percentile latency of a request.
        fairness: The fewest requests a caller completed over the mean.
        wait_p99_ms: 99th percentile wait for a slot, among requests that waited.
    """

    model: str
    path: str
    callers: int
    slots: int | None
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    fairness: float
    wait_p99_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return dataclasses.asdict(self)


class _LoadCaller:
    """A Ray actor that sends requests back to back, one at a time."""

    def run(
        self,
        path: str,
        case: ModelCase,
        inputs: Mapping[str, np.ndarray],
        url: str,
        start_at: float,
        duration_s: float,
    ) -> np.ndarray:
        """Requests from ``start_at`` (``time.time()``) for ``duration_s``; returns the
        latency of each, in seconds."""
        call, close = self._connect(path, case, inputs, url)
        try:
            call()  # binds, connects, warms up
            time.sleep(max(0.0, start_at - time.time()))
            latencies = []
            deadline = time.perf_counter() + duration_s
            while (now := time.perf_counter()) < deadline:
                call()
                latencies.append(time.perf_counter() - now)
            return np.array(latencies)
        finally:
            close()

    @staticmethod
    def _connect(
        path: str, case: ModelCase, inputs: Mapping[str, np.ndarray], url: str
    ) -> tuple[Callable[[], Any], Callable[[], None]]:
        if path == "shm-model":
            from ray_triton_shm.ray import ShmModel

            model = ShmModel(
                case.model,
                max_shapes=case.max_shapes,
                pool_size=SLOTS,
                actor_options={"slots": SLOTS},
            )
            return (lambda: model.infer(inputs)), model.close
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(url)
        infer_inputs, outputs = grpc_request(inputs, case.outputs)
        return (lambda: client.infer(case.model, infer_inputs, outputs=outputs)), client.close


def _end_node_actor() -> None:
    """Shuts the node actor down and kills it, so the next run starts a fresh one."""
    import ray

    from ray_triton_shm.ray._actor import NAMESPACE, actor_name

    name = actor_name(ray.get_runtime_context().get_node_id())
    with contextlib.suppress(ValueError):
        actor = ray.get_actor(name, namespace=NAMESPACE)
        with contextlib.suppress(Exception):
            ray.get(actor.shutdown.remote(), timeout=60)
        ray.kill(actor)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # its name is free once it is gone
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                return
            time.sleep(0.1)


def _wait_p99_ms() -> float | None:
    import ray

    from ray_triton_shm.ray import get_node_actor

    stats = ray.get(get_node_actor().stats.remote())
    waited = [m for m in stats.models.values() if m["waits"]]
    return max(m["wait_p99_us"] for m in waited) / 1000 if waited else None


def run_node_load(
    cases: list[ModelCase], url: str, *, duration_s: float, step: Callable[..., None]
) -> list[LoadRun]:
    """Loads the node with each run of :data:`RUNS` on each case of :data:`LOAD_CASES` in
    ``cases`` (Ray must be running); returns every run."""
    import ray

    cases = [case for case in cases if case.name in LOAD_CASES]
    if not cases:
        return []
    most = max(callers for _, callers in RUNS)
    caller_class: Any = ray.remote(num_cpus=0)(_LoadCaller)
    callers = [caller_class.remote() for _ in range(most)]
    runs: list[LoadRun] = []
    try:
        for case in cases:
            inputs = ray.put(case.make_inputs())
            for path, count in RUNS:
                step(description=f"node load: {case.name}, {path}, {count} callers")
                if path == "shm-model":
                    _end_node_actor()
                start_at = time.time() + 2.0 + 0.1 * count  # every caller bound and warm
                latencies = ray.get(
                    [
                        c.run.remote(path, case, inputs, url, start_at, duration_s)
                        for c in callers[:count]
                    ]
                )
                done = np.array([len(each) for each in latencies])
                every = np.concatenate(latencies) * 1000
                runs.append(
                    LoadRun(
                        model=case.name,
                        path=path,
                        callers=count,
                        slots=SLOTS if path == "shm-model" else None,
                        requests_per_s=float(done.sum() / duration_s),
                        p50_ms=float(np.percentile(every, 50)),
                        p99_ms=float(np.percentile(every, 99)),
                        fairness=float(done.min() / done.mean()),
                        wait_p99_ms=_wait_p99_ms() if path == "shm-model" else None,
                    )
                )
        _end_node_actor()
    finally:
        for caller in callers:
            ray.kill(caller)
    return runs


def load_ratios(runs: list[LoadRun]) -> dict[str, dict[str, float]]:
    """Per case: ``16_vs_4`` (16 callers' requests/s on the 4 slots over 4 callers') and
    ``shm_vs_grpc`` (16 callers on the 4 slots over 16 plain gRPC callers)."""
    by_key = {(r.model, r.path, r.callers): r.requests_per_s for r in runs}
    ratios: dict[str, dict[str, float]] = {}
    for model in dict.fromkeys(r.model for r in runs):
        many = by_key.get((model, "shm-model", 16))
        few = by_key.get((model, "shm-model", 4))
        grpc = by_key.get((model, "grpc", 16))
        if many and few and grpc:
            ratios[model] = {"16_vs_4": many / few, "shm_vs_grpc": many / grpc}
    return ratios
