"""The slot pool, alone: blocking at its size, timeouts, overload, close, asyncio."""

from __future__ import annotations

import asyncio
import threading

import pytest
from _helpers import wait_for

from ray_triton_shm import ClientClosedError, ModelSpecError, SlotTimeoutError
from ray_triton_shm._slots._slot_pool import SlotPool


def test_blocks_at_its_size_and_hands_a_released_slot_to_the_waiter() -> None:
    pool = SlotPool(2, name="m")
    first, second = pool.acquire(), pool.acquire()
    assert {first, second} == {0, 1} and pool.try_acquire() is None
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(5.0)))
    waiter.start()
    wait_for(lambda: pool.stats().waiting, timeout_s=5, what="the waiter waiting")
    pool.release(first)
    waiter.join()
    assert got == [first] and pool.stats().in_use == 2


def test_a_timeout_names_the_pool() -> None:
    pool = SlotPool(1, name="m")
    pool.acquire()
    with pytest.raises(SlotTimeoutError, match="'m'") as info:
        pool.acquire(0.05)
    assert isinstance(info.value, TimeoutError)
    assert pool.stats().waiting == 0


def test_close_wakes_waiters_and_reports_whether_every_slot_came_back() -> None:
    pool = SlotPool(1, name="m")
    slot = pool.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            pool.acquire()
        except ClientClosedError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: pool.stats().waiting, timeout_s=5, what="the waiter waiting")
    assert pool.close(wait_s=0.05) is False  # a slot is still out
    waiter.join()
    assert len(errors) == 1
    pool.release(slot)


def test_asyncio_waiters_are_served_in_order() -> None:
    async def main() -> list[int]:
        pool = SlotPool(1, name="m")
        held = await pool.acquire_async()
        order: list[int] = []

        async def take(tag: int) -> None:
            slot = await pool.acquire_async(5.0)
            order.append(tag)
            pool.release(slot)

        tasks = [asyncio.create_task(take(tag)) for tag in range(3)]
        await asyncio.to_thread(
            wait_for, lambda: pool.stats().waiting == 3, timeout_s=5, what="3 waiting"
        )
        pool.release(held)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == [0, 1, 2]


def test_a_pool_needs_a_slot() -> None:
    with pytest.raises(ModelSpecError, match="at least one slot"):
        SlotPool(0, name="m")
