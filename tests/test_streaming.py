"""Streaming (decoupled) models through the core client, against a real Triton: the example
model ``captioner`` answers a request with COUNT responses, response k carrying TOKEN = k and
FEATURE = the request's image at 4k..4k+3, so every response is checked against its own
request."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import (
    in_threads,
    local_triton,
    model_repository,
    our_regions,
    registered_on,
    runs_in_triton,
    wait_for,
)

from ray_triton_shm import (
    ClientClosedError,
    InvalidInputError,
    StreamingModelError,
    StreamInterruptedError,
    StreamResponse,
    TritonServerError,
    TritonSHMClient,
)
from ray_triton_shm._client import registry_of
from ray_triton_shm.local import LocalTritonServer

MODEL = "captioner"


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((3, 224, 224), dtype=np.float32)


def request(picture: np.ndarray, count: int, delay_us: int = 0) -> dict[str, np.ndarray]:
    return {
        "IMAGE": picture,
        "COUNT": np.array([count], np.int32),
        "DELAY_US": np.array([delay_us], np.int32),
    }


def check(responses: list[StreamResponse], picture: np.ndarray, count: int) -> None:
    """Every response is the right one of this request's, in order."""
    flat = picture.reshape(-1)
    assert [r.index for r in responses] == list(range(count))
    for k, response in enumerate(responses):
        start = (4 * k) % (flat.size - 3)
        assert response["TOKEN"].tolist() == [k], response
        np.testing.assert_array_equal(response["FEATURE"], flat[start : start + 4])
        assert response.final is False  # the model ends with an empty final response


def slots_free(client: TritonSHMClient) -> bool:
    stats = client.shm_stats(MODEL)
    return stats.in_use == 0 and stats.abandoned == 0


@pytest.fixture
def streams(grpc_url: str, make_client: Callable[..., TritonSHMClient]) -> TritonSHMClient:
    client = make_client(grpc_url)
    client.register_shm_model(MODEL, pool_size=4)
    return client


@pytest.fixture
def one_slot(grpc_url: str, make_client: Callable[..., TritonSHMClient]) -> TritonSHMClient:
    client = make_client(grpc_url)
    client.register_shm_model(MODEL, pool_size=1)
    return client


def test_a_stream_yields_every_response_in_order_each_its_own(streams: TritonSHMClient) -> None:
    spec = streams.registered_models[MODEL]
    assert spec.decoupled and spec.inline_outputs == {"TOKEN", "FEATURE"}
    picture = image(1)
    responses = list(streams.stream(MODEL, request(picture, 7)))
    check(responses, picture, 7)
    assert slots_free(streams)
    stats = streams.shm_stats(MODEL)
    assert stats.transport == "shm" and stats.protocol == "grpc", stats


def test_no_response_ends_the_stream_with_the_end_seen(streams: TritonSHMClient) -> None:
    assert list(streams.stream(MODEL, request(image(2), 0))) == []
    assert slots_free(streams)


def test_requested_outputs_and_the_request_id_apply(streams: TritonSHMClient) -> None:
    responses = list(
        streams.stream(MODEL, request(image(3), 3), requested_outputs=["TOKEN"], request_id="r-3")
    )
    assert [set(r) for r in responses] == [{"TOKEN"}] * 3
    with pytest.raises(TritonServerError, match="request id 'r-9'") as failed:
        list(streams.stream(MODEL, request(image(3), -1), request_id="r-9"))
    assert "captioner failed after 1 responses" in failed.value.server_message


def test_an_error_response_mid_stream_fails_that_stream_after_what_came(
    streams: TritonSHMClient,
) -> None:
    picture, got = image(4), []
    with pytest.raises(TritonServerError) as failed:
        for response in streams.stream(MODEL, request(picture, -3)):
            got.append(response)
    check(got, picture, 3)
    assert "after 3 response(s)" in str(failed.value)
    assert failed.value.server_message == "captioner failed after 3 responses (COUNT < 0)"
    assert slots_free(streams)  # the error was Triton's final response: the slot is back
    check(list(streams.stream(MODEL, request(picture, 2))), picture, 2)


def test_sixteen_streams_on_four_slots_never_cross(streams: TritonSHMClient) -> None:
    def one(seed: int) -> None:
        for round_ in range(3):
            picture, count = image(seed * 10 + round_), 1 + (seed + round_) % 9
            check(list(streams.stream(MODEL, request(picture, count, 300))), picture, count)

    in_threads(one, range(16))
    assert slots_free(streams)


def test_sixteen_async_streams_interleave_and_never_cross(streams: TritonSHMClient) -> None:
    async def one(seed: int) -> None:
        picture, count = image(100 + seed), 2 + seed % 7
        got = [r async for r in streams.stream_async(MODEL, request(picture, count, 500))]
        check(got, picture, count)

    async def main() -> None:
        await asyncio.gather(*(one(seed) for seed in range(16)))

    asyncio.run(main())
    assert slots_free(streams)


def test_a_break_cancels_the_request_and_its_slot_waits_for_triton(
    one_slot: TritonSHMClient,
) -> None:
    picture = image(5)
    started = time.monotonic()
    responses = one_slot.stream(MODEL, request(picture, 50, 200_000))  # 10 s if left to run
    first = next(responses)
    responses.close()  # what a for loop's break does once the iterator is collected
    assert first.index == 0
    # Triton still holds the request (its model sleeps before it looks for a cancellation):
    # the slot is abandoned, not free, until Triton is proven done with it.
    assert one_slot.shm_stats(MODEL).abandoned == 1
    check(list(one_slot.stream(MODEL, request(picture, 2))), picture, 2)  # the one slot, again
    assert time.monotonic() - started < 5, "the cancelled request ran on in Triton"
    wait_for(lambda: slots_free(one_slot), what="the slot back")


def test_aclose_cancels_the_request_and_its_slot_waits_for_triton(
    one_slot: TritonSHMClient,
) -> None:
    picture = image(6)

    async def main() -> float:
        started = time.monotonic()
        responses = one_slot.stream_async(MODEL, request(picture, 50, 200_000))
        first = await responses.__anext__()
        assert first.index == 0
        await responses.aclose()  # type: ignore[attr-defined]
        assert one_slot.shm_stats(MODEL).abandoned == 1
        got = [r async for r in one_slot.stream_async(MODEL, request(picture, 2))]
        check(got, picture, 2)
        return time.monotonic() - started

    assert asyncio.run(main()) < 5, "the cancelled request ran on in Triton"
    wait_for(lambda: slots_free(one_slot), what="the slot back")


def test_a_cancelled_task_cancels_its_stream(one_slot: TritonSHMClient) -> None:
    picture = image(7)

    async def main() -> None:
        first = asyncio.Event()

        async def read() -> None:
            async for _ in one_slot.stream_async(MODEL, request(picture, 50, 200_000)):
                first.set()

        task = asyncio.ensure_future(read())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        got = [r async for r in one_slot.stream_async(MODEL, request(picture, 1))]
        check(got, picture, 1)

    asyncio.run(main())
    wait_for(lambda: slots_free(one_slot), what="the slot back")


#: How long a client's close() may take with a stream unfinished (it waited 30 s for the
#: stream's slot before the fix).
CLOSE_LIMIT_S = 10.0


@contextlib.contextmanager
def cancellations(server: LocalTritonServer) -> Iterator[Callable[[], int]]:
    """Counts the gRPC streams whose cancellation ``server`` completed while inside, from its
    verbose log: Triton saw the stream cancelled and is done with its request."""
    with runs_in_triton(server, MODEL):  # its log verbose meanwhile
        start = server.log_path.stat().st_size

        def completed() -> int:
            with server.log_path.open("rb") as log:
                log.seek(start)
                text = log.read().decode(errors="replace")
            return text.count("Completing cancellation for ModelStreamInferHandler")

        yield completed


def region_gone(regions: set[str], url: str) -> bool:
    """Whether none of ``regions`` is in ``/dev/shm`` or registered in the Triton at ``url``."""
    return not regions & (our_regions(os.getpid()) | registered_on(url))


def one_slot_client(
    triton: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> tuple[TritonSHMClient, set[str]]:
    """A client of ``MODEL`` on one slot, and the regions it made."""
    before = our_regions(os.getpid())
    client = make_client(triton.grpc_url)
    client.register_shm_model(MODEL, pool_size=1)
    regions = our_regions(os.getpid()) - before
    assert regions
    return client, regions


def test_close_with_a_stream_left_suspended_cancels_it_at_once_and_next_says_closed(
    triton: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> None:
    """Two responses read, then the generator left: close() cancels the stream in Triton at
    once (it waited 30 s for the slot), leaves nothing, and ``next`` says the client closed."""
    client, regions = one_slot_client(triton, make_client)
    picture = image(11)
    with cancellations(triton) as completed:
        responses = client.stream(MODEL, request(picture, 50, 200_000))  # 10 s if left to run
        got = [next(responses), next(responses)]  # then left, neither read nor closed
        check(got, picture, 2)
        assert client.shm_stats(MODEL).in_use == 1
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < CLOSE_LIMIT_S, "close() waited for the stream"
        wait_for(completed, timeout_s=CLOSE_LIMIT_S, what="Triton done with the cancelled stream")
    assert region_gone(regions, triton.grpc_url)
    with pytest.raises(ClientClosedError, match=r"after 2 response\(s\): its TritonSHMClient was"):
        next(responses)


def test_close_with_an_async_stream_left_suspended_cancels_it_and_anext_says_closed(
    triton: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> None:
    """The same with ``stream_async``, closed from the event loop's own thread."""
    client, regions = one_slot_client(triton, make_client)
    picture = image(12)

    async def main() -> float:
        responses = client.stream_async(MODEL, request(picture, 50, 200_000))
        check([await responses.__anext__()], picture, 1)
        started = time.monotonic()
        client.close()
        took = time.monotonic() - started
        with pytest.raises(ClientClosedError, match="its TritonSHMClient was closed"):
            await responses.__anext__()
        return took

    with cancellations(triton) as completed:
        assert asyncio.run(main()) < CLOSE_LIMIT_S, "close() waited for the stream"
        wait_for(completed, timeout_s=CLOSE_LIMIT_S, what="Triton done with the cancelled stream")
    assert region_gone(regions, triton.grpc_url)


def test_close_while_another_thread_waits_for_a_response_ends_its_stream_closed(
    triton: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> None:
    """A thread waits for the next response of a slow stream: close() cancels it, and the
    thread gets ``ClientClosedError`` instead of the rest."""
    client, regions = one_slot_client(triton, make_client)
    first, ended = threading.Event(), []

    def read() -> None:
        try:
            for _ in client.stream(MODEL, request(image(13), 10, 2_000_000)):  # 18 s
                first.set()
        except BaseException as exc:
            ended.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    with cancellations(triton) as completed:
        reader.start()
        assert first.wait(30)
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < CLOSE_LIMIT_S, "close() waited for the stream"
        reader.join(CLOSE_LIMIT_S)
        wait_for(completed, timeout_s=CLOSE_LIMIT_S, what="Triton done with the cancelled stream")
    assert len(ended) == 1 and isinstance(ended[0], ClientClosedError), ended
    assert "after 1 response(s)" in str(ended[0])
    assert region_gone(regions, triton.grpc_url)


def test_a_response_late_past_client_timeout_ends_the_stream(one_slot: TritonSHMClient) -> None:
    picture, got = image(8), []
    with pytest.raises(StreamInterruptedError) as failed:
        for response in one_slot.stream(
            MODEL, request(picture, 5, 1_000_000), client_timeout_s=0.3
        ):
            got.append(response)
    check(got, picture, 1)
    error = failed.value
    assert error.delivered == 1 and error.status == "StatusCode.DEADLINE_EXCEEDED"
    assert "client_timeout_s=0.3" in str(error)
    wait_for(lambda: slots_free(one_slot), what="the slot back once Triton is done")


def test_unary_calls_on_a_streaming_model_are_refused_before_a_slot_is_taken(
    streams: TritonSHMClient,
) -> None:
    header = registry_of(streams).get(MODEL).header
    before = header.totals()
    with pytest.raises(StreamingModelError, match=r"call stream\('captioner'") as refused:
        streams.infer_shm(MODEL, request(image(9), 1))
    assert isinstance(refused.value, InvalidInputError)
    assert refused.value.expected == "unary" and refused.value.actual == "decoupled"
    with pytest.raises(StreamingModelError):
        asyncio.run(streams.infer_shm_async(MODEL, request(image(9), 1)))
    with pytest.raises(StreamingModelError):
        streams.lease(MODEL)
    assert header.totals().requests == before.requests  # no slot was taken
    assert slots_free(streams)


def test_a_stream_of_a_model_that_is_not_streaming_is_refused(
    grpc_url: str, make_client: Callable[..., TritonSHMClient]
) -> None:
    client = make_client(grpc_url)
    client.register_shm_model("identity", max_shapes={"INPUT0": (16,), "OUTPUT0": (16,)})
    with pytest.raises(StreamingModelError, match=r"call infer_shm\('identity'"):
        list(client.stream("identity", {"INPUT0": np.ones((1, 4), np.float32)}))
    assert client.shm_stats("identity").in_use == 0


def test_a_stream_is_one_request(streams: TritonSHMClient) -> None:
    with pytest.raises(InvalidInputError, match="IMAGE"):
        list(streams.stream(MODEL, request(np.ones((3, 2, 2), np.float32), 1)))
    assert slots_free(streams)


@pytest.fixture
def crashing_triton(tmp_path: Path) -> Iterator[LocalTritonServer]:
    with local_triton(
        model_repository(tmp_path / "models", MODEL),
        log_path=tmp_path / "tritonserver.log",
        stop_grace_s=2.0,
    ) as server:
        yield server


def test_a_triton_abort_mid_stream_says_how_many_came_and_nothing_is_wrong(
    crashing_triton: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> None:
    server = crashing_triton
    client = make_client(server.grpc_url, reconnect_timeout_s=60)
    client.register_shm_model(MODEL, pool_size=2)
    picture, got = image(10), []
    pid = server.pid
    assert pid is not None
    with pytest.raises(StreamInterruptedError) as failed:
        for response in client.stream(MODEL, request(picture, 100, 50_000)):
            got.append(response)
            if len(got) == 3:
                os.kill(pid, signal.SIGABRT)
    check(got, picture, len(got))
    assert failed.value.delivered == len(got) >= 3
    assert f"after {len(got)} response(s)" in str(failed.value)
    # Triton comes back (supervised); the next stream waits for it, its region registered
    # again, and answers right.
    check(list(client.stream(MODEL, request(picture, 4))), picture, 4)
    assert server.pid not in (None, pid)
    wait_for(lambda: slots_free(client), what="every slot back")
    client.close()
    assert not our_regions(os.getpid()) & registered_on(server.grpc_url)


def test_streams_go_by_value_to_a_triton_that_cannot_map_our_memory(
    triton_elsewhere: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> None:
    client = make_client(triton_elsewhere.grpc_url)
    client.register_shm_model(MODEL, pool_size=2)
    assert client.shm_stats(MODEL).transport == "inline"

    def one(seed: int) -> None:
        picture, count = image(200 + seed), 1 + seed % 5
        check(list(client.stream(MODEL, request(picture, count))), picture, count)

    in_threads(one, range(6))
    with pytest.raises(TritonServerError, match="after 2 response"):
        list(client.stream(MODEL, request(image(1), -2)))
    assert slots_free(client)


def test_a_stream_response_survives_pickle() -> None:
    import pickle

    response = StreamResponse({"TOKEN": np.array([3], np.int32)}, index=3, final=True)
    again: Any = pickle.loads(pickle.dumps(response))
    assert again.index == 3 and again.final and again["TOKEN"].tolist() == [3]
