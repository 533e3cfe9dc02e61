"""The inference engine, alone: chunk scheduling and slot reuse, driven by a scripted Triton.

The real-server tests (test_client, test_async, test_reliability) cover the engine end to end;
these pin the rules a real server cannot be made to exercise on cue: an interrupt at a given
step, or an error in one chunk while others are in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from ray_triton_shm import TritonServerError
from ray_triton_shm._drive import drive, drive_async
from ray_triton_shm._inference._engine import Chunk, Step, run
from ray_triton_shm._inference._inputs import prepare_batch
from ray_triton_shm._inference._model_pool import ModelPool
from ray_triton_shm._slots._header import RegionHeader
from ray_triton_shm._slots._memory import SlotMemory
from ray_triton_shm._slots._shm import SharedMemoryRegion, new_region_name
from ray_triton_shm._slots._slot_pool import PoolStats, SlotPool
from ray_triton_shm._slots._specs import ModelSpec, SlotLayout, TensorSpec

SPEC = ModelSpec(
    name="m",
    version="",
    inputs=(TensorSpec("X", (2,), np.dtype(np.float32)),),
    outputs=(TensorSpec("Y", (2,), np.dtype(np.float32)),),
    max_batch_size=2,
)


@pytest.fixture
def pool() -> Iterator[ModelPool]:
    """Two slots of two samples each, over a real region (no server needed)."""
    size = SlotLayout.for_model(SPEC).region_bytes(2)
    region = SharedMemoryRegion.create(new_region_name("m"), size)
    header = RegionHeader.new(region.buffer, 2)
    try:
        memory = SlotMemory(region, SlotLayout.for_model(SPEC), 2)
        yield ModelPool.over(SPEC, memory, SlotPool(2, name="m"), header)
    finally:
        region.unlink()


class _Call:
    """A request in flight, as far as the engine sees one (``grpc.Future``'s callback part)."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[Any], None]] = []
        self.done = False
        self.error: BaseException | None = None

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self.done:
            callback(self)
        else:
            self.callbacks.append(callback)

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        return self.error

    def finish(self, error: BaseException | None = None) -> None:
        self.done, self.error = True, error
        for callback in self.callbacks:
            callback(self)


class ScriptedTriton:
    """Does the engine's steps like an identity model would, failing on cue; logs each step."""

    def __init__(
        self,
        pool: ModelPool,
        *,
        fail_at_answer: int | None = None,
        raise_: type[BaseException] | BaseException = RuntimeError,
    ) -> None:
        self.pool = pool
        self.log: list[tuple[Step, int | None]] = []
        self.calls: list[_Call] = []
        self.answers = 0
        self.fail_at_answer = fail_at_answer
        self.raise_ = raise_

    def __call__(self, step: Step, arg: Any) -> Any:
        self.log.append((step, arg.start if isinstance(arg, Chunk) else None))
        if step is Step.SLOT:
            return self.pool.slots.acquire(arg)
        if step is Step.SEND:
            arg.call = _Call()
            self.calls.append(arg.call)
            return None
        if step is Step.SETTLE:
            if arg.call is not None:
                arg.call.finish()
            return None
        if step in (Step.RECONNECT, Step.REREGISTER):
            return None  # Triton is back / the region is registered again
        assert step is Step.ANSWER
        self.answers += 1
        if self.answers == self.fail_at_answer:
            if isinstance(self.raise_, BaseException):  # an RpcError: a failed call is done
                if arg.call is not None:
                    arg.call.finish(self.raise_)
                raise self.raise_
            raise self.raise_("scripted failure")
        views = arg.pool.views[arg.slot]
        views.outputs["Y"][: arg.rows * 2] = views.inputs["X"][: arg.rows * 2]
        if arg.call is not None:
            arg.call.finish()
        return [("Y", "FP32", (arg.rows, 2), b"")]  # the outputs Triton wrote into the slot


def _infer(triton: ScriptedTriton, rows: int) -> dict[str, np.ndarray]:
    x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    batch = prepare_batch(triton.pool.spec, {"X": x})
    return drive(run(triton.pool, batch, slot_timeout_s=1.0, request_id=""), triton)


def test_chunks_come_back_in_order_and_no_slot_is_awaited_while_one_is_held(
    pool: ModelPool,
) -> None:
    triton = ScriptedTriton(pool)
    out = _infer(triton, rows=7)  # 4 chunks over 2 slots
    np.testing.assert_array_equal(out["Y"], np.arange(14, dtype=np.float32).reshape(7, 2))
    assert (Step.SLOT, None) not in triton.log  # a free slot always came from collecting first
    sends = [start for step, start in triton.log if step is Step.SEND]
    answers = [start for step, start in triton.log if step is Step.ANSWER]
    assert sends == answers == [0, 2, 4, 6]
    assert triton.log.index((Step.ANSWER, 0)) < triton.log.index((Step.SEND, 4))
    assert pool.slots.stats().in_use == 0


def test_an_error_waits_for_the_other_chunks_then_every_slot_is_free(pool: ModelPool) -> None:
    triton = ScriptedTriton(pool, fail_at_answer=1)
    with pytest.raises(RuntimeError, match="scripted"):
        _infer(triton, rows=4)
    assert [s for s in triton.log if s[0] is Step.SETTLE] == [(Step.SETTLE, 0), (Step.SETTLE, 2)]
    assert pool.slots.stats().in_use == 0


def test_an_interrupt_waits_for_nothing_and_each_slot_comes_back_when_triton_is_done(
    pool: ModelPool,
) -> None:
    triton = ScriptedTriton(pool, fail_at_answer=1, raise_=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        _infer(triton, rows=4)
    assert not any(step is Step.SETTLE for step, _ in triton.log)
    assert pool.slots.stats().in_use == 2  # Triton may still write into both slots
    for call in triton.calls:
        call.finish()
    assert pool.slots.stats().in_use == 0


def test_one_chunk_is_answered_without_a_future_and_its_slot_freed_on_error(
    pool: ModelPool,
) -> None:
    triton = ScriptedTriton(pool)
    np.testing.assert_array_equal(_infer(triton, rows=2)["Y"], [[0, 1], [2, 3]])
    assert [step for step, _ in triton.log] == [Step.SLOT, Step.ANSWER]
    with pytest.raises(KeyboardInterrupt):
        _infer(ScriptedTriton(pool, fail_at_answer=1, raise_=KeyboardInterrupt), rows=1)
    # Interrupted mid-call, with no future to wait for: Triton may still write into the slot,
    # which is abandoned until the owner proves Triton done with it (see _settle).
    assert pool.slots.stats() == PoolStats(size=2, in_use=1, waiting=0, abandoned=1)
    (slot,) = pool.header.abandoned_slots()
    pool.header.settle(slot, time.monotonic_ns())
    pool.slots.settled(slot)
    assert pool.slots.stats().in_use == 0 and pool.header.totals().abandoned == 1


class _Deadline(ScriptedTriton):
    """Never answers in time: the caller's deadline passes with the call still in Triton."""

    def __call__(self, step: Step, arg: Any) -> Any:
        if step is not Step.ANSWER:
            return super().__call__(step, arg)
        self.log.append((step, arg.start))
        if arg.call is None:
            arg.call = _Call()
            self.calls.append(arg.call)
        raise arg.deadline_exceeded(0.1)


@pytest.mark.parametrize(
    ("ending", "abandoned"), [(None, 0), (grpc.StatusCode.INTERNAL, 0), ("unavailable", 1)]
)
def test_a_deadline_frees_the_slot_only_when_triton_answers(
    pool: ModelPool, ending: Any, abandoned: int
) -> None:
    triton = _Deadline(pool)
    with pytest.raises(TritonServerError, match="client_timeout_s=0.1") as caught:
        _infer(triton, rows=2)
    assert caught.value.status == "StatusCode.DEADLINE_EXCEEDED"
    assert pool.slots.stats().in_use == 1  # Triton still runs it: the slot is not free
    (call,) = triton.calls
    if ending is None:
        call.finish()  # Triton answers
    elif ending == "unavailable":
        call.finish(_RpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed"))  # cut off
    else:
        call.finish(_RpcError(ending, "model failed"))  # Triton answered with an error
    assert pool.slots.stats().abandoned == abandoned
    assert pool.slots.stats().in_use == abandoned


class _RpcError(grpc.RpcError):
    """What a gRPC call raises: a status code and Triton's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


UNAVAILABLE = _RpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
MISSING = _RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Unable to find shared memory region 'r'")


def test_a_restart_is_waited_out_and_the_chunk_sent_again(pool: ModelPool) -> None:
    class Stamps(ScriptedTriton):
        """Notes when the slot was last marked sent, at each answer."""

        stamps: list[int] = []

        def __call__(self, step: Step, arg: Any) -> Any:
            if step is Step.ANSWER:
                self.stamps.append(self.pool.header.busy_since(arg.slot))
                time.sleep(0.001)  # the clock itself: the next send's stamp comes later
            return super().__call__(step, arg)

    triton = Stamps(pool, fail_at_answer=1, raise_=UNAVAILABLE)
    np.testing.assert_array_equal(_infer(triton, rows=2)["Y"], [[0, 1], [2, 3]])
    steps = [step for step, _ in triton.log]
    assert steps == [Step.SLOT, Step.ANSWER, Step.RECONNECT, Step.SEND, Step.ANSWER]
    assert pool.slots.stats().in_use == 0
    # Sent again: a dead holder's slot is abandoned from the second send, not the first.
    assert 0 < triton.stamps[0] < triton.stamps[1]


def test_a_forgotten_region_is_registered_again_once_per_chunk(pool: ModelPool) -> None:
    class ForgetsTwice(ScriptedTriton):
        def __call__(self, step: Step, arg: Any) -> Any:
            if step is Step.ANSWER and self.answers < 2:
                self.log.append((step, arg.start))
                self.answers += 1
                if arg.call is not None:
                    arg.call.finish()
                raise MISSING
            return super().__call__(step, arg)

    triton = ForgetsTwice(pool)
    with pytest.raises(TritonServerError, match="Unable to find shared memory region"):
        _infer(triton, rows=2)
    assert [step for step, _ in triton.log].count(Step.REREGISTER) == 1
    assert pool.slots.stats().in_use == 0


def test_a_chunk_sent_on_through_two_restarts_registers_its_region_again_in_each(
    pool: ModelPool,
) -> None:
    """Triton forgot the region, restarted again before the resent chunk reached it, and
    forgot it again: the chunk registers it once per restart, and is answered."""
    failures = [MISSING, UNAVAILABLE, MISSING]

    class ForgetsAcrossRestarts(ScriptedTriton):
        def __call__(self, step: Step, arg: Any) -> Any:
            if step is Step.ANSWER and failures:
                self.log.append((step, arg.start))
                if arg.call is not None:
                    arg.call.finish()
                raise failures.pop(0)
            return super().__call__(step, arg)

    triton = ForgetsAcrossRestarts(pool)
    np.testing.assert_array_equal(_infer(triton, rows=2)["Y"], [[0, 1], [2, 3]])
    steps = [step for step, _ in triton.log if step is not Step.SEND]
    assert steps == [
        *(Step.SLOT, Step.ANSWER, Step.REREGISTER, Step.ANSWER, Step.RECONNECT),
        *(Step.ANSWER, Step.REREGISTER, Step.ANSWER),
    ]
    assert pool.slots.stats().in_use == 0


def test_the_async_driver_runs_the_same_steps(pool: ModelPool) -> None:
    triton = ScriptedTriton(pool)

    async def do(step: Step, arg: Any) -> Any:
        await asyncio.sleep(0)  # a turn of the loop, no time: each step truly awaits
        return triton(step, arg)

    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    steps = run(pool, prepare_batch(SPEC, {"X": x}), slot_timeout_s=1.0, request_id="")
    np.testing.assert_array_equal(asyncio.run(drive_async(steps, do))["Y"], x)
    assert [start for step, start in triton.log if step is Step.ANSWER] == [0, 2, 4, 6]
    assert pool.slots.stats().in_use == 0


def test_a_failure_to_send_still_gives_that_chunks_slot_back(pool: ModelPool) -> None:
    triton = ScriptedTriton(pool)

    def do(step: Step, arg: Any) -> Any:
        result = triton(step, arg)
        if step is Step.SEND and arg.start == 2:
            arg.call = None  # the second request never left (e.g. the channel was closed)
            triton.calls[0].finish()
            raise ValueError("Cannot invoke RPC on closed channel!")
        return result

    x = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match="closed channel"):
        drive(run(pool, prepare_batch(SPEC, {"X": x}), slot_timeout_s=1.0, request_id=""), do)
    assert pool.slots.stats().in_use == 0
