"""``serve-http-*``: the example app (``deployments/classifier.py``) behind Serve's HTTP proxy.

The same app class three ways, only its model differing (``backend``): ``ShmModel`` as it
ships, plain gRPC, and a no-op model (zeros at once: the app's own ceiling). Each is an app of
its own with :data:`REPLICAS` replicas, behind the session's one proxy. The callers are HTTP
clients in the bench's own process (asyncio, one keep-alive connection each) POSTing ``.npy``
bodies of the case's images: one body of :data:`BODIES`, each of other images, so an answer
mixed up with another request's shows. Every answer's top-k classes are checked against those of
Triton's plain gRPC answer for its body (of zeros, for the no-op). The replicas' stage timings
(:meth:`ClassifierDeployment.stage_times`) over the run's slices say where a request's time
went in the replica, and what is left is the proxy's and the hops'.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ray_triton_shm._bench._config import APP_CASES, REPLICAS
from ray_triton_shm._bench.paths._base import SkipPath
from ray_triton_shm._bench.paths._clients import Backend, infer
from ray_triton_shm._bench.paths._ray_session import (
    SERVE_APP,
    RayBenchSession,
    RayPath,
    end_handle,
    example_app_root,
    process_cpu_s,
)
from ray_triton_shm._wire._plain_client import tritonclient_for
from ray_triton_shm.local._process import proc_stats

__all__ = ["APP_CASES", "BODIES", "PATHS", "REPLICAS", "app_stage_times", "deploy_app", "drop_app"]

#: Distinct request bodies per run.
BODIES = 4
#: How often a deleted app's replica checks whether it is idle, to end (Serve's default: 2 s).
_IDLE_CHECK_S = 0.1
#: The top-k the app answers (its default).
TOP_K = 5


def _proxy_pids() -> list[int]:
    """Serve's HTTP proxies on this machine (Ray titles the process ``ray::ProxyActor``)."""
    pids = []
    for pid, _ in proc_stats():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ProxyActor"):
                pids.append(pid)
    return pids


def top_classes(scores: np.ndarray, k: int = TOP_K) -> list[list[int]]:
    """The app's answer's classes for ``scores`` (``(images, classes)``), best first."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].tolist()  # type: ignore[no-any-return]


class HttpError(RuntimeError):
    """The app answered with an error status."""


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    """Sends one prepared HTTP/1.1 request on a keep-alive connection; its status and body."""
    writer.write(request)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    chunks = []
    while True:  # Transfer-Encoding: chunked
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        chunks.append(await reader.readexactly(size + 2))
        if size == 0:
            return status, b"".join(c[:-2] for c in chunks)


class _ServeHttpPath(RayPath):
    """The example app with its model on ``backend``, fed by ``concurrency`` HTTP clients."""

    @property
    def slice_factor(self) -> float:  # type: ignore[override]
        # Under load a request takes hundreds of ms: one --slice-s would be mostly its ends.
        return 3.0 if self.concurrency > 1 else 1.0

    def setup(self) -> None:
        if self.case.name not in APP_CASES:
            raise SkipPath(
                f"the example HTTP app is made for the example {' and '.join(APP_CASES)} cases "
                "only; for your model, time your own Serve app on ShmModel against plain gRPC"
            )
        if example_app_root() is None:
            raise SkipPath("the example app (deployments/) is in the repository, not the package")
        super().setup()
        self._route, self._handle = deploy_app(self.session, self.backend)
        host, port = "127.0.0.1", self.session.http_port
        self._address = host, port
        self._requests, self._expected = [], []
        client = tritonclient_for(self.target.grpc_url)
        try:
            for index in range(BODIES):
                images = self.case.make_inputs(seed=zlib.crc32(f"http-{index}".encode()))
                if index == 0:
                    images = dict(self.inputs)
                if self.backend == Backend.NOOP:
                    scores = np.zeros((self.case.batch_size, 1000), np.float32)
                else:
                    scores = infer(client, self.case, images)["OUTPUT0"]
                self._expected.append(top_classes(scores))
                body = io.BytesIO()
                np.save(body, images["INPUT0"], allow_pickle=False)
                head = (
                    f"POST {self._route} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    f"Content-Type: application/x-npy\r\n"
                    f"Content-Length: {body.getbuffer().nbytes}\r\n\r\n"
                )
                self._requests.append(head.encode() + body.getvalue())
        finally:
            client.close()
        self._wrong = self._checked = self._sent = 0
        self._times: dict[str, Any] = {}
        self._proxies = _proxy_pids()
        self._cpu: dict[str, float] = {}
        self._wall_s = 0.0
        self._stages: dict[str, Any] = {}

    async def _clients(self, count: int, duration_s: float | None) -> list[list[float]]:
        """``count`` clients sending requests back to back for ``duration_s`` (``None``: one
        each); every answer checked. Each client's latencies."""
        connections = [await asyncio.open_connection(*self._address) for _ in range(count)]
        try:
            deadline = time.perf_counter() + (duration_s or 0.0)
            runs = [self._client(i, *c, deadline) for i, c in enumerate(connections)]
            return list(await asyncio.gather(*runs))
        finally:
            for _, writer in connections:
                writer.close()

    async def _client(
        self,
        index: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        deadline: float,
    ) -> list[float]:
        latencies, clock = [], time.perf_counter
        while True:
            body = index % len(self._requests)
            sent = clock()
            status, answer = await _exchange(reader, writer, self._requests[body])
            done = clock()
            latencies.append(done - sent)
            if status != 200:
                raise HttpError(f"HTTP {status} from the app: {answer[:300]!r}")
            classes = [[c["class"] for c in image] for image in json.loads(answer)["top_k"]]
            self._checked += 1
            self._wrong += classes != self._expected[body]
            index += 1
            if done >= deadline:
                return latencies

    def run_once(self) -> Mapping[str, np.ndarray]:
        """One request from every client; each answer is checked here (the app answers top-k
        classes, not the model's outputs), and the reference stands for them."""
        wrong = self._wrong
        asyncio.run(self._clients(self.concurrency, None))
        if self._wrong != wrong:
            raise AssertionError("the app answered other classes than Triton's for the images")
        self._times = app_stage_times(self._handle)  # for the replicas' pids
        return self.reference

    def _cpu_now(self) -> dict[str, float]:
        """CPU seconds so far of the clients (this process), the proxy, the replicas and the
        embedded Triton (its Python-backend stubs too)."""
        triton = self.target.server_pid
        group = [pid for pid, f in proc_stats() if int(f[2]) == triton] if triton else []
        return {
            "clients": time.process_time(),
            "proxy": sum(map(process_cpu_s, self._proxies)),
            "replicas": sum(map(process_cpu_s, self._times.get("pids", []))),
            **({"triton": sum(map(process_cpu_s, group))} if group else {}),
        }

    def run_slice(self, slice_s: float) -> tuple[list[np.ndarray], float]:
        # The app also serves this backend's run at the other load: only this slice counts.
        app_stage_times(self._handle)
        before, start = self._cpu_now(), time.perf_counter()
        latencies = asyncio.run(self._clients(self.concurrency, slice_s))
        wall_s = time.perf_counter() - start
        stages = app_stage_times(self._handle)
        self._stages = merge_stage_times([self._stages, stages]) if self._stages else stages
        for name, spent in self._cpu_now().items():
            self._cpu[name] = self._cpu.get(name, 0.0) + spent - before.get(name, spent)
        self._sent += sum(map(len, latencies))
        self._wall_s += wall_s
        return [np.array(c) for c in latencies], wall_s

    def cpu_time(self) -> float:
        pids = self._times.get("pids", [])
        return time.process_time() + sum(map(process_cpu_s, pids))

    def stats(self) -> dict[str, Any]:
        times = self._stages
        requests = times["stages"].get("request", {}).get("calls", 0)
        per_request = {stage: 1e3 * t["seconds"] / requests for stage, t in times["stages"].items()}
        batches = times["stages"].get("model", {}).get("calls", 0)
        return {
            "wrong_answers": self._wrong,
            "answers_checked": self._checked,
            "replica_ms": per_request,
            "images_per_batch": times["images"] / batches if batches else None,
            "cpu_ms": {name: 1e3 * s / max(1, self._sent) for name, s in self._cpu.items()},
            "proxy_busy": self._cpu.get("proxy", 0.0) / self._wall_s if self._wall_s else None,
            **(self._node_transport() if self.uses_node_actor else {}),
        }

    def teardown(self) -> None:
        # Idle replicas would weigh on the runs after these, on a small machine.
        drop_app(self.session, self.backend)


class ServeHttpGrpcPath(_ServeHttpPath):
    """The example app on plain gRPC (``tritonclient.grpc.aio``)."""

    name, label = "serve-http-grpc", "the example app over HTTP, plain gRPC"
    backend = Backend.GRPC


class ServeHttpShmPath(_ServeHttpPath):
    """The example app as it ships (``ShmModel``)."""

    name, label = "serve-http-shm", "the example app over HTTP, ShmModel"
    backend, uses_node_actor = Backend.SHM_MODEL, True


class ServeHttpNoopPath(_ServeHttpPath):
    """The example app with a no-op model: Serve's own ceiling for it."""

    name, label = "serve-http-noop", "the example app over HTTP, no-op model"
    backend = Backend.NOOP


def merge_stage_times(answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of :meth:`stage_times` answers (each since its replica's last reset), or of
    sums of them."""
    pids = {pid for a in answers for pid in a.get("pids", [a.get("pid")]) if pid}
    merged: dict[str, Any] = {"images": 0, "stages": {}, "pids": sorted(pids)}
    for answer in answers:
        merged["images"] += answer["images"]
        for stage, t in answer["stages"].items():
            mine = merged["stages"].setdefault(stage, {"seconds": 0.0, "calls": 0})
            mine["seconds"] += t["seconds"]
            mine["calls"] += t["calls"]
    return merged


def deploy_app(session: RayBenchSession, backend: Backend) -> tuple[str, Any]:
    """The route and handle of the example app (``deployments/classifier.py``) with its
    model ``backend``, as it ships but for its replicas (``REPLICAS``, asking for no CPU
    so that the three fit beside each other, and ending as soon as they are idle: nothing is
    in flight when the bench deletes them), run on first use."""
    import importlib

    from ray import serve

    session.serve()
    key = f"http-{backend.value}"
    if key not in session.apps:
        example = importlib.import_module("deployments.classifier")
        app = example.ClassifierDeployment.options(
            name=f"classifier-{backend.value}",
            num_replicas=REPLICAS,
            ray_actor_options={"num_cpus": 0},
            graceful_shutdown_wait_loop_s=_IDLE_CHECK_S,
        ).bind(backend=backend.value, url=session.target.grpc_url)
        route = f"/classify-{backend.value}"
        handle = serve.run(app, name=f"{SERVE_APP}-app-{backend.value}", route_prefix=route)
        session.apps[key] = route, handle
    return session.apps[key]


def drop_app(session: RayBenchSession, backend: Backend) -> None:
    """Deletes the example app with ``backend``, if it runs."""
    from ray import serve

    kept = session.apps.pop(f"http-{backend.value}", None)
    if kept is not None:
        end_handle(kept[1])
        with contextlib.suppress(Exception):
            serve.delete(f"{SERVE_APP}-app-{backend.value}")


def app_stage_times(handle: Any) -> dict[str, Any]:
    """Every replica's :meth:`stage_times` since the last call, summed (and reset)."""
    answers, replicas = [], set()
    for _ in range(100):  # the handle picks a replica: ask until each has answered
        answers.append(handle.stage_times.remote(reset=True).result())
        replicas.add(answers[-1]["replica"])
        if len(replicas) >= REPLICAS:
            break
    return merge_stage_times(answers)


PATHS: tuple[type[RayPath], ...] = (ServeHttpGrpcPath, ServeHttpShmPath, ServeHttpNoopPath)
