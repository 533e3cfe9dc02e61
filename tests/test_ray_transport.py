"""The transport of the Ray layer, on a real local Ray: the node actor's Triton in a mount
namespace of its own (a ``/dev/shm`` of its own, as a container without ``--ipc=host``), so
that every model goes by value; tasks, an async Serve deployment and a Ray Data job answer
right, straight to Triton, with no Ray call per request. Then what ``transport=`` asks for:
``"shm"`` where Triton cannot map it, an unknown value, and ``"inline"`` where it could.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import ray
from _helpers import (
    end_node_actor,
    free_ports,
    our_regions,
    registered_on,
    wait_for,
)
from ray.core.generated import common_pb2

from ray_triton_shm import ModelSpecError, SharedMemoryUnreachableError
from ray_triton_shm._slots._shm import list_local_regions
from ray_triton_shm.local._server import LocalTritonServer
from ray_triton_shm.ray import ShmModel, ShmPredictor, get_node_actor
from ray_triton_shm.ray._ray_internals import task_events_of

# Tasks, replicas and predictors of this module are shipped by value: workers cannot import it.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}
#: The node actor's slots: the most requests in flight per model on the node.
SLOTS = 4
#: The state of a task event its caller records as it submits the task.
SUBMITTED: int = common_pb2.TaskStatus.Value("PENDING_ARGS_AVAIL")  # type: ignore[attr-defined]


def _end(actor: Any) -> None:
    """Shuts the node actor down and kills it, unless it is gone already; fails if a region
    of it survived."""
    try:
        pid = ray.get(actor.stats.remote(), timeout=60).pid
    except ray.exceptions.RayActorError:
        return
    ray.get(actor.shutdown.remote(), timeout=60)
    ray.kill(actor)
    assert [r.name for r in list_local_regions() if r.owner.pid == pid] == []


@pytest.fixture(scope="module")
def far_actor(ray_local: str, triton_elsewhere: LocalTritonServer) -> Iterator[Any]:
    """This node's actor, whose Triton is the one elsewhere (``triton_elsewhere``)."""
    end_node_actor()
    actor = get_node_actor(url=triton_elsewhere.grpc_url, slots=SLOTS)
    try:
        yield actor
    finally:
        _end(actor)
        assert registered_on(triton_elsewhere.grpc_url) == set()


# ---------------------------------------------------------------- the node actor's calls


def mark_calls(actor: Any) -> bytes:
    """Calls the node actor from this process, after its other calls; returns the call's task
    id (see :func:`actor_calls`)."""
    ref = actor.stats.remote()
    ray.get(ref, timeout=60)
    return ref.task_id().binary()  # type: ignore[no-any-return]


def actor_calls(actor: Any, since_ns: int, until_ns: int, marks: Collection[bytes]) -> list[str]:
    """The names of the node actor's tasks (its method calls) submitted between ``since_ns``
    and ``until_ns`` (``time.time_ns()``), but the ``marks``, as Ray's task events in the GCS
    record them: the table the state API (``ray list tasks``, ``ray.util.state.list_tasks``)
    serves through the dashboard, which the shared Ray of the tests runs without.

    A process reports the calls it makes in order, in batches: once the GCS has its last call
    (its mark, of :func:`mark_calls`), it has every earlier one. So this waits until every
    mark is there, one per process that may have called the actor.
    """

    def reported() -> list[Any]:  # empty until every mark is there
        events = task_events_of(actor)
        return events if set(marks) <= {e.task_id for e in events} else []

    events = wait_for(reported, timeout_s=60, what="the calls to the node actor in the GCS")
    calls = {}
    for event in events:
        submitted = event.state_updates.state_ts_ns.get(SUBMITTED, 0)
        if event.task_id not in marks and since_ns <= submitted <= until_ns:
            calls[event.task_id, event.attempt_number] = event.task_info.name
    return sorted(calls.values())


# ---------------------------------------------------------------- by value, in every form


@ray.remote(num_cpus=0)
def call_identity(url: str, seed: int, calls: int, threads: int = 1) -> dict[str, Any]:
    """``calls`` calls of ``identity`` in each of ``threads`` threads of a task; what its
    handle says of its transport, and how many answers were wrong."""
    import threading

    model = ShmModel("identity", url=url, max_shapes=SHAPES)
    wrong: list[int] = []

    def loop(thread: int) -> None:
        rng = np.random.default_rng([seed, thread])
        for _ in range(calls):
            x = rng.standard_normal((int(rng.integers(1, 20)), 16), dtype=np.float32)
            if not np.array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x):
                wrong.append(thread)

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stats = model.shm_stats()
    result = {
        "wrong": len(wrong),
        "transport": stats.transport,
        "reason": stats.transport_reason,
        "zero_copy": model.zero_copy,
        "in_use": stats.in_use,
        "pid": os.getpid(),
    }
    model.close()
    result["left"] = [r.name for r in list_local_regions() if r.owner.pid == os.getpid()]
    result["mark"] = mark_calls(get_node_actor(url=url))
    return result


def test_tasks_answer_by_value_from_a_triton_with_its_own_dev_shm(
    far_actor: Any, triton_elsewhere: LocalTritonServer
) -> None:
    url = triton_elsewhere.grpc_url
    # More threads than the node's slots, in two processes at once.
    results = ray.get([call_identity.remote(url, seed, 6, threads=6) for seed in range(2)])
    for result in results:
        assert result["wrong"] == 0 and result["in_use"] == 0, result
        assert result["transport"] == "inline" and not result["zero_copy"], result
        assert "could not open /dev/shm/" in result["reason"], result
        assert result["left"] == [], result  # close() detached it from the node's region
    stats = ray.get(far_actor.stats.remote())
    assert stats.url == url
    model = stats.models["identity"]
    assert model["transport"] == "inline", model
    assert "could not open /dev/shm/" in model["transport_reason"]
    assert url in model["transport_reason"]
    assert model["in_use"] == model["waiting"] == 0
    assert registered_on(url) == set()  # nothing of the node in that Triton


def test_the_handle_and_the_node_actor_agree_on_a_model_by_value(
    far_actor: Any, triton_elsewhere: LocalTritonServer
) -> None:
    """In the driver as in the node actor: the region's ``/dev/shm`` bytes are the same
    figure, every request of the model counts as one by value, and once one ran, the
    handle's requests go over Triton's HTTP endpoint, proven the same Triton."""
    url = triton_elsewhere.grpc_url
    model = ShmModel("identity", url=url, max_shapes=SHAPES)
    try:
        before = ray.get(far_actor.stats.remote()).models.get("identity", {})
        calls = 5
        for seed in range(calls):
            x = np.random.default_rng(seed).standard_normal((3, 16), dtype=np.float32)
            np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
        here = model.shm_stats()
        node = ray.get(far_actor.stats.remote()).models["identity"]
        assert here.transport == node["transport"] == "inline", (here, node)
        assert here.shm_bytes == node["shm_bytes"] > 0, (here, node)
        assert node["by_value_requests"] == node["requests"], node
        assert node["requests"] - before.get("requests", 0) >= calls, node
        assert here.protocol == "http" and "proven the same" in here.protocol_reason, here
    finally:
        model.close()


def test_calls_by_value_make_no_ray_call_per_request(
    far_actor: Any, triton_elsewhere: LocalTritonServer
) -> None:
    """A task binds (a call or two to the node actor), then calls Triton itself: a task of
    60 requests costs the actor no more calls than one of 1."""
    url = triton_elsewhere.grpc_url
    rounds = []
    for seed, calls, threads in [(10, 1, 1), (11, 30, 2)]:
        since = time.time_ns()
        result = ray.get(call_identity.remote(url, seed, calls, threads))
        assert result["wrong"] == 0 and result["transport"] == "inline", result
        rounds.append(actor_calls(far_actor, since, time.time_ns(), [result["mark"]]))
    one, many = rounds
    assert "TritonNodeActor.register" in one and len(one) <= 3, one  # binding
    assert len(many) <= len(one), many
    assert not any(name.endswith(".infer") for name in one + many), rounds


@pytest.mark.soak  # the soak tier (CI runs it after make test): make test stays under 12 min
def test_an_async_serve_deployment_answers_by_value_with_no_actor_call(
    far_actor: Any, triton_elsewhere: LocalTritonServer
) -> None:
    from ray import serve

    url = triton_elsewhere.grpc_url

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Echo:
        def __init__(self, url: str) -> None:
            self.url = url
            self.model = ShmModel("identity", url=url, max_shapes=SHAPES)

        async def __call__(self, x: np.ndarray) -> np.ndarray:
            return (await self.model.infer_async({"INPUT0": x}))["OUTPUT0"]

        def transport(self) -> tuple[str, str, bool]:
            stats = self.model.shm_stats()
            return stats.transport, stats.transport_reason, self.model.zero_copy

        def mark(self) -> bytes:
            return mark_calls(get_node_actor(url=self.url))

    (port,) = free_ports(1)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        start = time.time_ns()
        handle = serve.run(Echo.bind(url), name="by-value", route_prefix=None)  # type: ignore[attr-defined]
        rng = np.random.default_rng(3)
        first = rng.standard_normal((2, 16), dtype=np.float32)
        np.testing.assert_array_equal(handle.remote(first).result(timeout_s=120), first)  # binds
        marks = [handle.mark.remote().result(timeout_s=60)]
        bound = time.time_ns()
        inputs = [rng.standard_normal((1 + i % 19, 16), dtype=np.float32) for i in range(24)]
        responses = [handle.remote(x) for x in inputs]  # 24 at once on 4 slots
        for x, response in zip(inputs, responses):
            np.testing.assert_array_equal(response.result(timeout_s=120), x)
        transport, reason, zero_copy = handle.transport.remote().result(timeout_s=60)
        marks.append(handle.mark.remote().result(timeout_s=60))
        done = time.time_ns()
    finally:
        serve.shutdown()
    assert transport == "inline" and not zero_copy and "could not open /dev/shm/" in reason
    binding = actor_calls(far_actor, start, bound, marks)
    assert "TritonNodeActor.register" in binding, binding  # the replica's calls are seen
    assert actor_calls(far_actor, bound, done, marks) == []  # 24 calls, none to the actor


class RecordingPredictor(ShmPredictor):
    """Also says, per row, how the worker's batch reached Triton."""

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().__call__(batch)
        out["transport"] = np.array([self.transport] * len(batch["id"]))
        return out


def _rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ids = batch["id"]
    x = np.arange(16, dtype=np.float32) * ids[:, None] - ids[:, None]
    return {"id": ids, "x": x.astype(np.float32)}


def test_shm_predictor_in_ray_data_answers_every_row_by_value(
    far_actor: Any, triton_elsewhere: LocalTritonServer
) -> None:
    rows = 40
    ds = ray.data.range(rows, override_num_blocks=2).map_batches(_rows, batch_format="numpy")
    out = ds.map_batches(
        RecordingPredictor,
        fn_constructor_kwargs={
            "model_name": "identity",
            "url": triton_elsewhere.grpc_url,
            "max_shapes": SHAPES,
            "input_columns": {"x": "INPUT0"},
            "output_columns": {"OUTPUT0": "y"},
            "keep_columns": ["id", "x"],
        },
        batch_format="numpy",
        batch_size=12,  # more than identity's max_batch_size (8): two requests a batch
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=0,
    )
    taken = out.take_batch(rows, batch_format="numpy")
    order = np.argsort(taken["id"])
    assert taken["id"][order].tolist() == list(range(rows))
    np.testing.assert_array_equal(taken["y"][order], taken["x"][order])
    np.testing.assert_array_equal(taken["x"][order], _rows({"id": np.arange(rows)})["x"])
    assert set(taken["transport"].tolist()) == {"inline"}


# ---------------------------------------------------------------- what transport= asks for


def test_transport_shm_where_triton_cannot_map_raises_naming_model_and_node(
    far_actor: Any, triton_elsewhere: LocalTritonServer
) -> None:
    model = ShmModel("identity", url=triton_elsewhere.grpc_url, max_shapes=SHAPES, transport="shm")
    with pytest.raises(SharedMemoryUnreachableError) as info:
        model.infer({"INPUT0": np.ones((1, 16), np.float32)})
    error = info.value
    assert error.model == "identity" and error.node == socket.gethostname()
    assert "could not open /dev/shm/" in error.reason
    assert "'identity'" in str(error) and socket.gethostname() in str(error)
    assert our_regions(os.getpid()) == set()  # this process attached nothing
    with pytest.raises(SharedMemoryUnreachableError):
        _ = model.zero_copy
    # The model goes on by value for those who let it.
    assert ray.get(call_identity.remote(triton_elsewhere.grpc_url, 20, 2))["wrong"] == 0


def test_an_unknown_transport_is_refused_where_it_is_given(ray_local: str) -> None:
    with pytest.raises(ModelSpecError, match="'bogus'") as info:
        ShmModel("identity", transport="bogus")
    assert info.value.model == "identity" and "'identity'" in str(info.value)
    with pytest.raises(ModelSpecError, match="'bogus'"):
        ShmPredictor("identity", transport="bogus")
    with pytest.raises(ModelSpecError, match="'bogus'"):
        get_node_actor(transport="bogus")


@pytest.fixture
def near_actor(far_actor: Any, ray_local: str) -> Iterator[Any]:
    """This node's actor again, now on the session's Triton, which maps its memory."""
    _end(far_actor)
    registered = registered_on(ray_local)
    actor = get_node_actor(url=ray_local, slots=SLOTS)
    try:
        yield actor
    finally:
        _end(actor)
        assert registered_on(ray_local) - registered == set()


@ray.remote(num_cpus=0)
def inline_and_auto(url: str) -> dict[str, Any]:
    """Calls ``identity`` through a handle by value and one as the node found."""
    rng = np.random.default_rng(5)
    found = {}
    for transport in ("inline", "auto"):
        model = ShmModel("identity", url=url, max_shapes=SHAPES, transport=transport)
        wrong = 0
        for rows in (1, 8, 19):
            x = rng.standard_normal((rows, 16), dtype=np.float32)
            wrong += not np.array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
        stats = model.shm_stats()
        found[transport] = (wrong, stats.transport, stats.transport_reason, model.zero_copy)
        model.close()
    return found


def test_inline_asked_for_goes_by_value_where_triton_maps_shm(
    near_actor: Any, ray_local: str
) -> None:
    found = ray.get(inline_and_auto.remote(ray_local))
    wrong, transport, reason, zero_copy = found["inline"]
    assert wrong == 0 and transport == "inline" and not zero_copy
    assert "transport='inline' was asked for" in reason
    wrong, transport, reason, zero_copy = found["auto"]
    assert wrong == 0 and transport == "shm" and zero_copy and "landed" in reason
    model = ray.get(near_actor.stats.remote()).models["identity"]
    assert model["transport"] == "shm" and "landed" in model["transport_reason"], model
    assert model["in_use"] == 0
    # A handle's own transport="inline" on the node's slots counts in requests alone.
    assert model["requests"] > 0 and model["by_value_requests"] == 0, model
