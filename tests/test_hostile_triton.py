"""A hostile Triton (``tests/_hostile.py``: real HTTP and gRPC servers in front of the real
one) answers garbage, closes mid-answer, stalls, answers another request's id, or outputs of
the wrong shape, datatype or size. Each call fails with a named error within its deadline,
its slot comes back exactly when it may, and the next call answers right: through the core
client, a stream, and ``ShmModel`` in a Ray task, whose node actor lives on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import ray
from _helpers import end_node_actor, wait_for
from _hostile import CASES, HostileTriton, hostile_triton

from ray_triton_shm import TritonSHMClient, TritonSHMError
from ray_triton_shm._pools import _model_sync
from ray_triton_shm.local import LocalTritonServer
from ray_triton_shm.ray import ShmModel, get_node_actor

SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}
#: The cases over HTTP without a deadline (a stall there waits as long as Triton does).
HTTP_CASES = tuple(case for case in CASES if case != "stall")
#: Each call's deadline, and how long a call waits for a Triton it cannot reach.
DEADLINE_S, RECONNECT_S = 3.0, 1.0


def rows(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((2, 16), dtype=np.float32)


@pytest.fixture(scope="module")
def hostile(triton: LocalTritonServer) -> Iterator[HostileTriton]:
    with hostile_triton(triton.grpc_url, triton.http_url) as server:
        yield server


@pytest.fixture
def cued(hostile: HostileTriton, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileTriton]:
    """The hostile Triton, answering right again after the test. An answer that fits no
    spec has the client read the model's config again until it changes, for 5 s: here, no
    model changes (half a second saves the suite seconds per case)."""
    monkeypatch.setattr(_model_sync, "_CONFIG_CATCH_UP_S", 0.5)
    try:
        yield hostile
    finally:
        hostile.cue(None)
        hostile.release()


def settled(client: TritonSHMClient, model: str) -> bool:
    stats = client.shm_stats(model)
    return stats.in_use == 0 and stats.abandoned == 0


def check_slot_back(hostile: HostileTriton, case: str, slot_free: Callable[[], bool]) -> None:
    """A stalled answer still arrives: its slot stays out of use until it does. Any other
    answer came whole, or was cut after Triton ran the request: the slot is back at once, or
    once Triton is proven done with it (an abandoned slot)."""
    if case == "stall":
        assert not slot_free(), "a slot was used again before Triton's answer arrived"
        hostile.release()
    wait_for(slot_free, timeout_s=10, what=f"the slot back after {case!r}")


@pytest.mark.parametrize("case", HTTP_CASES)
def test_http_each_hostile_answer_fails_by_name_then_the_next_call_answers(
    cued: HostileTriton, make_client: Callable[..., TritonSHMClient], case: str
) -> None:
    client = make_client(cued.grpc_url, http_url=cued.http_url, reconnect_timeout_s=RECONNECT_S)
    client.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)
    assert client.shm_stats("identity").protocol == "http"
    cued.cue(case)
    with pytest.raises(TritonSHMError):
        client.infer_shm("identity", {"INPUT0": rows(1)}, request_id="r-1")
    assert cued.answered >= 1
    check_slot_back(cued, case, lambda: settled(client, "identity"))
    cued.cue(None)
    x = rows(2)
    np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)


@pytest.mark.parametrize("case", CASES)
def test_http_async_each_hostile_answer_fails_by_name_within_its_deadline(
    cued: HostileTriton, make_client: Callable[..., TritonSHMClient], case: str
) -> None:
    client = make_client(cued.grpc_url, http_url=cued.http_url, reconnect_timeout_s=RECONNECT_S)
    client.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)

    async def call(seed: int) -> Any:
        x = {"INPUT0": rows(seed)}
        return await client.infer_shm_async(
            "identity", x, client_timeout_s=DEADLINE_S, request_id=f"r-{seed}"
        )

    cued.cue(case)
    with pytest.raises(TritonSHMError):
        asyncio.run(call(1))
    check_slot_back(cued, case, lambda: settled(client, "identity"))
    cued.cue(None)
    np.testing.assert_array_equal(asyncio.run(call(2))["OUTPUT0"], rows(2))


@pytest.mark.parametrize("case", CASES)
def test_grpc_each_hostile_answer_fails_by_name_within_its_deadline(
    cued: HostileTriton, make_client: Callable[..., TritonSHMClient], case: str
) -> None:
    client = make_client(cued.grpc_url, http_url=None, reconnect_timeout_s=RECONNECT_S)
    client.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)
    cued.cue(case)
    with pytest.raises(TritonSHMError):
        x = {"INPUT0": rows(1)}
        client.infer_shm("identity", x, request_id="r-1", client_timeout_s=DEADLINE_S)
    assert cued.answered >= 1
    check_slot_back(cued, case, lambda: settled(client, "identity"))
    cued.cue(None)
    x = rows(2)
    np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)


def caption(seed: int, count: int) -> dict[str, np.ndarray]:
    picture = np.random.default_rng(seed).random((3, 224, 224), dtype=np.float32)
    return {
        "IMAGE": picture,
        "COUNT": np.array([count], np.int32),
        "DELAY_US": np.array([0], np.int32),
    }


@pytest.mark.parametrize("case", CASES)
def test_a_stream_fails_by_name_on_each_hostile_answer(
    cued: HostileTriton, make_client: Callable[..., TritonSHMClient], case: str
) -> None:
    client = make_client(cued.grpc_url, reconnect_timeout_s=RECONNECT_S)
    client.register_shm_model("captioner", pool_size=1)
    cued.cue(case)
    with pytest.raises(TritonSHMError):
        list(
            client.stream("captioner", caption(1, 3), client_timeout_s=DEADLINE_S, request_id="s-1")
        )
    check_slot_back(cued, case, lambda: settled(client, "captioner"))
    cued.cue(None)
    responses = list(client.stream("captioner", caption(2, 3), request_id="s-2"))
    assert [int(r["TOKEN"][0]) for r in responses] == [0, 1, 2]
    feature = caption(2, 3)["IMAGE"].reshape(-1)
    np.testing.assert_array_equal(responses[1]["FEATURE"], feature[4:8])


# --- ShmModel in a Ray task -----------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_node(ray_local: str, hostile: HostileTriton) -> Iterator[Any]:
    """The node actor, on the hostile Triton (its calls pass through: none is inference)."""
    actor = get_node_actor(url=hostile.grpc_url, slots=4)
    try:
        yield actor
    finally:
        end_node_actor()  # before the hostile Triton stops: it unregisters through it


def infer_in_task(model: ShmModel, seed: int, request_id: str) -> tuple[str, Any]:
    """What one call of ``model`` in a Ray task came to: ``("ok", outputs)``, or
    ``("named", kind)`` for the library's error, ``("unnamed", repr)`` for any other."""

    @ray.remote(num_cpus=0)
    def call() -> tuple[str, Any]:  # defined here: pickled by value, not by this module
        x = np.random.default_rng(seed).random((2, 16), dtype=np.float32)
        try:
            return "ok", model.infer({"INPUT0": x})["OUTPUT0"]
        except TritonSHMError as exc:
            return "named", type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - what the test must never see
            return "unnamed", repr(exc)

    return ray.get(call.remote(), timeout=60)  # type: ignore[no-any-return]


#: In a task, the catch-up above takes its 5 s: one output case there (the core tests have all).
TASK_CASES = ("garbage", "close", "stall", "other_id", "shape")


@pytest.mark.parametrize(("case", "over"), [
    ("garbage", "grpc"), ("other_id", "http"),  # make test: the core tests have every case
    *(pytest.param(c, "grpc", marks=pytest.mark.soak) for c in TASK_CASES[1:]),
    pytest.param("garbage", "http", marks=pytest.mark.soak),
])  # fmt: skip
def test_shm_model_in_a_task_fails_by_name_and_the_node_actor_lives_on(
    cued: HostileTriton, hostile_node: Any, case: str, over: str
) -> None:
    before = ray.get(hostile_node.stats.remote())
    model = ShmModel(
        "identity",
        max_shapes=SHAPES,
        pool_size=2,
        url=cued.grpc_url,
        reconnect_timeout_s=RECONNECT_S,
        # Over HTTP a blocking call has no deadline; with one, it goes over gRPC.
        client_timeout_s=DEADLINE_S if over == "grpc" else None,
        client_options={"http_url": cued.http_url if over == "http" else None},
    )
    cued.cue(case)
    kind, what = infer_in_task(model, 1, "t-1")
    assert kind == "named", what

    def slots_back() -> bool:
        stats = ray.get(hostile_node.stats.remote()).models["identity"]
        return stats["in_use"] == 0 and stats["abandoned"] == 0

    check_slot_back(cued, case, slots_back)
    cued.cue(None)
    kind, out = infer_in_task(model, 2, "t-2")
    assert kind == "ok", out
    np.testing.assert_array_equal(out, rows(2))
    assert ray.get(hostile_node.stats.remote()).incarnation == before.incarnation
