"""The streaming rule, alone (:mod:`ray_triton_shm._inference._stream`), driven by a scripted
Triton: what is sent again and when, and when a slot is free, abandoned or held, on cue.

The real-server tests (tests/test_streaming.py, the chaos soak) cover it end to end; these pin
the cases a real server cannot be made to produce at a given response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from ray_triton_shm import StreamInterruptedError, StreamResponse, TritonServerError
from ray_triton_shm._drive import drive_stream, drive_stream_async
from ray_triton_shm._inference._engine import Step
from ray_triton_shm._inference._inputs import prepare_batch
from ray_triton_shm._inference._model_pool import ModelPool
from ray_triton_shm._inference._stream import stream
from ray_triton_shm._slots._header import RegionHeader
from ray_triton_shm._slots._memory import SlotMemory
from ray_triton_shm._slots._shm import SharedMemoryRegion, new_region_name
from ray_triton_shm._slots._slot_pool import SlotPool
from ray_triton_shm._slots._specs import ModelSpec, SlotLayout, TensorSpec
from ray_triton_shm._wire._streams import StreamErrorResponse

SPEC = ModelSpec(
    name="s",
    version="",
    inputs=(TensorSpec("X", (2,), np.dtype(np.float32)),),
    outputs=(TensorSpec("K", (1,), np.dtype(np.int32)),),
    max_batch_size=0,
    decoupled=True,
)
INPUTS = {"X": np.ones(2, np.float32)}


@pytest.fixture
def pool() -> Iterator[ModelPool]:
    """One slot over a real region (no server needed)."""
    layout = SlotLayout.for_model(SPEC)
    region = SharedMemoryRegion.create(new_region_name("s"), layout.region_bytes(1))
    try:
        memory = SlotMemory(region, layout, 1)
        yield ModelPool.over(
            SPEC, memory, SlotPool(1, name="s"), RegionHeader.new(region.buffer, 1)
        )
    finally:
        region.unlink()


def response(k: int | None, *, final: bool = False, error: str = "") -> Any:
    """A ``ModelStreamInferResponse``: response ``k`` (``None``: no outputs), final or not."""
    message = service_pb2.ModelStreamInferResponse(error_message=error)
    answer = message.infer_response
    answer.id = "r"  # the request's id, echoed
    if k is not None:
        answer.outputs.add(name="K", datatype="INT32", shape=[1])
        answer.raw_output_contents.append(np.array([k], np.int32).tobytes())
    if final is not None:
        answer.parameters["triton_final_response"].bool_param = final
    return message


def before_running(error: str) -> Any:
    """An error Triton answers before it runs a request: no final flag at all."""
    message = service_pb2.ModelStreamInferResponse(error_message=error)
    return message


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self._code, self._message = code, message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message


GONE = _RpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")


class ScriptedTriton:
    """Answers each send with the next script: a list of responses or errors, in order."""

    def __init__(self, pool: ModelPool, *scripts: list[Any]) -> None:
        self.pool = pool
        self.scripts = list(scripts)
        self.steps: list[Step] = []
        self._current: list[Any] = []

    def __call__(self, step: Step, arg: Any) -> Any:
        self.steps.append(step)
        if step is Step.SLOT:
            return self.pool.slots.acquire(arg)
        if step is Step.OPEN:
            self._current = list(self.scripts.pop(0))
            return None
        if step in (Step.RECONNECT, Step.REREGISTER):
            return None
        assert step is Step.NEXT
        item = self._current.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    async def async_call(self, step: Step, arg: Any) -> Any:
        return self(step, arg)


def run(pool: ModelPool, triton: ScriptedTriton) -> list[StreamResponse]:
    steps = stream(pool, prepare_batch(SPEC, INPUTS), slot_timeout_s=None, request_id="r")
    return list(drive_stream(steps, triton, Step.DELIVER))


def tokens(responses: list[StreamResponse]) -> list[int]:
    return [int(r["K"][0]) for r in responses]


def test_responses_come_in_order_and_the_final_one_frees_the_slot(pool: ModelPool) -> None:
    triton = ScriptedTriton(pool, [response(0), response(1), response(None, final=True)])
    got = run(pool, triton)
    assert tokens(got) == [0, 1] and [r.index for r in got] == [0, 1]
    assert not any(r.final for r in got)
    assert pool.slots.stats().in_use == 0 and triton.steps.count(Step.OPEN) == 1


def test_a_final_response_with_outputs_is_delivered_as_final(pool: ModelPool) -> None:
    got = run(pool, ScriptedTriton(pool, [response(0), response(1, final=True)]))
    assert [r.final for r in got] == [False, True]
    assert pool.slots.stats().in_use == 0


def test_triton_gone_before_the_first_response_sends_again(pool: ModelPool) -> None:
    triton = ScriptedTriton(pool, [GONE], [response(0), response(None, final=True)])
    assert tokens(run(pool, triton)) == [0]
    assert triton.steps.count(Step.OPEN) == 2 and Step.RECONNECT in triton.steps
    assert pool.slots.stats().in_use == 0


def test_triton_gone_after_a_response_is_never_sent_again(pool: ModelPool) -> None:
    triton = ScriptedTriton(pool, [response(0), response(1), GONE])
    got: list[StreamResponse] = []
    with pytest.raises(StreamInterruptedError, match=r"after 2 response\(s\)") as failed:
        for item in drive_stream(
            stream(pool, prepare_batch(SPEC, INPUTS), slot_timeout_s=None, request_id="r"),
            triton,
            Step.DELIVER,
        ):
            got.append(item)
    assert tokens(got) == [0, 1] and failed.value.delivered == 2
    assert triton.steps.count(Step.OPEN) == 1
    # Triton may still run it (cut off, not answered): abandoned until proven done.
    assert pool.slots.stats().abandoned == 1


def test_a_region_forgotten_is_registered_again_once(pool: ModelPool) -> None:
    missing = before_running("Unable to find shared memory region: 'r@0'")
    triton = ScriptedTriton(pool, [missing], [response(0), response(None, final=True)])
    assert tokens(run(pool, triton)) == [0]
    assert triton.steps.count(Step.REREGISTER) == 1
    twice = ScriptedTriton(pool, [missing], [missing])
    with pytest.raises(TritonServerError, match="Unable to find shared memory region"):
        run(pool, twice)
    assert pool.slots.stats().in_use == 0  # refused before it ran: the slot is free at once


def test_a_triton_shutting_down_is_waited_out(pool: ModelPool) -> None:
    down = before_running("Request for unknown model: 's' has no available versions")
    triton = ScriptedTriton(pool, [down], [response(0), response(None, final=True)])
    assert tokens(run(pool, triton)) == [0]
    assert Step.RECONNECT in triton.steps


def test_a_final_error_frees_the_slot_a_non_final_one_abandons_it(pool: ModelPool) -> None:
    final = ScriptedTriton(pool, [response(0), response(None, final=True, error="boom")])
    with pytest.raises(TritonServerError, match=r"after 1 response\(s\): boom"):
        run(pool, final)
    assert pool.slots.stats().in_use == 0
    going_on = ScriptedTriton(pool, [response(0), response(None, final=False, error="hmm")])
    with pytest.raises(TritonServerError, match="hmm"):
        run(pool, going_on)
    assert pool.slots.stats().abandoned == 1  # Triton may still send: not free yet


def test_a_caller_that_stops_reading_abandons_the_slot(pool: ModelPool) -> None:
    triton = ScriptedTriton(pool, [response(0), response(1), response(None, final=True)])
    driven = drive_stream(
        stream(pool, prepare_batch(SPEC, INPUTS), slot_timeout_s=None, request_id="r"),
        triton,
        Step.DELIVER,
    )
    assert tokens([next(driven)]) == [0]
    driven.close()
    assert pool.slots.stats().abandoned == 1


def test_a_caller_that_stops_after_the_final_response_leaves_the_slot_free(
    pool: ModelPool,
) -> None:
    triton = ScriptedTriton(pool, [response(0, final=True)])
    driven = drive_stream(
        stream(pool, prepare_batch(SPEC, INPUTS), slot_timeout_s=None, request_id="r"),
        triton,
        Step.DELIVER,
    )
    assert next(driven).final
    driven.close()
    assert pool.slots.stats().in_use == 0 and pool.slots.stats().abandoned == 0


def test_the_async_driver_runs_the_same_steps(pool: ModelPool) -> None:
    script = [response(0), response(1), response(None, final=True)]
    sync = ScriptedTriton(pool, list(script))
    assert tokens(run(pool, sync)) == [0, 1]
    async_ = ScriptedTriton(pool, list(script))

    async def main() -> list[StreamResponse]:
        steps = stream(pool, prepare_batch(SPEC, INPUTS), slot_timeout_s=None, request_id="r")
        return [r async for r in drive_stream_async(steps, async_.async_call, Step.DELIVER)]

    assert tokens(asyncio.run(main())) == [0, 1] and async_.steps == sync.steps


def test_a_response_to_another_request_is_refused(pool: ModelPool) -> None:
    stranger = response(0)
    stranger.infer_response.id = "someone else"
    with pytest.raises(TritonServerError, match="someone else"):
        run(pool, ScriptedTriton(pool, [stranger]))
    assert pool.slots.stats().abandoned == 1  # this request may still run in Triton


def test_an_error_response_survives_pickle() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(StreamErrorResponse("boom", answered=True)))
    assert error.details() == "boom" and error.answered
