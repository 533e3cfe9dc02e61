"""Requests given up before Triton answered: a deadline, an interrupt, a cancelled coroutine.

Triton runs such a request to the end and then writes its outputs into the slot it named. A
slot is therefore used again only once Triton is done with it, however the call ended, and no
caller is ever answered with another request's data. ``delay_echo`` echoes its input after a
delay the request chooses (4 instances), so the timing of each case is the test's to set.
"""

from __future__ import annotations

import asyncio
import random
import signal
import threading
import time

import numpy as np
import pytest
from _helpers import in_threads, registered_on, request_sent, runs_in_triton, wait_for

from ray_triton_shm import TritonServerError, TritonSHMClient
from ray_triton_shm._client import registry_of
from ray_triton_shm.local import LocalTritonServer

ECHO_SHAPES = {"DATA": (64,), "ECHO": (64,)}


def _inputs(delay_ms: int, value: float, length: int = 64) -> dict[str, np.ndarray]:
    return {
        "DELAY_MS": np.array([delay_ms], np.int32),
        "DATA": np.full(length, value, np.float32),
    }


@pytest.fixture
def one_slot(client: TritonSHMClient) -> TritonSHMClient:
    client.register_shm_model("delay_echo", max_shapes=ECHO_SHAPES, pool_size=1)
    return client


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_deadline_raises_on_time_and_the_slot_waits_for_triton(
    one_slot: TritonSHMClient, mode: str
) -> None:
    async def infer_async(inputs: dict[str, np.ndarray], **options: float) -> dict:  # type: ignore[type-arg]
        return await one_slot.infer_shm_async("delay_echo", inputs, **options)

    def infer(inputs: dict[str, np.ndarray], **options: float) -> dict:  # type: ignore[type-arg]
        if mode == "async":
            return asyncio.run(infer_async(inputs, **options))
        return one_slot.infer_shm("delay_echo", inputs, **options)

    started = time.monotonic()
    with pytest.raises(TritonServerError) as info:
        infer(_inputs(800, 1.0), client_timeout_s=0.1)
    assert time.monotonic() - started < 0.5  # the caller's deadline holds
    assert info.value.status == "StatusCode.DEADLINE_EXCEEDED"
    assert "client_timeout_s=0.1" in str(info.value)
    # Triton still runs A and will write A's outputs into the only slot: B must wait for it.
    out = infer(_inputs(0, 2.0))["ECHO"]
    assert time.monotonic() - started >= 0.8
    np.testing.assert_array_equal(out, np.full(64, 2.0, np.float32))
    stats = one_slot.shm_stats("delay_echo")
    assert stats.in_use == 0 and stats.abandoned == 0


def test_an_interrupted_blocking_call_is_abandoned_until_triton_is_done(
    one_slot: TritonSHMClient,
) -> None:
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    started = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            one_slot.infer_shm("delay_echo", _inputs(1000, 1.0))  # a blocking gRPC call
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 0.8
    # No gRPC call to wait for: the slot is abandoned until Triton lets go of its registration.
    assert one_slot.shm_stats("delay_echo").abandoned == 1
    out = one_slot.infer_shm("delay_echo", _inputs(0, 2.0))["ECHO"]
    assert time.monotonic() - started >= 1.0
    np.testing.assert_array_equal(out, np.full(64, 2.0, np.float32))
    assert one_slot.shm_stats("delay_echo").abandoned == 0
    header = registry_of(one_slot).get("delay_echo").header
    assert header.totals().abandoned == 1 and header.settle_quantile_s(0.99) >= 0.5


def test_a_cancelled_coroutine_frees_its_slot_when_triton_answers(
    one_slot: TritonSHMClient, triton: LocalTritonServer
) -> None:
    async def main() -> float:
        started = time.monotonic()
        with runs_in_triton(triton, "delay_echo") as runs:
            slow = asyncio.ensure_future(one_slot.infer_shm_async("delay_echo", _inputs(600, 1.0)))
            await asyncio.to_thread(wait_for, runs, what="the slow request running in Triton")
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        out = await one_slot.infer_shm_async("delay_echo", _inputs(0, 2.0))
        np.testing.assert_array_equal(out["ECHO"], np.full(64, 2.0, np.float32))
        return time.monotonic() - started

    assert asyncio.run(main()) >= 0.6


@pytest.mark.soak  # the soak tier (CI runs it after make test): make test stays under 12 min
def test_many_threads_with_deadlines_on_few_slots_never_get_another_requests_data(
    client: TritonSHMClient,
) -> None:
    """The case that once answered 1 request in 456 with another's data: 8 threads on 2 slots,
    delays of 0 to 250 ms, one request in four with a 60 ms deadline."""
    wrong: list[tuple[float, np.ndarray]] = []
    counts = {"answered": 0, "deadline": 0}
    lock = threading.Lock()
    client.register_shm_model("delay_echo", max_shapes=ECHO_SHAPES, pool_size=2)

    def caller(seed: int) -> None:
        rng = random.Random(seed)
        for n in range(30):
            value = seed * 1000 + n
            length = rng.randint(1, 64)
            deadline = 0.06 if rng.random() < 0.25 else None
            inputs = _inputs(rng.choice([0, 0, 50, 120, 250]), value, length)
            try:
                out = client.infer_shm("delay_echo", inputs, client_timeout_s=deadline)["ECHO"]
            except TritonServerError as exc:
                assert exc.status == "StatusCode.DEADLINE_EXCEEDED", exc
                with lock:
                    counts["deadline"] += 1
                continue
            with lock:
                counts["answered"] += 1
                if not np.array_equal(out, inputs["DATA"]):
                    wrong.append((value, out))

    in_threads(caller, range(1, 9))
    # Every slot comes back once Triton has answered the requests given up on.
    wait_for(
        lambda: client.shm_stats("delay_echo").in_use == 0,
        timeout_s=5,
        what="every slot back once Triton answered",
    )
    assert wrong == []
    assert counts["deadline"] > 0 and counts["answered"] + counts["deadline"] == 240


def test_close_waits_for_a_request_triton_still_runs_then_unregisters(grpc_url: str) -> None:
    """A request given up (here a deadline; Ctrl-C in the bench) still runs in Triton, which
    refuses to unregister its slot until it is done: close() waits for that instead of leaving
    the registration behind."""
    with TritonSHMClient(url=grpc_url) as client:
        client.register_shm_model("delay_echo", max_shapes=ECHO_SHAPES, pool_size=1)
        name = registry_of(client).get("delay_echo").region.name
        with pytest.raises(TritonServerError, match="client_timeout_s"):
            client.infer_shm("delay_echo", _inputs(1000, 1.0), client_timeout_s=0.2)
        assert name in registered_on(grpc_url)
    assert name not in registered_on(grpc_url)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_close_from_another_thread_meanwhile_waits_for_the_first(
    grpc_url: str, mode: str
) -> None:
    """Two threads close the client while a request is in flight (as two callers of a
    ``ShmModel`` whose node actor restarted both do): neither closes the channel under the
    request, which gets its own answer."""
    client = TritonSHMClient(url=grpc_url)
    client.register_shm_model("delay_echo", max_shapes=ECHO_SHAPES, pool_size=2)
    name = registry_of(client).get("delay_echo").region.name
    answers: list[np.ndarray] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            if mode == "async":
                coroutine = client.infer_shm_async("delay_echo", _inputs(800, 3.0))
                answers.append(asyncio.run(coroutine)["ECHO"])
            else:
                answers.append(client.infer_shm("delay_echo", _inputs(800, 3.0))["ECHO"])
        except BaseException as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    pool = registry_of(client).get("delay_echo")
    wait_for(lambda: request_sent(pool), timeout_s=5, what="the request sent to Triton")
    closers = [threading.Thread(target=client.close) for _ in range(2)]
    closers[0].start()
    wait_for(lambda: registry_of(client).closed, timeout_s=5, what="the first close under way")
    closers[1].start()
    for thread in [caller, *closers]:
        thread.join(timeout=30)
    assert errors == []
    assert len(answers) == 1
    np.testing.assert_array_equal(answers[0], np.full(64, 3.0, np.float32))
    assert name not in registered_on(grpc_url)
