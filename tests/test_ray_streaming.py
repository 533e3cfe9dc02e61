"""Streaming models through ``ShmModel`` on a real local Ray and a real Triton: streams in
tasks, in an async actor and in a Serve deployment read over HTTP, on the node's slots.

The example model ``captioner`` answers a request with COUNT responses, response k carrying
TOKEN = k and FEATURE = the request's image at 4k..4k+3, so every response is checked against
its own request's image. A paced endless-looking stream (``LONG``: 10,000 responses 0.1 s
apart) can only have ended early by being cancelled in Triton.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import requests
import yaml
from _helpers import free_ports, node_actor_of_module, wait_for
from ray import cloudpickle, serve

from ray_triton_shm import (
    SlotTimeoutError,
    StreamingModelError,
    StreamResponse,
    TritonServerError,
)
from ray_triton_shm.ray import ShmModel

#: The repository root, where ``deployments/`` lives (not part of the installed package).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deployments.captioner import (  # noqa: E402
    CaptionerDeployment,
    model_inputs,
    synthetic_image,
)

# Ship this module's functions and actor classes by value (workers cannot import it).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODEL = "captioner"
#: The model's slots on the node: streams in flight there at once.
POOL = 16
#: A stream that ends early only when cancelled in Triton (it would last 1,000 s).
LONG = {"count": 10_000, "delay_us": 100_000}
ROUTE = "/caption"


def image(seed: int) -> np.ndarray:
    return synthetic_image(seed)


def check(responses: list[Any], picture: np.ndarray, count: int) -> None:
    """Every response is the right one of this request's, in order (``StreamResponse`` or
    the app's lines)."""
    flat = picture.reshape(-1)
    indexes = [r.index if isinstance(r, StreamResponse) else r["index"] for r in responses]
    assert indexes == list(range(count))
    for k, response in enumerate(responses):
        start = (4 * k) % (flat.size - 3)
        if isinstance(response, StreamResponse):
            assert response["TOKEN"].tolist() == [k] and not response.final, response
            np.testing.assert_array_equal(response["FEATURE"], flat[start : start + 4])
        else:
            assert response["token"] == k, response
            np.testing.assert_array_equal(
                np.asarray(response["feature"], np.float32), flat[start : start + 4]
            )


@pytest.fixture(scope="module")
def node_actor(ray_local: str) -> Iterator[Any]:
    with node_actor_of_module() as actor:
        yield actor


@pytest.fixture(scope="module")
def model(node_actor: Any) -> Iterator[ShmModel]:
    """The streaming model on the node, with a fixed pool (registered here, in the driver)."""
    handle = ShmModel(MODEL, pool_size=POOL)
    assert handle.spec.decoupled and handle.zero_copy
    try:
        yield handle
    finally:
        handle.close()


def captioner_stats(node_actor: Any) -> dict[str, Any]:
    return ray.get(node_actor.stats.remote()).models[MODEL]  # type: ignore[no-any-return]


def slots_back(node_actor: Any) -> dict[str, Any] | None:
    """The model's stats once no slot of it is in use, abandoned or waited for."""
    stats = captioner_stats(node_actor)
    idle = stats["in_use"] == stats["abandoned"] == stats["waiting"] == 0
    return stats if idle else None


# --------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------


@ray.remote(num_cpus=0)
def stream_in_task(
    model: ShmModel, seed: int, count: int, delay_us: int = 0
) -> tuple[list[StreamResponse], BaseException | None, int]:
    """The responses of one stream in a task, the error that ended it (if any), its pid."""
    got: list[StreamResponse] = []
    try:
        for response in model.stream(model_inputs(image(seed), count, delay_us)):
            got.append(response)
    except TritonServerError as exc:
        return got, exc, os.getpid()
    return got, None, os.getpid()


def test_a_stream_in_a_task_yields_every_response_in_order(
    model: ShmModel, node_actor: Any
) -> None:
    before = captioner_stats(node_actor)
    many, none, failed = ray.get(
        [
            stream_in_task.remote(model, 1, 12),
            stream_in_task.remote(model, 2, 0),
            stream_in_task.remote(model, 3, -3),
        ]
    )
    assert many[1] is None and many[2] != os.getpid()
    check(many[0], image(1), 12)
    assert none[0] == [] and none[1] is None  # no response: the end alone, observed
    check(failed[0], image(3), 3)  # what came before the model's error, then the error
    assert isinstance(failed[1], TritonServerError)
    assert failed[1].server_message == "captioner failed after 3 responses (COUNT < 0)"
    stats = wait_for(lambda: slots_back(node_actor), what="every slot back")
    assert stats["requests"] - before["requests"] == 2  # counted where they end
    assert stats["errors"] - before["errors"] == 1
    assert stats["transport"] == "shm", stats["transport_reason"]


@ray.remote(num_cpus=0)
class Gate:
    """All ``parties`` pass together (a barrier across processes)."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.open = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived == self.parties:
            self.open.set()
        await self.open.wait()


@ray.remote(num_cpus=0)
def streams_in_threads(model: ShmModel, gate: Any, seeds: list[int]) -> tuple[int, int]:
    """A stream per seed, each on a thread of its own, all started at once after every task
    bound; each checked against its own image. Returns the responses and the Ray calls made
    meanwhile."""
    from ray.actor import ActorMethod

    model.spec  # noqa: B018  # binds: the only calls to the node actor
    ray.get(gate.wait.remote())
    calls = 0
    remote = ActorMethod._remote

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return remote(self, *args, **kwargs)

    ActorMethod._remote = counted  # type: ignore[method-assign]
    start = threading.Barrier(len(seeds))

    def one(seed: int) -> int:
        picture, count = image(seed), 6 + seed % 7
        start.wait()
        responses = list(model.stream(model_inputs(picture, count, 3000)))
        check(responses, picture, count)
        return len(responses)

    try:
        with ThreadPoolExecutor(len(seeds)) as pool:
            delivered = sum(pool.map(one, seeds))
    finally:
        ActorMethod._remote = remote  # type: ignore[method-assign]
    return delivered, calls


def test_sixteen_concurrent_streams_from_tasks_never_cross(
    model: ShmModel, node_actor: Any
) -> None:
    """4 tasks x 4 threads: 16 streams on the node's 16 slots at once, interleaved over
    the model's pace; no response reaches another stream, and no Ray call is made."""
    before = captioner_stats(node_actor)
    gate = Gate.remote(4)
    seeds = [list(range(task * 4, task * 4 + 4)) for task in range(4)]
    results = ray.get([streams_in_threads.remote(model, gate, s) for s in seeds], timeout=120)
    assert sum(delivered for delivered, _ in results) == sum(6 + s % 7 for s in range(16))
    assert [calls for _, calls in results] == [0, 0, 0, 0]
    stats = wait_for(lambda: slots_back(node_actor), what="every slot back")
    assert stats["requests"] - before["requests"] == 16
    assert stats["errors"] == before["errors"]
    ray.kill(gate)


# --------------------------------------------------------------------------------------
# An async actor
# --------------------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_concurrency=8)
class AsyncStreamer:
    def __init__(self, model: ShmModel) -> None:
        self.model = model

    async def streams(self, seeds: list[int]) -> list[int]:
        """Streams of ``seeds`` at once on the actor's loop, each checked."""

        async def one(seed: int) -> int:
            picture, count = image(seed), 3 + seed % 5
            inputs = model_inputs(picture, count, 2000)
            responses = [r async for r in self.model.stream_async(inputs)]
            check(responses, picture, count)
            return len(responses)

        return list(await asyncio.gather(*map(one, seeds)))

    async def stop_after(self, seed: int, responses: int) -> int:
        """A long stream left after ``responses`` (``aclose()``)."""
        stream = self.model.stream_async(model_inputs(image(seed), **LONG))
        got = [await anext(stream) for _ in range(responses)]
        await stream.aclose()  # type: ignore[attr-defined]
        check(got, image(seed), responses)
        return len(got)


def test_stream_async_in_an_async_actor_and_aclose_cancels_in_triton(
    model: ShmModel, node_actor: Any
) -> None:
    streamer = AsyncStreamer.remote(model)
    seeds = list(range(20, 28))
    assert ray.get(streamer.streams.remote(seeds)) == [3 + s % 5 for s in seeds]
    assert ray.get(streamer.stop_after.remote(30, 3)) == 3
    # The stream would last 1,000 s: its slot is back only because Triton ended it early.
    wait_for(lambda: slots_back(node_actor), timeout_s=60, what="the slot of the closed stream")
    ray.kill(streamer)


# --------------------------------------------------------------------------------------
# A caller killed mid-stream
# --------------------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_concurrency=2)
class Streamer:
    def __init__(self, model: ShmModel) -> None:
        self.model = model
        self.delivered = 0

    def progress(self) -> int:
        return self.delivered

    def run(self, seed: int) -> None:
        for _ in self.model.stream(model_inputs(image(seed), **LONG)):
            self.delivered += 1


def test_a_caller_killed_mid_stream_gives_its_slot_back(model: ShmModel, node_actor: Any) -> None:
    before = ray.get(node_actor.stats.remote())
    streamer = Streamer.remote(model)
    running = streamer.run.remote(40)
    wait_for(
        lambda: ray.get(streamer.progress.remote()) >= 2,
        timeout_s=60,
        what="the stream to get going",
    )
    assert captioner_stats(node_actor)["in_use"] == 1
    ray.kill(streamer)  # SIGKILL mid-stream: nothing released, its connection to Triton cut
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(running, timeout=60)
    # Abandoned, not free, until Triton is proven done with the request (it ends it early:
    # the stream was cancelled with the connection).
    stats = wait_for(lambda: slots_back(node_actor), timeout_s=60, what="the killed stream's slot")
    assert stats["abandoned_requests"] - before.models[MODEL]["abandoned_requests"] == 1
    assert ray.get(node_actor.stats.remote()).incarnation == before.incarnation
    check(list(model.stream(model_inputs(image(41), 2))), image(41), 2)  # it serves on


# --------------------------------------------------------------------------------------
# Backpressure, and unary calls refused
# --------------------------------------------------------------------------------------


def test_held_streams_hold_the_slots_and_infer_is_refused_before_any(
    model: ShmModel, node_actor: Any
) -> None:
    """Every slot held by a stream: one more waits for a slot (and times out), while
    ``infer``, ``infer_async`` and ``lease`` are refused at once: they never ask for one."""
    held = [model.stream(model_inputs(image(50 + i), **LONG)) for i in range(POOL)]
    try:
        for i, stream in enumerate(held):
            check([next(stream)], image(50 + i), 1)  # its first response: its slot is held
        stats = captioner_stats(node_actor)
        assert stats["in_use"] == POOL and stats["slots"] == POOL
        with pytest.raises(SlotTimeoutError):
            next(model.options(slot_timeout_s=0.2).stream(model_inputs(image(0), 1)))
        # With a slot to wait for, a refusal would come as SlotTimeoutError instead.
        waiting = model.options(slot_timeout_s=30)
        inputs = model_inputs(image(0), 1)
        with pytest.raises(StreamingModelError, match=r"streaming model.*call stream\("):
            waiting.infer(inputs)
        with pytest.raises(StreamingModelError):
            asyncio.run(waiting.infer_async(inputs))
        with pytest.raises(StreamingModelError), waiting.lease():
            pass
        assert captioner_stats(node_actor)["waiting"] == 0
    finally:
        for stream in held:
            stream.close()  # type: ignore[attr-defined]
    wait_for(lambda: slots_back(node_actor), timeout_s=60, what="every held stream's slot")


# --------------------------------------------------------------------------------------
# Serve: a deployment that streams (deployments/captioner.py)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def captioner_app(model: ShmModel) -> Iterator[tuple[str, Any]]:
    """The example streaming app on a free port: its URL and its handle."""
    (port,) = free_ports(1)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        handle = serve.run(
            CaptionerDeployment.options(ray_actor_options={"num_cpus": 0.5}).bind(pool_size=POOL),
            name="captioner",
            route_prefix=ROUTE,
        )
        yield f"http://127.0.0.1:{port}{ROUTE}", handle
    finally:
        serve.shutdown()


def _lines(response: requests.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        yield json.loads(line)


def test_serve_streams_over_http_chunk_by_chunk(
    captioner_app: tuple[str, Any], node_actor: Any
) -> None:
    url, _ = captioner_app
    with requests.post(url, json={"seed": 5, "count": 9}, stream=True, timeout=60) as answer:
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        check(list(_lines(answer)), image(5), 9)
    # A stream of 1,000 s read line by line: each came as the model sent it, not at the end.
    with requests.post(url, json={"seed": 6, **LONG}, stream=True, timeout=60) as answer:
        lines = _lines(answer)
        check([next(lines) for _ in range(3)], image(6), 3)
        assert captioner_stats(node_actor)["in_use"] == 1
    # The client went away: Serve cancels the replica's stream, which cancels it in Triton.
    wait_for(lambda: slots_back(node_actor), timeout_s=60, what="the left stream's slot")


def test_serve_streams_errors_as_a_line_and_refuses_bad_requests(
    captioner_app: tuple[str, Any],
) -> None:
    url, _ = captioner_app
    answer = requests.post(url, json={"seed": 7, "count": -2}, timeout=60)
    assert answer.status_code == 200
    *responses, error = [json.loads(line) for line in answer.text.splitlines()]
    check(responses, image(7), 2)
    assert error["delivered"] == 2 and "captioner failed after 2 responses" in error["error"]
    empty = requests.post(url, json={"seed": 7, "count": 0}, timeout=60)
    assert empty.status_code == 200 and empty.text == ""
    bad = requests.post(url, json={"count": "many"}, timeout=60)
    assert bad.status_code == 400 and "'count' must be an integer" in bad.json()["error"]
    buffer = io.BytesIO()
    np.save(buffer, image(9))
    own = requests.post(
        f"{url}?count=3",
        data=buffer.getvalue(),
        headers={"Content-Type": "application/x-npy"},
        timeout=60,
    )
    assert own.status_code == 200, own.text
    check([json.loads(line) for line in own.text.splitlines()], image(9), 3)


def test_serve_streams_to_a_streaming_handle(captioner_app: tuple[str, Any]) -> None:
    _, handle = captioner_app
    lines = handle.options(stream=True).captions.remote(image(8), 5)
    check(list(lines), image(8), 5)


def test_the_serve_config_runs_this_app() -> None:
    config = yaml.safe_load((ROOT / "deployments" / "captioner.yaml").read_text())
    (app,) = config["applications"]
    assert app["import_path"] == "deployments.captioner:app"
    assert app["route_prefix"] == ROUTE
    assert [d["name"] for d in app["deployments"]] == [CaptionerDeployment.name]
