"""infer_shm_async: same results as infer_shm, waits on the event loop, cancellation is safe."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from _helpers import wait_for

from ray_triton_shm import SlotTimeoutError, TritonSHMClient

SHAPES = {"INPUT0": (4,), "OUTPUT0": (4,)}


def test_gather_many_calls_over_a_small_pool(client: TritonSHMClient) -> None:
    client.register_shm_model("my_model", pool_size=2)
    rng = np.random.default_rng(1)
    batches = [
        (rng.random((n, 3, 224, 224), dtype=np.float32), rng.integers(0, 9, (n, 10), np.int32))
        for n in (1, 8, 9, 17, 3, 30)
    ]

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(
            *(client.infer_shm_async("my_model", {"INPUT0": a, "INPUT1": b}) for a, b in batches)
        )

    for (x0, x1), out in zip(batches, asyncio.run(main())):
        b = x0.shape[0]
        expected = x0.reshape(b, -1)[:, :512] + x1.sum(axis=1, keepdims=True).astype(np.float32)
        np.testing.assert_allclose(out["OUTPUT0"], expected, rtol=1e-5)
        np.testing.assert_array_equal(out["OUTPUT1"], x1[:, :5] * 2)
    assert client.shm_stats("my_model").in_use == 0


def test_waiting_for_a_slot_blocks_no_thread(client: TritonSHMClient) -> None:
    client.register_shm_model("slow_identity", pool_size=1, max_shapes=SHAPES)
    x = np.ones((2, 4), np.float32)

    async def main() -> tuple[int, int]:
        threads_before = threading.active_count()
        ticks = 0
        calls = [
            asyncio.ensure_future(client.infer_shm_async("slow_identity", {"INPUT0": x * i}))
            for i in range(4)
        ]
        while not all(c.done() for c in calls):
            ticks += 1  # the loop keeps running while three callers wait for the one slot
            assert client.shm_stats("slow_identity").waiting <= 3
            await asyncio.sleep(0.01)  # the probe itself: a tick, counted while they wait
        for i, call in enumerate(calls):
            np.testing.assert_array_equal(call.result()["OUTPUT0"], x * i)
        return ticks, threading.active_count() - threads_before

    ticks, extra_threads = asyncio.run(main())
    assert ticks > 10
    assert extra_threads <= 0


def test_slot_timeout_async(client: TritonSHMClient) -> None:
    client.register_shm_model("slow_identity", pool_size=1, max_shapes=SHAPES)
    x = np.ones((1, 4), np.float32)

    async def main() -> None:
        holder = asyncio.ensure_future(client.infer_shm_async("slow_identity", {"INPUT0": x}))
        await asyncio.to_thread(
            wait_for, lambda: client.shm_stats("slow_identity").in_use, what="the holder's slot"
        )
        with pytest.raises(SlotTimeoutError):
            await client.infer_shm_async("slow_identity", {"INPUT0": x}, slot_timeout_s=0.01)
        await holder

    asyncio.run(main())
    assert client.shm_stats("slow_identity").in_use == 0


def test_cancellation_never_loses_or_reuses_a_busy_slot(client: TritonSHMClient) -> None:
    client.register_shm_model("slow_identity", pool_size=2, max_shapes=SHAPES)
    x = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)

    async def main() -> None:
        # One caller with five chunks in flight over two slots, one waiting for a slot: cancel both.
        busy = asyncio.ensure_future(client.infer_shm_async("slow_identity", {"INPUT0": x}))
        waiting = asyncio.ensure_future(client.infer_shm_async("slow_identity", {"INPUT0": x[:1]}))

        def both_taken_one_waiting() -> bool:
            stats = client.shm_stats("slow_identity")
            return (stats.in_use, stats.waiting) == (2, 1)

        await asyncio.to_thread(wait_for, both_taken_one_waiting, what="2 slots taken, 1 waiting")
        busy.cancel()
        waiting.cancel()
        for task in (busy, waiting):
            with pytest.raises(asyncio.CancelledError):
                await task
        # Slots come back once Triton has answered the requests already sent.
        await asyncio.to_thread(
            wait_for, lambda: client.shm_stats("slow_identity").in_use == 0, what="every slot"
        )
        out = await client.infer_shm_async("slow_identity", {"INPUT0": x})
        np.testing.assert_array_equal(out["OUTPUT0"], x)

    asyncio.run(main())
    stats = client.shm_stats("slow_identity")
    assert (stats.in_use, stats.waiting) == (0, 0)


def test_sync_and_async_callers_share_one_pool(client: TritonSHMClient) -> None:
    client.register_shm_model("slow_identity", pool_size=1, max_shapes=SHAPES)
    x = np.ones((3, 4), np.float32)
    results: list[np.ndarray] = []
    worker = threading.Thread(
        target=lambda: results.append(client.infer_shm("slow_identity", {"INPUT0": x})["OUTPUT0"])
    )

    async def main() -> np.ndarray:
        worker.start()
        return (await client.infer_shm_async("slow_identity", {"INPUT0": 2 * x}))["OUTPUT0"]

    np.testing.assert_array_equal(asyncio.run(main()), 2 * x)
    worker.join()
    np.testing.assert_array_equal(results[0], x)
