"""The scaling policy and a resizable slot pool: pure logic, no server."""

from __future__ import annotations

import threading

import pytest
from _helpers import wait_for

from ray_triton_shm import ModelSpecError, SlotAutoscaling
from ray_triton_shm._pools._scaling import REASON_KEPT_S, TICK_S, Policy
from ray_triton_shm._slots._header import MAX_SLOTS
from ray_triton_shm._slots._sizing import pool_sizing
from ray_triton_shm._slots._slot_pool import SlotPool

CONFIG = SlotAutoscaling(min_slots=2, max_slots=16, upscale_delay_s=0.2, downscale_delay_s=30.0)


def _run(policy: Policy, size: int, samples: list[tuple[float, int, int]]) -> list[int]:
    """Feeds ``(seconds, in_use, waiting)`` phases to ``policy`` every tick; the sizes."""
    sizes, now = [], 0.0
    for seconds, in_use, waiting in samples:
        end = now + seconds
        while now < end:
            want = policy.want(now, size, min(in_use, size), waiting)
            if want != size:
                policy.resized(now)
                size = want
            sizes.append(size)
            now += TICK_S
    return sizes


def test_it_grows_to_what_waiting_callers_need_once_they_waited_the_delay() -> None:
    policy = Policy(CONFIG, now=0.0)
    assert policy.want(0.0, 2, 2, 10) == 2  # waiting just began
    assert policy.want(0.1, 2, 2, 10) == 2
    assert policy.want(0.2, 2, 2, 10) == 12  # held plus waiting
    sizes = _run(Policy(CONFIG, 0.0), 2, [(1.0, 2, 40)])
    assert sizes[-1] == CONFIG.max_slots  # never past max_slots


def test_it_says_why_short_waits_did_not_grow_it_and_forgets_it_when_quiet() -> None:
    """16 callers on 2 slots, each wait shorter than upscale_delay_s: callers queue at one
    sample and none at the next. The pool stays at 2, and the policy says why."""
    policy = Policy(CONFIG, now=0.0)
    assert policy.limited_by == ""
    flicker = [(TICK_S, 2, 3), (TICK_S, 2, 0)] * 20
    sizes = _run(policy, 2, flicker)
    assert set(sizes) == {2}
    assert policy.limited_by == "upscale_delay_s"
    waited_until = 40 * TICK_S
    # Still said between waits, until REASON_KEPT_S without a caller waiting.
    assert policy.want(waited_until + REASON_KEPT_S / 2, 2, 2, 0) == 2
    assert policy.limited_by == "upscale_delay_s"
    policy.want(waited_until + REASON_KEPT_S, 2, 2, 0)
    assert policy.limited_by == ""


def test_a_pool_that_grows_in_time_or_is_at_its_bound_says_so() -> None:
    policy = Policy(CONFIG, now=0.0)
    _run(policy, 2, [(0.5, 2, 4)])  # waited the delay on end: it grew
    assert policy.limited_by == ""
    policy = Policy(CONFIG, now=0.0)
    sizes = _run(policy, 2, [(2.0, 16, 40)])
    assert sizes[-1] == CONFIG.max_slots and policy.limited_by == "max_slots"
    _run(policy, 16, [(1.0, 16, 0)])  # quiet, but not yet for REASON_KEPT_S: kept
    assert policy.limited_by == "max_slots"


def test_the_room_it_ran_short_of_is_not_taken_for_short_waits() -> None:
    policy = Policy(CONFIG, now=0.0)
    assert policy.want(0.0, 2, 2, 4) == 2
    assert policy.want(0.2, 2, 2, 4) == 6
    policy.short_of("shm_budget")  # the scaler could reserve none of it
    assert policy.want(0.3, 2, 2, 0) == 2
    assert policy.limited_by == "shm_budget"
    policy.want(0.3 + REASON_KEPT_S, 2, 2, 0)
    assert policy.limited_by == ""


def test_one_caller_never_makes_it_grow() -> None:
    policy = Policy(CONFIG, 0.0)
    assert set(_run(policy, 2, [(60.0, 1, 0)])) == {2}
    assert policy.limited_by == ""


def test_it_shrinks_after_the_delay_to_the_most_used_at_once_then_to_the_minimum() -> None:
    sizes = _run(Policy(CONFIG, 0.0), 2, [(1.0, 16, 14), (40.0, 5, 0), (40.0, 0, 0)])
    grown = sizes.index(16)
    assert grown <= 3
    # Held at 16 for the delay after the load fell (its peak is in the window), then 5...
    at_five = sizes.index(5)
    assert 30.0 <= (at_five - grown) * TICK_S <= 31.5
    # ...and back to the minimum within the next delay once idle.
    idle = round(41.0 / TICK_S)
    assert sizes[-1] == 2 and 30.0 <= (sizes.index(2, at_five) - idle) * TICK_S <= 31.5


def test_a_load_that_swings_every_few_seconds_does_not_make_it_flap() -> None:
    swings = [(2.0, 16, 20), (2.0, 1, 0)] * 10
    sizes = _run(Policy(CONFIG, 0.0), 2, swings)
    changes = sum(a != b for a, b in zip(sizes, sizes[1:], strict=False))
    assert changes <= 2 and sizes[-1] == 16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_slots": 0}, "1 <= min_slots <= max_slots"),
        ({"min_slots": 9, "max_slots": 8}, "min_slots=9, max_slots=8"),
        ({"max_slots": MAX_SLOTS + 1}, f"<= {MAX_SLOTS}"),
        ({"upscale_delay_s": -1}, "upscale_delay_s must be >= 0"),
    ],
)
def test_bad_bounds_are_refused_naming_them(kwargs: dict, message: str) -> None:
    with pytest.raises(ModelSpecError, match=message):
        SlotAutoscaling(**kwargs)


def test_sizing_is_a_fixed_pool_or_a_policy_never_both() -> None:
    assert pool_sizing("m", 4, None) == 4
    assert pool_sizing("m", None, {"max_slots": 8}) == SlotAutoscaling(max_slots=8)
    assert pool_sizing("m", None, None, max_slots=32) == SlotAutoscaling(max_slots=32)
    with pytest.raises(ModelSpecError, match="'m': pass pool_size .* not both"):
        pool_sizing("m", 4, {"max_slots": 8})
    with pytest.raises(ModelSpecError, match=r"'m': autoscaling: unknown field\(s\) \['slots'\]"):
        pool_sizing("m", None, {"slots": 8})
    with pytest.raises(ModelSpecError, match="max_slots 32 exceeds the 16 slots"):
        pool_sizing("m", None, {"max_slots": 32}, limit=16)


def test_a_pool_that_shrinks_parks_its_slots_as_they_come_back() -> None:
    pool = SlotPool(4, name="m", capacity=8)
    held = [pool.acquire() for _ in range(4)]
    assert sorted(held) == [0, 1, 2, 3] and pool.try_acquire() is None
    pool.resize(2)
    pool.release(3)  # beyond the size now: parked, not free
    assert pool.try_acquire() is None
    pool.release(1)
    assert pool.try_acquire() == 1
    idle: list[int] = []
    pool.each_idle(range(2, 8), idle.append)
    assert idle == [3, 4, 5, 6, 7]  # slot 2 is still held
    assert pool.stats().size == 2


def test_a_pool_that_grows_hands_the_new_slots_to_its_waiters_first() -> None:
    pool = SlotPool(1, name="m", capacity=4)
    first = pool.acquire()
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(timeout_s=5)))
    waiter.start()
    wait_for(lambda: pool.demand() == (1, 1), timeout_s=5, what="1 slot held, 1 caller waiting")
    pool.resize(3)
    waiter.join()
    assert got == [1] and first == 0
    assert pool.try_acquire() == 2 and pool.try_acquire() is None
    assert pool.demand() == (3, 0)
    assert pool.close(wait_s=0) is False  # three held
