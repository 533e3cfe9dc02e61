"""A pool catching up with a model Triton reloads (``Follower.follow_change``), alone: an
answer that proves the change has Triton's config read again, for a while, never past the
call's deadline. Triton is scripted and the follower's clock injected (its sleeps move the
clock), so nothing here waits. The real-server tests (test_hostile_triton, test_model_changes)
cover the catch-up end to end."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from ray_triton_shm import TritonServerError
from ray_triton_shm._inference._engine import SuspectedChange
from ray_triton_shm._inference._model_change import Registration
from ray_triton_shm._inference._model_pool import FollowState
from ray_triton_shm._pools import _model_sync
from ray_triton_shm._pools._model_sync import Follower
from ray_triton_shm._pools._registry import Registry

OLD = {
    "max_batch_size": 4,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": ["2"]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": ["2"]}],
}
NEW = OLD | {"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": ["3"]}]}
CAUGHT_UP = "the pool of the new config"


class Clock:
    """Seconds that pass only when the follower sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


class Triton:
    """Answers the model's config: the old one until ``reloaded_at`` (on ``clock``), the new
    one after; notes when each was read."""

    def __init__(self, clock: Clock, reloaded_at: float = float("inf")) -> None:
        self.clock = clock
        self.reloaded_at = reloaded_at
        self.read_at: list[float] = []
        self.stub = self.keys = None  # what a registry's keepers hold on to

    def model_config(self, name: str, version: str) -> dict[str, Any]:
        self.read_at.append(self.clock())
        return NEW if self.clock() >= self.reloaded_at else OLD


def _pool() -> Any:
    """A pool that follows its model, laid out for :data:`OLD` (what the follower reads)."""
    registration = Registration()
    return SimpleNamespace(
        spec=registration.resolve("m", lambda: OLD),
        registration=registration,
        following=FollowState(),
        lock=threading.Lock(),
        sizing=2,
        owned=True,
        follows=True,
    )


def _follower(triton: Triton, clock: Clock) -> Follower:
    def replace(old: Any, spec: Any, sizing: Any, registration: Any, cause: str = "") -> Any:
        assert spec == registration.resolve("m", lambda: NEW)
        return CAUGHT_UP

    return Follower(
        triton,  # type: ignore[arg-type]
        replace,
        config_check_interval_s=None,
        closed=lambda: False,
        clock=clock,
        sleep=clock.sleep,
    )


def _wrong_shape() -> TritonServerError:
    return TritonServerError("output 'Y' came back with (3,) per sample", model="m")


@pytest.mark.parametrize("deadline_in_s", [0.0, 0.05, 0.35, 2.0])
def test_a_proven_change_is_read_again_until_the_calls_deadline_and_no_later(
    deadline_in_s: float,
) -> None:
    clock = Clock()
    triton = Triton(clock)
    deadline = clock() + deadline_in_s
    newer = _follower(triton, clock).follow_change(
        _pool(), since=clock(), cause=_wrong_shape(), proven=True, deadline=deadline
    )
    assert newer is None  # Triton's config never showed the change
    assert clock() == pytest.approx(deadline)  # waited up to the deadline, not past it
    assert all(at <= deadline + 1e-9 for at in triton.read_at)
    # Read at once, then at every poll until the deadline, the last read at it.
    assert triton.read_at[0] == 100.0 and triton.read_at[-1] == pytest.approx(deadline)
    gaps = [b - a for a, b in zip(triton.read_at, triton.read_at[1:], strict=False)]
    assert all(gap <= _model_sync._CONFIG_POLL_S + 1e-9 for gap in gaps)


@pytest.mark.parametrize("deadline_in_s", [None, 60.0])
def test_without_a_nearer_deadline_the_catch_up_stops_at_its_own_limit(
    deadline_in_s: float | None,
) -> None:
    clock = Clock()
    triton = Triton(clock)
    start = clock()
    deadline = None if deadline_in_s is None else start + deadline_in_s
    newer = _follower(triton, clock).follow_change(
        _pool(), since=start, cause=_wrong_shape(), proven=True, deadline=deadline
    )
    assert newer is None
    assert clock() == pytest.approx(start + _model_sync._CONFIG_CATCH_UP_S)
    assert max(triton.read_at) <= start + _model_sync._CONFIG_CATCH_UP_S + 1e-9


def test_a_config_that_shows_the_change_before_the_deadline_lays_the_pool_out_anew() -> None:
    clock = Clock()
    triton = Triton(clock, reloaded_at=clock() + 0.25)
    newer = _follower(triton, clock).follow_change(
        _pool(), since=clock(), cause=_wrong_shape(), proven=True, deadline=clock() + 1.0
    )
    assert newer == CAUGHT_UP
    assert len(triton.read_at) == 4 and clock() < 100.0 + 1.0  # 0, 0.1, 0.2, 0.3 s


def test_an_unproven_change_is_read_once_whatever_the_deadline() -> None:
    clock = Clock()
    triton = Triton(clock)
    newer = _follower(triton, clock).follow_change(
        _pool(), since=clock(), cause=_wrong_shape(), proven=False, deadline=clock() + 10.0
    )
    assert newer is None and triton.read_at == [100.0] and clock() == 100.0


def test_a_calls_deadline_reaches_the_catch_up_through_the_registrys_rule() -> None:
    """``Registry.next_pool`` -> ``follow_model`` -> ``Registry.newer`` -> the follower: a
    deadline already past leaves the one read a suspected change makes, where without one the
    config would be read again for :data:`_model_sync._CONFIG_CATCH_UP_S`."""
    clock = Clock()
    triton = Triton(clock)
    registry = Registry(
        triton,  # type: ignore[arg-type]
        crash_cleanup=False,
        config_check_interval_s=None,
        shm_budget_bytes=0,
    )
    change = SuspectedChange(_wrong_shape(), executed=True, proven=True)
    with pytest.raises(TritonServerError, match="came back with"):
        registry.next_pool(_pool(), change, None, time.monotonic(), deadline=time.monotonic())
    assert len(triton.read_at) == 1
