"""What production does to the library: Triton restarts, tenants sharing ``/dev/shm`` from other
pid namespaces, and a ``/dev/shm`` too small for a pool.

The namespace tests run the tenants under ``unshare`` (root); they are skipped where it cannot
run, and the skip reason says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from _helpers import classifier_expected, need_unshare, our_regions, registered_on, wait_for
from ray import cloudpickle

from ray_triton_shm import (
    ServerUnreachableError,
    TritonServerError,
    TritonSHMClient,
)
from ray_triton_shm._slots._shm import DEAD, owner_state
from ray_triton_shm.local._server import LocalTritonServer
from ray_triton_shm.ray import ShmModel, get_node_actor

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SHM_DIR = Path("/dev/shm")
IDENTITY_SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}


@dataclass(frozen=True)
class Call:
    started: float  # time.time(), comparable across processes
    ended: float
    error: str | None


def _answered(calls: list[Call], since: float = 0.0) -> int:
    """The calls started after ``since`` that were answered."""
    return sum(c.error is None and c.started > since for c in calls)


# --------------------------------------------------------------------------------------
# Triton restarts
# --------------------------------------------------------------------------------------


class _CoreCallers:
    """Sync threads and an asyncio loop calling one client until stopped, one chunk and
    several, checking every answer."""

    def __init__(self, client: TritonSHMClient) -> None:
        self.client = client
        self.calls: list[Call] = []
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._sync, args=(rows,)) for rows in (1, 12)] + [
            threading.Thread(target=lambda: asyncio.run(self._async()))
        ]

    def __enter__(self) -> _CoreCallers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join()

    def _check(self, started: float, run: Callable[[np.ndarray], np.ndarray], x: Any) -> None:
        try:
            np.testing.assert_allclose(run(x), classifier_expected(x), rtol=1e-5)
            self.calls.append(Call(started, time.time(), None))
        except Exception as exc:  # recorded, and the test fails on it
            self.calls.append(Call(started, time.time(), repr(exc)))

    def _sync(self, rows: int) -> None:
        x = np.random.default_rng(rows).random((rows, 3, 224, 224), dtype=np.float32)
        while not self.stop.is_set():
            self._check(
                time.time(),
                lambda a: self.client.infer_shm("classifier", {"INPUT0": a})["OUTPUT0"],
                x,
            )

    async def _async(self) -> None:
        x = np.random.default_rng(7).random((9, 3, 224, 224), dtype=np.float32)
        while not self.stop.is_set():
            started = time.time()
            try:
                out = await self.client.infer_shm_async("classifier", {"INPUT0": x})
                np.testing.assert_allclose(out["OUTPUT0"], classifier_expected(x), rtol=1e-5)
                self.calls.append(Call(started, time.time(), None))
            except Exception as exc:
                self.calls.append(Call(started, time.time(), repr(exc)))


def _restart(server: LocalTritonServer, *, down_s: float) -> tuple[float, float]:
    """Stops the server, keeps it down, starts it on the same ports; returns when it went
    down and when it was ready again."""
    server.stop()
    down = time.time()
    time.sleep(down_s)  # the load itself: the outage's length
    server.start()  # returns once the server and all its models are ready
    return down, time.time()


def _check_restart_survived(calls: list[Call], down: float, ready: float) -> None:
    failed = [c for c in calls if c.error]
    after_ready = [c for c in calls if c.started > ready]
    # Triton was gone at ``down``: a request in flight then can only have succeeded by waiting.
    across = [c for c in calls if c.started < down < c.ended and not c.error]
    assert after_ready, "no request was made after Triton was ready again"
    assert [c for c in after_ready if c.error] == []
    assert failed == [], f"{len(failed)} of {len(calls)} requests failed: {failed[:3]}"
    near = [c for c in calls if down - 3 < c.ended and c.started < ready + 1]
    assert across, f"no request waited for Triton (down {down}, ready {ready}): {near[-5:]}"


def test_core_requests_wait_out_a_triton_restart(fresh_triton: LocalTritonServer) -> None:
    url = fresh_triton.grpc_url
    client = TritonSHMClient(url=url)
    client.register_shm_model("classifier", pool_size=2)
    with _CoreCallers(client) as callers:
        wait_for(lambda: _answered(callers.calls) >= 3, what="answers before the restart")
        down, ready = _restart(fresh_triton, down_s=1.0)
        wait_for(lambda: _answered(callers.calls, ready) >= 3, what="answers after the restart")
    _check_restart_survived(callers.calls, down, ready)
    assert client.shm_stats("classifier").in_use == 0
    client.close()
    assert registered_on(url) == set()
    assert our_regions(os.getpid()) == set()


def test_past_reconnect_timeout_a_clear_error_and_every_slot_free(
    fresh_triton: LocalTritonServer,
) -> None:
    url = fresh_triton.grpc_url
    x = np.random.default_rng(0).random((12, 3, 224, 224), dtype=np.float32)
    with TritonSHMClient(url=url, reconnect_timeout_s=1.0) as client:
        client.register_shm_model("classifier", pool_size=2)
        fresh_triton.stop()

        started = time.monotonic()
        with pytest.raises(ServerUnreachableError) as info:
            client.infer_shm("classifier", {"INPUT0": x})  # two chunks
        assert 1.0 <= time.monotonic() - started < 10.0
        error = info.value
        assert isinstance(error, ConnectionError) and isinstance(error, TritonServerError)
        assert error.url == url and error.waited_s >= 1.0 and error.model == "classifier"
        assert f"unreachable at {url}" in str(error) and "reconnect_timeout_s=1" in str(error)
        assert client.shm_stats("classifier").in_use == 0

        started = time.monotonic()
        with pytest.raises(ServerUnreachableError, match=r"reconnect_timeout_s=0\)"):
            client.infer_shm("classifier", {"INPUT0": x[:1]}, reconnect_timeout_s=0)
        assert time.monotonic() - started < 1.0

        with pytest.raises(ServerUnreachableError, match="waited 0.5 s"):
            asyncio.run(
                client.infer_shm_async("classifier", {"INPUT0": x}, reconnect_timeout_s=0.5)
            )
        assert client.shm_stats("classifier").in_use == 0

        before = our_regions(os.getpid())
        with (
            TritonSHMClient(url=url, reconnect_timeout_s=0.5) as other,
            pytest.raises(ServerUnreachableError),
        ):
            other.register_shm_model("identity", max_shapes=IDENTITY_SHAPES)
        assert our_regions(os.getpid()) == before  # nothing was created

        fresh_triton.start()
        # The channel may still be backing off (up to a second and its jitter) from the
        # failures above: a window of one second is too short to be sure of the next attempt.
        out = client.infer_shm("classifier", {"INPUT0": x}, reconnect_timeout_s=5.0)["OUTPUT0"]
        np.testing.assert_allclose(out, classifier_expected(x), rtol=1e-5)
    assert registered_on(url) == set()


@ray.remote(num_cpus=0, max_concurrency=2)
class _RayCaller:
    """Calls a ``ShmModel`` in a loop until told to stop; returns every call."""

    def __init__(self, url: str, zero_copy: bool) -> None:
        self.model = ShmModel("identity", url=url, max_shapes=IDENTITY_SHAPES, zero_copy=zero_copy)
        self.stopped = threading.Event()
        self.calls: list[Call] = []

    def zero_copy(self) -> bool:
        return self.model.zero_copy

    def answered(self, since: float = 0.0) -> int:
        """The calls so far started after ``since`` that were answered (while it runs)."""
        return _answered(self.calls, since)

    def run(self) -> list[Call]:
        calls = self.calls
        rng = np.random.default_rng(os.getpid())
        while not self.stopped.is_set():
            x = rng.standard_normal((int(rng.integers(1, 9)), 16)).astype(np.float32)
            started = time.time()
            try:
                np.testing.assert_array_equal(self.model.infer({"INPUT0": x})["OUTPUT0"], x)
                calls.append(Call(started, time.time(), None))
            except Exception as exc:
                calls.append(Call(started, time.time(), repr(exc)))
        self.model.close()
        return calls

    def stop(self) -> None:
        self.stopped.set()


def test_ray_callers_wait_out_a_triton_restart(ray_on_fresh_triton: LocalTritonServer) -> None:
    triton = ray_on_fresh_triton
    url = triton.grpc_url
    actor = get_node_actor(url=url, slots=4)
    callers = [_RayCaller.remote(url, zero_copy) for zero_copy in (True, False)]
    assert ray.get([c.zero_copy.remote() for c in callers]) == [True, False]
    runs = [c.run.remote() for c in callers]

    def answered(since: float = 0.0) -> int:  # by the caller that has fewer
        return min(ray.get([c.answered.remote(since) for c in callers]))

    wait_for(lambda: answered() >= 3, timeout_s=60, what="answers of both callers")
    down, ready = _restart(triton, down_s=1.0)
    wait_for(lambda: answered(ready) >= 3, timeout_s=60, what="answers of both after the restart")
    ray.get([c.stop.remote() for c in callers])
    direct, by_value = ray.get(runs, timeout=120)
    _check_restart_survived(direct, down, ready)
    _check_restart_survived(by_value, down, ready)

    stats = ray.get(actor.stats.remote())
    assert stats.models["identity"]["in_use"] == 0
    assert stats.models["identity"]["errors"] == 0
    ray.get(actor.shutdown.remote())
    ray.kill(actor)
    assert registered_on(url) == set()
    assert our_regions(stats.pid) == set()


# --------------------------------------------------------------------------------------
# Tenants in other pid namespaces
# --------------------------------------------------------------------------------------


PID_NAMESPACE = ("--pid", "--fork", "--mount-proc")

# Pid 1 of a tenant's namespace: runs ``skip`` short-lived children first, so that the tenant,
# its next child, gets the pid ``skip + 2``.
_INIT = (
    "import subprocess, sys\n"
    "for _ in range(int(sys.argv[1])): subprocess.call(['true'])\n"
    "sys.exit(subprocess.call(sys.argv[2:]))"
)

_TENANT = r"""
import json, os, signal, sys, time
import numpy as np
from ray_triton_shm import TritonSHMClient, reclaim_regions, region_status
from ray_triton_shm._client import registry_of

role, url, flag = sys.argv[1], sys.argv[2], sys.argv[3]
shapes = {"INPUT0": (16,), "OUTPUT0": (16,)}
if role == "worker":  # infers until the flag file appears
    client = TritonSHMClient(url=url)
    client.register_shm_model("identity", max_shapes=shapes)
    print(json.dumps({"region": registry_of(client).get("identity").region.name}), flush=True)
    calls, errors, first = 0, [], None
    while not os.path.exists(flag):
        x = np.random.standard_normal((4, 16)).astype(np.float32)
        try:
            assert (client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"] == x).all()
        except Exception as exc:
            errors.append(repr(exc))
        calls += 1
    client.close()
    print(json.dumps({"pid": os.getpid(), "calls": calls, "errors": errors}), flush=True)
elif role == "crasher":  # registers, then dies with no cleanup at all
    from multiprocessing import resource_tracker
    client = TritonSHMClient(url=url, crash_cleanup=False)
    client.register_shm_model("identity", max_shapes=shapes)
    # Python's resource tracker would unlink the region's names once its owner is gone.
    os.kill(resource_tracker._resource_tracker._pid, signal.SIGKILL)
    print(json.dumps({"region": registry_of(client).get("identity").region.name}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
else:  # the other tenant: registers (which reclaims), reclaims, reports, closes
    with TritonSHMClient(url=url) as client:
        client.register_shm_model("identity", max_shapes=shapes)
        report = reclaim_regions(url)
        owners = {r.name: r.owner for r in region_status(url).regions}
    print(json.dumps({"pid": os.getpid(), "unregistered": report.unregistered,
                      "unlinked": report.unlinked, "owners": owners}), flush=True)
"""


def _tenant(role: str, url: str, flag: Path, *, pid: int = 2) -> subprocess.Popen[str]:
    """Runs a tenant as ``pid`` of a pid namespace of its own."""
    command = [sys.executable, "-c", _TENANT, role, url, str(flag)]
    return subprocess.Popen(
        ["unshare", *PID_NAMESPACE, sys.executable, "-c", _INIT, str(pid - 2), *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _answered_by_triton(url: str, model: str) -> int:
    """The requests for ``model`` that the Triton at ``url`` answered."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as triton:
        stats = triton.get_inference_statistics(model, as_json=True)["model_stats"]
    return sum(int(s.get("inference_stats", {}).get("success", {}).get("count", 0)) for s in stats)


def test_a_tenant_in_another_pid_namespace_never_reclaims_live_regions(
    grpc_url: str, tmp_path: Path
) -> None:
    need_unshare(*PID_NAMESPACE)
    flag = tmp_path / "stop"
    crasher = _tenant("crasher", grpc_url, flag)
    crashed_region = json.loads(crasher.stdout.readline())["region"]  # type: ignore[union-attr]
    crasher.wait(timeout=30)
    assert crashed_region in registered_on(grpc_url)  # nothing cleaned up after it
    assert (SHM_DIR / crashed_region).exists()

    worker = _tenant("worker", grpc_url, flag)
    worker_region = json.loads(worker.stdout.readline())["region"]  # type: ignore[union-attr]
    # The crashed region is past the grace of a region being created: provably dead to anyone.
    wait_for(lambda: owner_state(crashed_region) == DEAD, what="the crashed region proven dead")
    other = _tenant("other", grpc_url, flag, pid=3)
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    report = json.loads(out)
    # The worker goes on inferring after the other tenant closed (Triton's only caller now).
    answered = _answered_by_triton(grpc_url, "identity")
    wait_for(
        lambda: _answered_by_triton(grpc_url, "identity") >= answered + 3,
        what="the worker's answers after the other tenant closed",
    )
    flag.touch()
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    result = json.loads(out.splitlines()[-1])

    # The worker is pid 2 of its namespace; in the other tenant's namespace pid 2 is gone.
    assert (result["pid"], report["pid"]) == (2, 3)
    assert result["calls"] > 0 and result["errors"] == []
    assert report["owners"][worker_region] == "other namespace"
    assert worker_region not in report["unregistered"] + report["unlinked"]
    # A dead tenant of another namespace holds no lock on its region: that proves it dead, and
    # the other tenant took its region back (its registration already, when it registered).
    assert crashed_region in report["unlinked"], report
    left = registered_on(grpc_url) | {p.name for p in SHM_DIR.iterdir()}
    assert {worker_region, crashed_region} & left == set()


# --------------------------------------------------------------------------------------
# A /dev/shm too small for the pool
# --------------------------------------------------------------------------------------

_SMALL_SHM = r"""
import json, os, sys
from ray_triton_shm import SharedMemoryFullError, TritonSHMClient
from ray_triton_shm._slots._shm import SharedMemoryRegion

results = {}
with TritonSHMClient(url=sys.argv[1]) as client:
    try:
        client.register_shm_model("large_image", pool_size=4)
    except SharedMemoryFullError as exc:
        results["register"] = {"message": str(exc), "needed": exc.needed, "free": exc.free,
                               "errno": exc.errno, "oserror": isinstance(exc, OSError),
                               "model": exc.model}
    results["after_register"] = sorted(os.listdir("/dev/shm"))
    try:  # past the check: /dev/shm fills while the region is being created
        SharedMemoryRegion.create("rtshm_0-0_0_too-big", 128 * 2**20)
    except SharedMemoryFullError as exc:
        results["create"] = {"message": str(exc), "errno": exc.errno}
    results["after_create"] = sorted(os.listdir("/dev/shm"))
print(json.dumps(results))
"""


def test_a_small_dev_shm_is_a_clear_error_before_anything_is_created(grpc_url: str) -> None:
    need_unshare("--mount")
    registered_before = registered_on(grpc_url)
    script = (
        "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "
        f'{sys.executable} -c "$SCRIPT" {grpc_url}'
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "SCRIPT": _SMALL_SHM},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])

    error = results["register"]
    assert error["oserror"] and error["errno"] == 28 and error["model"] == "large_image"
    assert error["needed"] > error["free"] and error["free"] <= 64 * 2**20
    message = error["message"]
    for words in ("/dev/shm", "MiB free", "--shm-size=", "emptyDir", "medium: Memory"):
        assert words in message, message
    assert "pool_size" in message and "max_batch_size" in message
    assert results["after_register"] == []
    assert "/dev/shm" in results["create"]["message"] and results["create"]["errno"] == 28
    assert results["after_create"] == []
    assert registered_on(grpc_url) == registered_before
