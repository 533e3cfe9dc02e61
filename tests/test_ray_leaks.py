"""The node actor under many callers, cancellations, killed callers, overload and restarts.

After all of it: no slot in use, none of a dead caller kept out of use once Triton is done,
and after ``shutdown()`` no region of the actor left in ``/dev/shm`` or registered in Triton.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import tritonclient.grpc as grpcclient
from _helpers import identity_job, our_regions, wait_for
from ray import cloudpickle

from ray_triton_shm import OverloadedError
from ray_triton_shm._slots._shm import region_of
from ray_triton_shm.ray import ShmModel, get_node_actor

# Ship this module's actor classes by value (workers cannot import the test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SHM_DIR = Path("/dev/shm")
IDENTITY_SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}


def _registered(url: str, pid: int) -> list[str]:
    with grpcclient.InferenceServerClient(url) as client:
        regions = client.get_system_shared_memory_status(as_json=True).get("regions", {})
    return sorted({region_of(name) for name in regions if name.startswith(f"rtshm_{pid}-")})


@pytest.fixture
def node_actor_factory(ray_local: str) -> Iterator[Callable[..., Any]]:
    """Creates the node actor with given options; shuts it down and kills it afterwards."""
    created: list[Any] = []

    def create(**options: Any) -> Any:
        actor = get_node_actor(url=ray_local, **options)
        created.append(actor)
        return actor

    yield create
    for actor in created:
        try:
            ray.get(actor.shutdown.remote(), timeout=60)
        except Exception:
            pass
        ray.kill(actor)


def _shutdown_and_check_clean(actor: Any, url: str) -> None:
    pid = ray.get(actor.stats.remote()).pid
    assert our_regions(pid), "the actor had no regions to begin with"
    ray.get(actor.shutdown.remote())
    assert our_regions(pid) == set()
    assert _registered(url, pid) == []


# --------------------------------------------------------------------------------------
# Many callers, some cancelled, one killed
# --------------------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_concurrency=64)
class _AsyncCaller:
    """Runs ``concurrency`` asyncio tasks calling ``infer_async`` until ``calls`` are made."""

    def __init__(self) -> None:
        self.model = ShmModel("identity", max_shapes=IDENTITY_SHAPES)
        self.done = 0

    def pid(self) -> int:
        return os.getpid()

    async def progress(self) -> int:
        return self.done

    async def run(
        self, calls: int, concurrency: int, *, cancel_tasks: int = 0, cancel_after: int = 0
    ) -> int:
        counter = itertools.count()
        enough = asyncio.Event()

        async def worker(seed: int) -> None:
            rng = np.random.default_rng(seed)
            while next(counter) < calls:
                rows = int(rng.integers(1, 9))
                x = rng.standard_normal((rows, int(rng.integers(1, 17)))).astype(np.float32)
                out = await self.model.infer_async({"INPUT0": x})
                np.testing.assert_array_equal(out["OUTPUT0"], x)
                self.done += 1
                if self.done >= cancel_after:
                    enough.set()

        tasks = [asyncio.create_task(worker(os.getpid() * 100 + i)) for i in range(concurrency)]
        if cancel_tasks:
            # Until cancel_after answers, or the end of every task if that comes first.
            answered = asyncio.ensure_future(enough.wait())
            ended = asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.wait([answered, ended], return_when=asyncio.FIRST_COMPLETED)
            answered.cancel()
            for task in tasks[:cancel_tasks]:
                task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
        return self.done

    def close(self) -> None:
        self.model.close()


def test_many_callers_with_cancellations_and_a_killed_caller_leak_nothing(
    node_actor_factory: Callable[..., Any], ray_local: str
) -> None:
    actor = node_actor_factory(slots=8)
    # 4 caller processes x 4 asyncio tasks = 16 concurrent callers; 1000 calls in all.
    whole, cancels_tasks, cancelled, killed = (_AsyncCaller.remote() for _ in range(4))
    pids = ray.get([c.pid.remote() for c in (whole, cancels_tasks, cancelled, killed)])
    assert len(set(pids)) == 4
    runs = {
        "whole": whole.run.remote(250, 4),
        # Cancels 2 of its 4 asyncio tasks midway; the other 2 make the remaining calls.
        "cancels_tasks": cancels_tasks.run.remote(250, 4, cancel_tasks=2, cancel_after=40),
        "cancelled": cancelled.run.remote(250, 4),
        "killed": killed.run.remote(250, 4),
    }
    wait_for(
        lambda: ray.get(cancelled.progress.remote()) >= 30,
        timeout_s=120,
        what="the caller to be cancelled to get going",
    )
    # CancelledError inside its coroutines, mid-call; recursive (the default, as Serve does),
    # which would cancel its calls on the node actor too, if it made any from the task.
    ray.cancel(runs["cancelled"])
    wait_for(
        lambda: ray.get(killed.progress.remote()) >= 30,
        timeout_s=120,
        what="the caller to be killed to get going",
    )
    ray.kill(killed)  # SIGKILL: nothing released; the kernel drops its slot locks

    assert ray.get(runs["whole"], timeout=300) == 250
    assert ray.get(runs["cancels_tasks"], timeout=300) >= 240
    with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError)):
        ray.get(runs["cancelled"], timeout=300)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(runs["killed"], timeout=300)
    made = [ray.get(c.progress.remote()) for c in (whole, cancels_tasks, cancelled)]
    assert 0 < made[2] < 250

    # Every caller alive gives its slots back. The killed caller's are free again once Triton
    # is done with the requests it left there.
    ray.get([c.close.remote() for c in (whole, cancels_tasks, cancelled)])

    def settled() -> Any:
        stats = ray.get(actor.stats.remote())
        identity = stats.models["identity"]
        idle = identity["in_use"] == identity["abandoned"] == identity["waiting"] == 0
        return idle and stats

    stats = wait_for(settled, timeout_s=30, what="every slot, the killed caller's too")
    identity = stats.models["identity"]
    # Only the cancelled caller's in-flight calls (at most its 4) may have ended in error.
    assert identity["errors"] <= 4
    assert identity["requests"] >= 250 + 240 + made[2] + 30
    for caller in (whole, cancels_tasks, cancelled):
        ray.kill(caller)
    _shutdown_and_check_clean(actor, ray_local)


# --------------------------------------------------------------------------------------
# Overload
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("zero_copy", [False, True], ids=["by-value", "zero-copy"])
def test_queueing_more_than_max_waiting_raises_overloaded(
    node_actor_factory: Callable[..., Any], ray_local: str, zero_copy: bool
) -> None:
    actor = node_actor_factory(slots=1, max_waiting=2)
    model = ShmModel("slow_identity", max_shapes=IDENTITY_SHAPES, zero_copy=zero_copy)
    x = np.ones((2, 16), np.float32)
    np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)  # binds

    async def burst() -> list[Any]:
        calls = [model.infer_async({"INPUT0": x * i}) for i in range(8)]
        return await asyncio.gather(*calls, return_exceptions=True)

    started = time.monotonic()
    results = asyncio.run(burst())
    overloaded = [r for r in results if isinstance(r, OverloadedError)]
    served = [(i, r) for i, r in enumerate(results) if isinstance(r, dict)]
    assert len(overloaded) + len(served) == 8, results
    assert overloaded, "no call was refused past max_waiting"
    assert "max_waiting" in str(overloaded[0])
    assert 1 <= len(served) <= 1 + 2  # the slot's call, and max_waiting waiting for it
    for i, outputs in served:
        np.testing.assert_array_equal(outputs["OUTPUT0"], x * i)
    # The refused calls failed at once, not after queueing behind the slow model.
    assert time.monotonic() - started < 0.3 * len(served) + 5

    # After the burst the actor serves again, with nothing left in use.
    np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
    model.close()
    stats = ray.get(actor.stats.remote()).models["slow_identity"]
    assert stats["in_use"] == 0 and stats["waiting"] == 0
    assert stats["overloads"] == len(overloaded)  # counted in the region's header
    _shutdown_and_check_clean(actor, ray_local)


# --------------------------------------------------------------------------------------
# Restart
# --------------------------------------------------------------------------------------


def test_killed_node_actor_restarts_reclaims_and_serves_the_same_handle(
    node_actor_factory: Callable[..., Any], ray_local: str
) -> None:
    actor = node_actor_factory()
    by_ref = ShmModel("identity", max_shapes=IDENTITY_SHAPES)
    by_value = ShmModel("identity", max_shapes=IDENTITY_SHAPES, zero_copy=False)
    x = np.arange(48, dtype=np.float32).reshape(3, 16)
    for model in (by_ref, by_value):
        np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
    before = ray.get(actor.stats.remote())
    old_regions = our_regions(before.pid)
    assert len(old_regions) == 1  # one region: by-value and direct calls share its slots
    assert set(_registered(ray_local, before.pid)) == old_regions

    ray.kill(actor, no_restart=False)

    def restarted() -> Any:
        try:
            stats = ray.get(actor.stats.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return None
        return stats if stats.pid != before.pid else None

    after = wait_for(restarted, timeout_s=60, what="the node actor to restart")
    assert after.incarnation != before.incarnation
    assert after.node_id == before.node_id and after.url == before.url
    # The new incarnation took back what the killed one left behind.
    assert _registered(ray_local, before.pid) == []
    assert our_regions(before.pid) == set()

    # The same handles rebind (new registration, new region) and serve again.
    for model in (by_ref, by_value):
        np.testing.assert_array_equal(model.infer({"INPUT0": x + 1})["OUTPUT0"], x + 1)
    assert asyncio.run(by_ref.infer_async({"INPUT0": x}))["OUTPUT0"].tolist() == x.tolist()
    stats = ray.get(actor.stats.remote())
    assert stats.pid == after.pid
    assert stats.models["identity"]["requests"] == 3
    by_ref.close()
    by_value.close()
    _shutdown_and_check_clean(actor, ray_local)


# --------------------------------------------------------------------------------------
# Callers ending mid-call never crash the node actor
# --------------------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_concurrency=8)
class _LoopingCaller:
    """Calls the model in a loop until it ends, however it ends."""

    def __init__(self) -> None:
        self.model = ShmModel("identity", max_shapes=IDENTITY_SHAPES)
        self.done = 0

    def progress(self) -> int:
        return self.done

    async def run(self) -> None:
        x = np.ones((4, 16), np.float32)
        while True:
            await self.model.infer_async({"INPUT0": x})
            self.done += 1


@pytest.mark.soak  # the soak tier (CI runs it after make test): make test stays under 12 min
def test_callers_ending_mid_call_never_restart_the_node_actor(
    node_actor_factory: Callable[..., Any], ray_local: str
) -> None:
    """Rounds of callers ending with calls in flight: gracefully (``__ray_terminate__``, as
    Serve downscaling does), killed (``ray.kill``), and a Ray Data job ending its worker pool.
    The actor's incarnation never changes and every slot comes back."""
    actor = node_actor_factory(slots=4)
    incarnation = ray.get(actor.stats.remote()).incarnation
    ended = []
    for _ in range(2):
        callers = [_LoopingCaller.remote(), _LoopingCaller.remote()]
        graceful, killed = callers
        for caller in callers:
            caller.run.remote()
        wait_for(
            lambda callers=callers: min(ray.get([c.progress.remote() for c in callers])) >= 5,
            timeout_s=60,
            what="both callers to get going",
        )
        graceful.__ray_terminate__.remote()
        ray.kill(killed)
        ended.append(graceful)
        assert ray.get(actor.stats.remote()).incarnation == incarnation
    # A job's start is seconds of actor processes: one job ending its pool proves the point.
    ds = ray.data.range(64, override_num_blocks=8).map_batches(
        lambda b: {"INPUT0": np.ones((len(b["id"]), 16), np.float32)}, batch_size=8
    )
    assert identity_job(ds, IDENTITY_SHAPES).count() == 64
    assert ray.get(actor.stats.remote()).incarnation == incarnation
    for caller in ended:  # a terminate waits behind the endless call: end them for good
        ray.kill(caller)
    stats = wait_for(
        lambda: (s := ray.get(actor.stats.remote())).models["identity"]["in_use"] == 0 and s,
        timeout_s=60,
        what="every slot of the ended callers to come back",
    )
    assert stats.incarnation == incarnation
    _shutdown_and_check_clean(actor, ray_local)
