"""Pools that follow their load, against a real Triton and a real local Ray: growth while
callers wait, shrinking when idle, the /dev/shm budget, fixed pools, a soak that swings the
load; every answer checked against its own request, nothing left behind."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _helpers import Load, our_regions, registered_on, wait_for

from ray_triton_shm import SlotAutoscaling, TritonSHMClient
from ray_triton_shm._client import registry_of
from ray_triton_shm._pools._scaling import TICK_S
from ray_triton_shm._slots._shm import list_local_regions
from ray_triton_shm._slots._specs import SlotLayout

SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}
QUICK = {"min_slots": 2, "max_slots": 8, "upscale_delay_s": 0.1, "downscale_delay_s": 1.0}
#: What a test that a pool does not grow gives its scaler: rounds enough past the default
#: upscale_delay_s to grow it, were it to (no event marks that nothing happened).
NO_GROWTH_S = SlotAutoscaling().upscale_delay_s + 8 * TICK_S


_running: list[Load] = []


@pytest.fixture(autouse=True)
def _loads_stop() -> Iterator[None]:
    """Stops the loads a test left running (it failed before it stopped them)."""
    yield
    while _running:
        _running.pop()._stop.set()


def _load(client: TritonSHMClient, model: str, callers: int) -> Load:
    # One chunk per call (max_batch_size 8): a caller then holds one slot at a time.
    call = lambda x: client.infer_shm(model, {"INPUT0": x})["OUTPUT0"]  # noqa: E731
    load = Load(callers, call, max_rows=8)
    _running.append(load)
    return load


def _checked(load: Load) -> int:
    outcomes = load.stop()
    errors = [o.error for o in outcomes if o.error is not None]
    assert not errors, errors[:3]
    assert not any(o.wrong for o in outcomes)
    return len(outcomes)


def _allocated(client: TritonSHMClient, model: str) -> int:
    pool = registry_of(client).get(model)
    return os.stat(f"/dev/shm/{pool.region.name}").st_blocks * 512


def test_a_pool_grows_while_callers_wait_and_gives_its_memory_back_when_idle(
    client: TritonSHMClient,
) -> None:
    spec = client.register_shm_model("slow_identity", max_shapes=SHAPES, autoscaling=QUICK)
    layout = SlotLayout.for_model(spec)
    stats = client.shm_stats("slow_identity")
    assert (stats.size, stats.min_size, stats.max_size) == (2, 2, 8)
    assert _allocated(client, "slow_identity") == layout.region_bytes(2)
    load = _load(client, "slow_identity", 6)
    wait_for(lambda: client.shm_stats("slow_identity").size == 6)
    assert _allocated(client, "slow_identity") == layout.region_bytes(6)
    assert _checked(load) >= 6
    # Idle: back to the minimum after downscale_delay_s, its pages given back to /dev/shm.
    wait_for(lambda: client.shm_stats("slow_identity").size == 2)
    wait_for(lambda: _allocated(client, "slow_identity") == layout.region_bytes(2))
    assert client.shm_stats("slow_identity").shm_bytes == layout.region_bytes(2)
    assert registry_of(client).get("slow_identity").header.resizes[0] >= 1
    # It grows again, on the slots it gave back, and every answer is still right.
    load = _load(client, "slow_identity", 4)
    wait_for(lambda: client.shm_stats("slow_identity").size == 4)
    _checked(load)


def test_one_caller_never_makes_a_pool_grow(client: TritonSHMClient) -> None:
    client.register_shm_model("identity", max_shapes=SHAPES)  # the defaults: 2 to 64 slots
    load = _load(client, "identity", 1)
    load.wait_for_answers(11)
    time.sleep(NO_GROWTH_S)  # the window itself: what did not happen in it (see NO_GROWTH_S)
    assert _checked(load) > 10
    stats = client.shm_stats("identity")
    assert (stats.size, stats.min_size, stats.max_size, stats.limited_by) == (2, 2, 64, "")
    assert registry_of(client).get("identity").header.resizes == (0, 0)


def test_max_slots_bounds_the_pool_and_says_so(client: TritonSHMClient) -> None:
    client.register_shm_model(
        "slow_identity", max_shapes=SHAPES, autoscaling={**QUICK, "max_slots": 3}
    )
    load = _load(client, "slow_identity", 6)
    wait_for(lambda: client.shm_stats("slow_identity").limited_by == "max_slots")
    assert client.shm_stats("slow_identity").size == 3
    _checked(load)
    wait_for(lambda: client.shm_stats("slow_identity").limited_by == "")


def test_the_shm_budget_stops_growth_and_says_so(grpc_url: str) -> None:
    with TritonSHMClient(url=grpc_url) as probe:
        layout = SlotLayout.for_model(
            probe.register_shm_model("slow_identity", max_shapes=SHAPES, pool_size=1)
        )
    budget = layout.region_bytes(3)  # the header and three slots
    with TritonSHMClient(url=grpc_url, shm_budget_bytes=budget) as client:
        client.register_shm_model("slow_identity", max_shapes=SHAPES, autoscaling=QUICK)
        load = _load(client, "slow_identity", 6)
        wait_for(lambda: client.shm_stats("slow_identity").limited_by == "shm_budget")
        stats = client.shm_stats("slow_identity")
        assert stats.size == 3 and stats.shm_bytes <= budget
        _checked(load)
    assert our_regions(os.getpid()) == set()


def test_a_fixed_pool_stays_fixed(client: TritonSHMClient) -> None:
    spec = client.register_shm_model("slow_identity", max_shapes=SHAPES, pool_size=2)
    load = _load(client, "slow_identity", 6)
    wait_for(lambda: client.shm_stats("slow_identity").waiting >= 3)
    time.sleep(NO_GROWTH_S)  # the window itself: what did not happen in it (see NO_GROWTH_S)
    stats = client.shm_stats("slow_identity")
    assert (stats.size, stats.min_size, stats.max_size) == (2, 2, 2)
    assert _allocated(client, "slow_identity") == SlotLayout.for_model(spec).region_bytes(2)
    _checked(load)
    assert registry_of(client).get("slow_identity").header.resizes == (0, 0)


def test_a_model_registered_again_with_another_sizing_is_refused(client: TritonSHMClient) -> None:
    from ray_triton_shm import ModelSpecError

    client.register_shm_model("identity", max_shapes=SHAPES, autoscaling=QUICK)
    client.register_shm_model("identity", max_shapes=SHAPES, autoscaling=SlotAutoscaling(**QUICK))
    with pytest.raises(ModelSpecError, match=r"autoscaling 2 to 8 slots.*replace=True"):
        client.register_shm_model("identity", max_shapes=SHAPES, pool_size=4)
    client.register_shm_model("identity", max_shapes=SHAPES, pool_size=4, replace=True)
    assert client.shm_stats("identity").max_size == 4


# ---------------------------------------------------------------- the Ray layer


@pytest.fixture(scope="module")
def caller_class(ray_local: str) -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class Callers:
        """Threads of one process calling a ``ShmModel``, each answer checked against its own
        request; how many run changes while they run."""

        def __init__(self, model: Any) -> None:
            self.model = model
            self.stops: list[threading.Event] = []
            self.threads: list[threading.Thread] = []
            self.answers = 0
            self.wrong = 0
            self.errors: list[str] = []
            self.lock = threading.Lock()

        def run(self, callers: int) -> None:
            while len(self.stops) < callers:
                stop = threading.Event()
                thread = threading.Thread(target=self._loop, args=(stop,), daemon=True)
                self.stops.append(stop)
                self.threads.append(thread)
                thread.start()
            while len(self.stops) > callers:
                self.stops.pop().set()
                self.threads.pop().join()

        def _loop(self, stop: threading.Event) -> None:
            rng = np.random.default_rng()
            while not stop.is_set():
                x = rng.standard_normal((int(rng.integers(1, 9)), 16), dtype=np.float32)
                try:
                    right = np.array_equal(self.model.infer({"INPUT0": x})["OUTPUT0"], x)
                except Exception as exc:
                    with self.lock:
                        self.errors.append(repr(exc))
                    continue
                with self.lock:
                    self.answers += 1
                    self.wrong += not right

        def totals(self) -> tuple[int, int, list[str]]:
            self.run(0)
            self.model.close()
            return self.answers, self.wrong, self.errors[:5]

    return Callers


def _node_pool(model: str) -> dict[str, Any]:
    import ray

    from ray_triton_shm.ray import get_node_actor

    return ray.get(get_node_actor().stats.remote()).models.get(model, {})  # type: ignore[no-any-return]


def _shutdown_node_actor(url: str, before: set[str]) -> None:
    import ray

    from ray_triton_shm.ray import get_node_actor

    actor = get_node_actor()
    ray.get(actor.shutdown.remote())
    ray.kill(actor)
    wait_for(lambda: registered_on(url) == before, timeout_s=30)
    assert not [r for r in list_local_regions() if "identity" in r.name]


def test_a_node_pool_follows_the_load_of_every_process(ray_local: str, caller_class: Any) -> None:
    import ray

    from ray_triton_shm.ray import ShmModel

    before = registered_on(ray_local)
    model = ShmModel("slow_identity", max_shapes=SHAPES, autoscaling=QUICK)
    callers = [caller_class.remote(model) for _ in range(3)]
    ray.get([c.run.remote(2) for c in callers])  # 6 callers in 3 processes
    wait_for(lambda: _node_pool("slow_identity").get("slots") == 6)
    pool = _node_pool("slow_identity")
    assert (pool["min_slots"], pool["max_slots"], pool["grows"]) == (2, 8, pool["grows"] or 1)
    ray.get([c.run.remote(1) for c in callers])  # 3 callers: after the delay, 3 slots
    wait_for(lambda: _node_pool("slow_identity").get("slots") == 3)
    totals = ray.get([c.totals.remote() for c in callers])
    assert all(errors == [] for _, _, errors in totals), totals
    assert sum(wrong for _, wrong, _ in totals) == 0 and sum(a for a, _, _ in totals) > 6
    wait_for(lambda: _node_pool("slow_identity").get("slots") == 2)
    pool = _node_pool("slow_identity")
    assert pool["shrinks"] >= 2 and pool["shm_bytes"] < pool["shm_max_bytes"]
    _shutdown_node_actor(ray_local, before)


def test_the_node_actor_says_why_a_pool_with_waiting_callers_did_not_grow(
    ray_local: str, caller_class: Any
) -> None:
    """Callers waited, but the pool's upscale_delay_s is longer than any of their waits:
    it stays at 2, and the node actor's stats say why."""
    import ray

    from ray_triton_shm.ray import ShmModel

    before = registered_on(ray_local)
    model = ShmModel(
        "slow_identity", max_shapes=SHAPES, autoscaling={**QUICK, "upscale_delay_s": 60}
    )
    callers = caller_class.remote(model)
    ray.get(callers.run.remote(4))
    wait_for(lambda: _node_pool("slow_identity").get("wait_p99_us", 0) > 0)
    answers, wrong, errors = ray.get(callers.totals.remote())  # the waits end
    assert answers and not wrong and not errors
    wait_for(lambda: _node_pool("slow_identity").get("limited_by") == "upscale_delay_s")
    assert _node_pool("slow_identity")["slots"] == 2
    _shutdown_node_actor(ray_local, before)


@pytest.mark.soak
def test_a_load_swinging_between_1_and_32_callers_gets_every_answer_right(
    ray_local: str, caller_class: Any, swing_s: float
) -> None:
    import ray

    from ray_triton_shm.ray import ShmModel

    before = registered_on(ray_local)
    model = ShmModel("identity", max_shapes=SHAPES, autoscaling={"downscale_delay_s": 2.0})
    callers = [caller_class.remote(model) for _ in range(4)]
    sizes = []
    deadline = time.monotonic() + swing_s  # the load itself: swing_s of it
    swing = 0
    while time.monotonic() < deadline:
        per_process = (1, 0, 0, 0) if swing % 2 == 0 else (8, 8, 8, 8)  # 1, then 32 callers
        ray.get([c.run.remote(n) for c, n in zip(callers, per_process, strict=True)])
        time.sleep(2.0)  # the load itself: the swing's period, not a wait for a state
        sizes.append(_node_pool("identity")["slots"])
        swing += 1
    totals = ray.get([c.totals.remote() for c in callers])
    assert all(errors == [] for _, _, errors in totals), totals
    answers = sum(a for a, _, _ in totals)
    assert sum(wrong for _, wrong, _ in totals) == 0
    assert answers > 100
    assert max(sizes) > 2, sizes  # it grew under 32 callers
    print(f"{answers} answers, all right; pool sizes, a swing every 2 s: {sizes}")
    pool = _node_pool("identity")
    assert pool["errors"] == 0 and pool["abandoned"] == 0
    _shutdown_node_actor(ray_local, before)
