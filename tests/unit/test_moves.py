"""The one rule of where a call goes on (``follow_model``) with a scripted owner of the model's
layouts, and ``Moves``: its limit, its history in the final error, its drivers; and a call's
options over a handle's defaults. The real-server tests (test_model_changes) cover the rule end
to end, through the core's registry and through ShmModel asking the node actor."""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import Any

import pytest

from ray_triton_shm import ClientClosedError, InvalidInputError, TritonServerError
from ray_triton_shm._inference._engine import SuspectedChange
from ray_triton_shm._inference._options import (
    REQUEST_OPTIONS,
    RequestOptions,
    over_defaults,
    request_options,
)
from ray_triton_shm._pools._retry import INPUT_RECHECK_S, MAX_MOVES, MOVED, Moves, follow_model


class Owner:
    """Layouts named by numbers; ``newest`` is the model's current one."""

    def __init__(self, newest: int) -> None:
        self.newest = newest
        self.asked: list[tuple[str, float]] = []

    def replacement(self, target: int, exc: BaseException) -> int | None:
        self.asked.append(("replacement", 0.0))
        return None if target == self.newest else self.newest

    def newer(self, target: int, exc: BaseException, since: float) -> int | None:
        self.asked.append(("newer", since))
        return None if target == self.newest else self.newest


def _refused(executed: bool = False) -> SuspectedChange:
    error = TritonServerError("unexpected shape", model="m", status="StatusCode.INVALID_ARGUMENT")
    return SuspectedChange(error, executed=executed)


def _bad_input() -> InvalidInputError:
    return InvalidInputError("model 'm': input 'X' must have shape (2,)", model="m", tensor="X")


def test_a_retired_layout_goes_on_with_its_replacement_else_the_error() -> None:
    closed = ClientClosedError("closed")
    assert follow_model(1, closed, Owner(2), follows=True, sequence=False, started=0) == 2
    with pytest.raises(ClientClosedError):
        follow_model(2, closed, Owner(2), follows=True, sequence=False, started=0)


def test_a_suspected_change_asks_since_the_call_started_and_surfaces_tritons_error() -> None:
    owner = Owner(2)
    assert follow_model(1, _refused(), owner, follows=True, sequence=False, started=5.0) == 2
    assert owner.asked == [("newer", 5.0)]
    with pytest.raises(TritonServerError, match="unexpected shape"):
        follow_model(2, _refused(), owner, follows=True, sequence=False, started=5.0)


def test_an_executed_sequence_step_is_never_sent_again() -> None:
    with pytest.raises(TritonServerError):
        follow_model(1, _refused(executed=True), Owner(2), follows=True, sequence=True, started=0)
    # Not a sequence, or not run by Triton: it moves.
    assert follow_model(1, _refused(True), Owner(2), follows=True, sequence=False, started=0) == 2
    assert follow_model(1, _refused(), Owner(2), follows=True, sequence=True, started=0) == 2


def test_refused_inputs_move_only_a_layout_that_follows_the_model_asked_at_most_so_often() -> None:
    owner = Owner(2)
    with pytest.raises(InvalidInputError):
        follow_model(1, _bad_input(), owner, follows=False, sequence=False, started=0)
    assert owner.asked == []  # specs given by hand: the caller's inputs are wrong
    before = time.monotonic()
    assert follow_model(1, _bad_input(), owner, follows=True, sequence=False, started=0) == 2
    ((kind, since),) = owner.asked
    assert kind == "newer" and before - INPUT_RECHECK_S <= since <= time.monotonic()


def test_moves_stop_at_their_limit_and_the_error_names_every_move() -> None:
    owner = Owner(0)

    def recover(target: int, exc: BaseException) -> int:
        owner.newest = target + 1  # the model changes at every try
        return follow_model(target, exc, owner, follows=True, sequence=False, started=0)

    tried: list[int] = []

    def attempt(target: int) -> str:
        tried.append(target)
        raise _refused()

    ended: list[int] = []
    with pytest.raises(TritonServerError) as info:
        Moves(0, MOVED, recover).run(attempt, failed=lambda target, exc: ended.append(target))
    assert tried == list(range(MAX_MOVES + 1))
    assert ended == [MAX_MOVES]
    (note,) = info.value.__notes__
    assert f"moved {MAX_MOVES} time(s)" in note and note.count("SuspectedChange") == MAX_MOVES
    assert pickle.loads(pickle.dumps(info.value)).model == "m"


def test_moves_are_values_and_the_async_driver_answers_like_the_blocking_one() -> None:
    first = Moves(1, MOVED, lambda target, exc: target + 1)
    second = first.increment(ClientClosedError("closed"))
    assert (first.target, first.history) == (1, ())
    assert second.target == 2 and len(second.history) == 1

    async def attempt(target: int) -> int:
        if target < 3:
            raise ClientClosedError("closed")
        return target

    assert asyncio.run(first.run_async(attempt)) == 3


def _options(**given: Any) -> RequestOptions | None:
    """The request options ``given``, checked, the others at their defaults."""
    return request_options("m", **{o.name: o.default for o in REQUEST_OPTIONS} | given)


def test_a_calls_options_over_a_handles_defaults() -> None:
    defaults = _options(priority=2, queue_timeout_s=0.5, parameters={"a": 1})
    assert over_defaults(None, None, priority_given=False) is None  # nothing set: costs nothing
    assert over_defaults(defaults, None, priority_given=False) == defaults
    own = _options(parameters={"b": 2}, requested_outputs=["Y"])
    merged = over_defaults(defaults, own, priority_given=True)  # priority=0: Triton's default
    assert merged == RequestOptions(
        priority=0, queue_timeout_us=500_000, parameters=(("a", 1), ("b", 2)), outputs=("Y",)
    )
    only_priority = _options(priority=3)
    assert over_defaults(only_priority, None, priority_given=True) is None  # the model's again
    with pytest.raises(InvalidInputError, match="sequence_start/sequence_end"):
        _options(sequence_start=True)
