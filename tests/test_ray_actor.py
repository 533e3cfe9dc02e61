"""The node actor and ShmModel on a real local Ray cluster and a real Triton."""

from __future__ import annotations

import asyncio
import os
import pickle
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from _helpers import classifier_expected, node_actor_of_module, runs_in_triton, wait_for

from ray_triton_shm import CudaError, InvalidInputError, ModelSpecError, TritonServerError
from ray_triton_shm._client import registry_of
from ray_triton_shm._slots._shm import list_local_regions, pid_alive
from ray_triton_shm.local import LocalTritonServer
from ray_triton_shm.ray import URL_ENV_VAR, ShmModel, get_node_actor
from ray_triton_shm.ray._actor import NAMESPACE, actor_name

SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}


@pytest.fixture(scope="module")
def node_actor(ray_local: str) -> Iterator[ray.actor.ActorHandle]:
    with node_actor_of_module(slots=4) as actor:
        yield actor


def test_one_named_actor_per_node_even_when_callers_race(node_actor) -> None:  # type: ignore[no-untyped-def]
    @ray.remote(num_cpus=0)
    def find() -> str:
        return get_node_actor()._actor_id.hex()

    ids = set(ray.get([find.remote() for _ in range(8)]))
    assert ids == {node_actor._actor_id.hex()}
    node = ray.get_runtime_context().get_node_id()
    named = ray.get_actor(actor_name(node), namespace=NAMESPACE)
    assert named._actor_id == node_actor._actor_id
    stats = ray.get(node_actor.stats.remote())
    assert stats.node_id == node and stats.url == os.environ[URL_ENV_VAR]


def test_register_is_idempotent_and_refuses_other_specs(node_actor) -> None:  # type: ignore[no-untyped-def]
    first = ray.get(node_actor.register.remote("classifier"))
    again = ray.get(node_actor.register.remote("classifier"))
    assert first == again
    with pytest.raises(ModelSpecError, match="already registered"):
        ray.get(node_actor.register.remote("classifier", pool_size=2))
    with pytest.raises(ModelSpecError, match="exceeds"):
        ray.get(node_actor.register.remote("my_model", pool_size=64))


def test_zero_copy_results_and_counters(node_actor) -> None:  # type: ignore[no-untyped-def]
    model = ShmModel("classifier")
    assert model.zero_copy
    x = np.random.default_rng(0).random((20, 3, 224, 224), dtype=np.float32)  # 3 chunks
    out = model.infer({"INPUT0": x})["OUTPUT0"]
    np.testing.assert_allclose(out, classifier_expected(x), rtol=1e-5)
    stats = ray.get(node_actor.stats.remote()).models["classifier"]
    # Counted by the caller in the region's header, summed by the actor; none went by value.
    assert stats["requests"] >= 3 and stats["samples"] >= 20 and stats["transport"] == "shm"
    assert stats["bytes_in"] >= x.nbytes and stats["bytes_out"] >= out.nbytes
    # A process holds a slot only while its request does: none between calls.
    assert stats["in_use"] == stats["waiting"] == stats["abandoned"] == 0
    model.close()


def test_a_busy_process_never_starves_a_waiting_one(node_actor) -> None:  # type: ignore[no-untyped-def]
    """Waiting callers queue in the region; a free slot goes to them, never to a newcomer of
    a process that keeps every slot busy."""
    import threading

    hog = ShmModel("slow_identity", max_shapes=SHAPES)
    x = np.ones((1, 16), np.float32)
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            hog.infer({"INPUT0": x})

    threads = [threading.Thread(target=busy) for _ in range(8)]  # 8 loops on 4 slots
    for thread in threads:
        thread.start()

    @ray.remote(num_cpus=0)
    def other_process() -> tuple[list[float], bool]:
        model = ShmModel("slow_identity", max_shapes=SHAPES, slot_timeout_s=20)
        out = model.infer({"INPUT0": np.full((1, 16), 7, np.float32)})["OUTPUT0"]
        return out.tolist()[0], model.zero_copy

    try:
        out, zero_copy = ray.get(other_process.remote(), timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert out == [7.0] * 16 and zero_copy
    stats = ray.get(node_actor.stats.remote()).models["slow_identity"]
    assert stats["waits"] >= 1 and stats["wait_p99_us"] > 0
    assert stats["in_use"] == stats["waiting"] == 0
    hog.close()


def test_no_ray_call_per_request_at_any_contention(node_actor) -> None:  # type: ignore[no-untyped-def]
    """Callers in several processes, more of them than slots: after binding, requests make no
    call to the node actor (or any other actor)."""

    @ray.remote(num_cpus=0)
    def caller(requests: int) -> tuple[int, int]:
        import threading

        from ray.actor import ActorMethod

        model = ShmModel("identity", max_shapes=SHAPES)
        x = np.ones((1, 16), np.float32)
        model.infer({"INPUT0": x})  # binds: the only calls to the actor
        calls = 0
        remote = ActorMethod._remote

        def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            return remote(self, *args, **kwargs)

        ActorMethod._remote = counted  # type: ignore[method-assign]

        def loop() -> None:
            for _ in range(requests):
                model.infer({"INPUT0": x})

        threads = [threading.Thread(target=loop) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ActorMethod._remote = remote  # type: ignore[method-assign]
        return calls, 3 * requests

    before = ray.get(node_actor.stats.remote()).models.get("identity", {}).get("waits", 0)
    results = ray.get([caller.remote(100) for _ in range(3)], timeout=120)  # 9 callers, 4 slots
    assert [calls for calls, _ in results] == [0, 0, 0]
    stats = ray.get(node_actor.stats.remote()).models["identity"]
    assert stats["waits"] > before  # there was contention: callers waited for slots
    assert stats["in_use"] == stats["waiting"] == 0


def test_by_value_results(node_actor) -> None:  # type: ignore[no-untyped-def]
    model = ShmModel("identity", max_shapes=SHAPES, zero_copy=False)
    assert not model.zero_copy
    x = np.arange(40 * 16, dtype=np.float32).reshape(40, 16)
    np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)


def test_handles_pickle_only_configuration(node_actor) -> None:  # type: ignore[no-untyped-def]
    model = ShmModel("identity", max_shapes=SHAPES)
    model.infer({"INPUT0": np.ones((1, 16), np.float32)})  # bound in this process
    data = pickle.dumps(model)
    assert len(data) < 2000
    clone = pickle.loads(data)
    assert clone._here.binding is None

    @ray.remote(num_cpus=0)
    def use(handle: ShmModel, x: np.ndarray) -> tuple[np.ndarray, bool, int]:
        assert not x.flags.writeable  # Ray hands numpy arguments over read-only
        return handle.infer({"INPUT0": x})["OUTPUT0"], handle.zero_copy, os.getpid()

    x = np.random.default_rng(1).random((5, 16), dtype=np.float32)
    results = ray.get([use.remote(model, x * i) for i in range(6)])
    for i, (out, zero_copy, pid) in enumerate(results):
        np.testing.assert_array_equal(out, x * i)
        assert zero_copy and pid != os.getpid()


def test_gpu_memory_without_a_gpu_says_so_in_the_caller_and_in_the_actor(node_actor) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelSpecError, match="memory must be one of"):
        ShmModel("identity", memory="gpu")  # refused where the handle is made
    model = ShmModel("identity", max_shapes=SHAPES, memory="cuda", outputs_as="torch")
    clone = pickle.loads(pickle.dumps(model))
    assert clone._register_args["memory"] == "cuda" and clone._here.binding is None

    @ray.remote(num_cpus=0)
    def use(handle: ShmModel) -> Any:
        return handle.infer({"INPUT0": np.ones((1, 16), np.float32)})

    with pytest.raises(CudaError, match="no NVIDIA driver was found"):  # in the caller
        ray.get(use.remote(model))
    pid = ray.get(node_actor.stats.remote()).pid
    before = sorted(r.name for r in list_local_regions() if r.owner.pid == pid)
    device = f"GPU-{uuid.uuid4()}"  # as a caller on a GPU names it to the node actor
    register = node_actor.register.remote("add_nobatch", memory="cuda", device=device)
    with pytest.raises(CudaError, match="no NVIDIA driver was found"):  # in the node actor
        ray.get(register)
    assert "add_nobatch" not in ray.get(node_actor.stats.remote()).models
    assert sorted(r.name for r in list_local_regions() if r.owner.pid == pid) == before


def test_async_handle(node_actor) -> None:  # type: ignore[no-untyped-def]
    @ray.remote(num_cpus=0)
    class Replica:
        def __init__(self) -> None:
            self.model = ShmModel("identity", max_shapes=SHAPES)

        async def run(self, n: int) -> bool:
            import asyncio

            xs = [np.full((3, 16), i, np.float32) for i in range(n)]
            outs = await asyncio.gather(*(self.model.infer_async({"INPUT0": x}) for x in xs))
            return all(np.array_equal(o["OUTPUT0"], x) for o, x in zip(outs, xs))

    replica = Replica.remote()
    assert ray.get(replica.run.remote(20))
    ray.kill(replica)


def test_bad_input_is_refused_in_the_caller(node_actor) -> None:  # type: ignore[no-untyped-def]
    model = ShmModel("classifier")
    before = ray.get(node_actor.stats.remote()).models.get("classifier", {}).get("requests", 0)
    with pytest.raises(InvalidInputError, match=r"'INPUT0'.*float32.*float64"):
        model.infer({"INPUT0": np.zeros((2, 3, 224, 224))})
    by_value = ShmModel("classifier", zero_copy=False)
    with pytest.raises(InvalidInputError, match=r"'INPUT0'.*\(batch, 3, 224, 224\)"):
        by_value.infer({"INPUT0": np.zeros((2, 3, 224), np.float32)})  # raised in the actor
    after = ray.get(node_actor.stats.remote()).models["classifier"]
    assert after["requests"] == before and after["in_use"] == 0


@pytest.mark.parametrize("zero_copy", [True, False])
def test_triton_errors_come_back_as_themselves(node_actor, zero_copy: bool) -> None:  # type: ignore[no-untyped-def]
    model = ShmModel(
        "fail_on_negative", max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)}, zero_copy=zero_copy
    )
    with pytest.raises(TritonServerError, match="negative input") as info:
        model.infer({"INPUT0": -np.ones((2, 4), np.float32)})
    assert info.value.status and info.value.model == "fail_on_negative"
    ok = model.infer({"INPUT0": np.ones((2, 4), np.float32)})["OUTPUT0"]
    np.testing.assert_array_equal(ok, np.ones((2, 4), np.float32))
    model.close()
    stats = ray.get(node_actor.stats.remote()).models["fail_on_negative"]
    assert stats["errors"] >= 1 and stats["in_use"] == 0


def test_empty_batch(node_actor) -> None:  # type: ignore[no-untyped-def]
    out = ShmModel("classifier").infer({"INPUT0": np.empty((0, 3, 224, 224), np.float32)})
    assert out["OUTPUT0"].shape == (0, 1000)


def test_a_caller_killed_mid_request_frees_its_slot_once_triton_is_done_with_it(
    node_actor: ray.actor.ActorHandle, triton: LocalTritonServer
) -> None:
    """Its request is still in Triton, which writes into the slot when it is done: the slot
    stays out of use exactly that long (not a moment less), while the others serve on, and
    serves again within a second of Triton finishing."""
    # Long enough that the kill, and binding a new handle, end before Triton does (they took
    # over 1.7 s once on 2 busy cores, and the slot was already back when first looked at).
    delay_s = 5.0
    echo = {"max_shapes": {"DATA": (16,), "ECHO": (16,)}}

    @ray.remote(num_cpus=0, max_concurrency=2)
    class Caller:
        def __init__(self) -> None:
            self.model = ShmModel("delay_echo", **echo)
            self.model.infer({"DELAY_MS": np.array([0], np.int32), "DATA": np.ones(16, np.float32)})
            self.sent_at = 0.0

        def slow(self) -> None:
            self.sent_at = time.time()  # before the request leaves
            data = np.ones(16, np.float32)
            self.model.infer({"DELAY_MS": np.array([delay_s * 1000], np.int32), "DATA": data})

        def sent(self) -> float:
            """When the slow request was sent, once its slot says so (zero before)."""
            header = registry_of(self.model._here.binding.client).get("delay_echo").header
            busy = any(header.busy_since(slot) for slot in range(header.slot_count))
            return self.sent_at if busy else 0.0

        def pid(self) -> int:
            return os.getpid()

    caller = Caller.remote()
    pid = ray.get(caller.pid.remote())
    with runs_in_triton(triton, "delay_echo") as runs:
        caller.slow.remote()
        wait_for(runs, timeout_s=60, what="the slow request running in Triton")
    sent_at = ray.get(caller.sent.remote())
    assert sent_at
    ray.kill(caller)
    # ray.kill returns before the process is gone.
    wait_for(lambda: not pid_alive(pid), what="the killed caller's process gone")
    model = ShmModel("delay_echo", **echo)
    x = np.full(16, 3, np.float32)
    out = model.infer({"DELAY_MS": np.array([0], np.int32), "DATA": x})["ECHO"]
    np.testing.assert_array_equal(out, x)  # the others serve on

    def abandoned() -> int:
        return int(ray.get(node_actor.stats.remote()).models["delay_echo"]["abandoned"])

    # The actor's next sweep finds the dead caller's slot, long before Triton is done.
    wait_for(
        lambda: abandoned() == 1,
        timeout_s=sent_at + delay_s - 1.0 - time.time(),
        what="the node actor to find the killed caller's slot abandoned",
    )
    wait_for(
        lambda: not abandoned(),
        timeout_s=sent_at + delay_s + 1.0 - time.time(),
        what="the slot back within 1 s of Triton finishing",
    )
    back_at = time.time()
    assert back_at >= sent_at + delay_s  # never before Triton was done with it
    stats = ray.get(node_actor.stats.remote()).models["delay_echo"]
    assert stats["abandoned_requests"] == 1 and stats["settle_p99_us"] >= 1_000_000

    async def four() -> list[dict[str, np.ndarray]]:
        inputs = {"DELAY_MS": np.array([0], np.int32), "DATA": x}
        return await asyncio.gather(*(model.infer_async(inputs) for _ in range(4)))

    # Every slot serves again: four requests at once.
    assert all(np.array_equal(out["ECHO"], x) for out in asyncio.run(four()))
    model.close()


def test_the_deprecated_infer_of_the_node_actor_still_answers_by_value(node_actor) -> None:  # type: ignore[no-untyped-def]
    """``actor.infer.remote`` (deprecated: callers go straight to Triton) serves a request
    through the actor's client, its arrays in and out through Ray's object store."""
    registration = ray.get(node_actor.register.remote("identity", max_shapes=SHAPES))
    x = np.arange(3 * 16, dtype=np.float32).reshape(3, 16)
    call = node_actor.infer.remote("identity", registration.incarnation, {"INPUT0": x})
    np.testing.assert_array_equal(ray.get(call)["OUTPUT0"], x)
    options = {"priority": 0, "requested_outputs": ["OUTPUT0"]}
    call = node_actor.infer.remote(
        "identity", registration.incarnation, {"INPUT0": x}, None, None, 5.0, options
    )
    assert list(ray.get(call)) == ["OUTPUT0"]
    stats = ray.get(node_actor.stats.remote()).models["identity"]
    assert stats["in_use"] == stats["waiting"] == 0


def test_a_handles_calls_still_take_outputs_with_a_warning(node_actor) -> None:  # type: ignore[no-untyped-def]
    model = ShmModel("identity", max_shapes=SHAPES)
    x = np.ones((2, 16), np.float32)
    with pytest.warns(DeprecationWarning, match="requested_outputs") as warned:
        out = model.infer({"INPUT0": x}, outputs=["OUTPUT0"])
    assert warned[0].filename == __file__  # the caller's line
    np.testing.assert_array_equal(out["OUTPUT0"], x)
    with pytest.warns(DeprecationWarning, match="requested_outputs"):
        awaited = asyncio.run(model.infer_async({"INPUT0": x}, outputs=["OUTPUT0"]))
    np.testing.assert_array_equal(awaited["OUTPUT0"], x)
    with pytest.warns(DeprecationWarning, match="requested_outputs"):
        lease = model.lease(batch=2, shapes={"INPUT0": (16,)}, outputs=["OUTPUT0"])
    with lease as leased:
        leased.inputs["INPUT0"][:] = x
        np.testing.assert_array_equal(leased.infer()["OUTPUT0"], x)
    model.close()
