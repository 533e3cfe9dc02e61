"""Slot leases on a real Triton: inputs written in the slot, outputs read in it, never another
request's bytes.

* Exact answers on the example models, sync and async, against ``infer_shm`` on the same
  inputs.
* The views' promise: an output kept past its block keeps its slot (no other request can take
  it, so its bytes never change), and the slot comes back when the view is dropped; a soak of
  threads that keep views while others reuse the slots finds every kept view still its own.
* A lease given up by a deadline or a cancellation mid-request: its slot stays out of use until
  Triton answered, then serves again.
* Outputs kept past the block never stall the process: closing the client returns at once
  (nothing left in ``/dev/shm`` or in Triton, the outputs still right), and a caller waiting
  for a slot they keep is warned, and timed out, with where their lease was made.
* Bad leases (a batch past ``max_batch_size``, a wrong shape, BYTES inputs) are refused before
  any slot is taken or any byte written; nothing is left in ``/dev/shm`` after.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time

import numpy as np
import pytest
from _helpers import in_threads, registered_on, runs_in_triton, wait_for

from ray_triton_shm import (
    InvalidInputError,
    SlotTimeoutError,
    TritonServerError,
    TritonSHMClient,
)
from ray_triton_shm._client import registry_of
from ray_triton_shm._slots._shm import list_local_regions
from ray_triton_shm._slots._slot_pool import KEPT_WARNING_S
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES
from ray_triton_shm.local import LocalTritonServer

ECHO_SHAPES = {"DATA": (16,), "ECHO": (16,)}


def all_back(client: TritonSHMClient, model: str) -> bool:
    """``True`` once every slot of ``model`` is free, within a few seconds, else the test
    fails (a slot whose last view the garbage collector dropped comes back on the lease
    releaser's thread)."""
    return wait_for(
        lambda: client.shm_stats(model).in_use == 0, timeout_s=5, what=f"every slot of {model}"
    )


def test_a_lease_answers_as_infer_shm_does_sync_and_async(client: TritonSHMClient) -> None:
    client.register_shm_model("classifier", pool_size=2)
    client.register_shm_model(
        "identity", pool_size=2, max_shapes={"INPUT0": (32,), "OUTPUT0": (32,)}
    )
    rng = np.random.default_rng(7)
    images = rng.random((8, 3, 224, 224), dtype=np.float32)
    expected = client.infer_shm("classifier", {"INPUT0": images})["OUTPUT0"]

    with client.lease("classifier", batch=8) as lease:
        assert lease.inputs["INPUT0"].shape == (8, 3, 224, 224)
        np.multiply(images, 1.0, out=lease.inputs["INPUT0"])  # the preprocessing writes it
        probs = lease.infer()["OUTPUT0"]
        np.testing.assert_array_equal(probs, expected)
        assert not probs.flags.writeable
        with pytest.raises(RuntimeError, match="one request"):
            lease.infer()
    del probs

    x = rng.random((5, 7), dtype=np.float32)

    async def leased() -> np.ndarray:
        async with client.lease("identity", batch=5, shapes={"INPUT0": (7,)}) as lease:
            lease.inputs["INPUT0"][:] = x
            return np.array((await lease.infer_async())["OUTPUT0"])  # a copy of its own

    np.testing.assert_array_equal(asyncio.run(leased()), x)
    gc.collect()
    assert all_back(client, "classifier") and all_back(client, "identity")


def test_a_view_kept_past_its_block_keeps_its_slot(client: TritonSHMClient) -> None:
    client.register_shm_model("identity", pool_size=1, max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)})
    shape = {"INPUT0": (4,)}
    with client.lease("identity", batch=2, shapes=shape) as lease:
        lease.inputs["INPUT0"][:] = 1.0
        kept = lease.infer()["OUTPUT0"][1:]  # a view of a view
    assert client.shm_stats("identity").in_use == 1
    # The only slot is the view's: no other request can take it, so its bytes stay.
    with (
        pytest.raises(SlotTimeoutError),
        client.lease("identity", batch=2, shapes=shape, slot_timeout_s=0.2),
    ):
        pass
    x = np.full((2, 4), 2.0, np.float32)
    with pytest.raises(SlotTimeoutError):
        client.infer_shm("identity", {"INPUT0": x}, slot_timeout_s=0.2)
    np.testing.assert_array_equal(kept, np.ones((1, 4), np.float32))
    assert registry_of(client).get("identity").header.failures()["deadline"] == 2  # each, counted
    del kept  # the last array of the lease: its slot is back
    assert all_back(client, "identity")
    np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)


def test_views_kept_under_load_are_never_another_requests(client: TritonSHMClient) -> None:
    """Threads lease, write their own values, keep some outputs for a while and check them at
    the end, while the others reuse every slot they can."""
    client.register_shm_model(
        "identity", pool_size=3, max_shapes={"INPUT0": (64,), "OUTPUT0": (64,)}
    )
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    lock = threading.Lock()
    stop = time.monotonic() + 4.0  # the load itself: 4 s of it

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while time.monotonic() < stop:
            rows = int(rng.integers(1, 9))
            x = rng.random((rows, 64), dtype=np.float32)
            with client.lease("identity", batch=rows, shapes={"INPUT0": (64,)}) as lease:
                lease.inputs["INPUT0"][:] = x
                out = lease.infer()["OUTPUT0"]
            np.testing.assert_array_equal(out, x)
            with lock:
                kept.append((out, x))  # past the block
                if len(kept) > 2:  # the pool has 3 slots: keep at most 2 of them
                    old, want = kept.pop(0)
                    np.testing.assert_array_equal(old, want)
                    del old  # a view held on would hold its slot (the pool has 3)
            del out

    in_threads(work, range(4))
    for view, want in kept:
        np.testing.assert_array_equal(view, want)
    del view  # the loop's last view would keep its slot
    kept.clear()
    assert all_back(client, "identity")


def test_a_lease_given_up_mid_request_keeps_its_slot_until_triton_answers(
    client: TritonSHMClient, triton: LocalTritonServer
) -> None:
    client.register_shm_model("delay_echo", pool_size=1, max_shapes=ECHO_SHAPES)
    data = np.arange(16, dtype=np.float32)

    shapes = {"DATA": (16,)}

    def lease_and_wait(delay_ms: int, **options: float) -> None:
        with client.lease("delay_echo", shapes=shapes, **options) as lease:
            lease.inputs["DELAY_MS"][:] = delay_ms
            lease.inputs["DATA"][:] = data
            lease.infer()

    # A deadline: Triton still runs the request, so its slot is not free before it answers.
    started = time.monotonic()
    with pytest.raises(TritonServerError, match="client_timeout_s"):
        lease_and_wait(1500, client_timeout_s=0.2)
    assert client.shm_stats("delay_echo").in_use == 1
    with client.lease("delay_echo", shapes=shapes, slot_timeout_s=10) as lease:
        assert time.monotonic() - started >= 1.4  # only once Triton answered
        lease.inputs["DELAY_MS"][:] = 0
        lease.inputs["DATA"][:] = data + 1
        np.testing.assert_array_equal(lease.infer()["ECHO"], data + 1)

    # A cancellation of the awaiting coroutine, the same.
    async def cancelled() -> None:
        async with client.lease("delay_echo", shapes=shapes) as lease:
            lease.inputs["DELAY_MS"][:] = 1500
            lease.inputs["DATA"][:] = data
            with runs_in_triton(triton, "delay_echo") as runs:
                task = asyncio.ensure_future(lease.infer_async())
                await asyncio.to_thread(wait_for, runs, what="the request running in Triton")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    started = time.monotonic()
    asyncio.run(cancelled())
    gc.collect()
    assert client.shm_stats("delay_echo").in_use == 1
    echo = client.infer_shm(
        "delay_echo", {"DELAY_MS": np.array([0], np.int32), "DATA": data}, slot_timeout_s=10
    )["ECHO"]
    assert time.monotonic() - started >= 1.4
    np.testing.assert_array_equal(echo, data)
    assert all_back(client, "delay_echo")


def test_bad_leases_are_refused_before_anything_is_written(client: TritonSHMClient) -> None:
    client.register_shm_model("classifier", pool_size=2)
    client.register_shm_model("identity", pool_size=1, max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)})
    client.register_shm_model("strings", pool_size=1, max_element_bytes={"INPUT0": 8, "OUTPUT0": 8})
    pool = registry_of(client).get("classifier")
    pool.region.buffer[REGION_HEADER_BYTES:] = b"\xab" * (pool.region.size - REGION_HEADER_BYTES)
    before = bytes(pool.region.buffer[REGION_HEADER_BYTES:])
    with pytest.raises(InvalidInputError, match=r"1 to 8 samples.*batch=9") as info:
        client.lease("classifier", batch=9)
    assert info.value.expected == "1 <= batch <= 8" and info.value.actual == 9
    with pytest.raises(InvalidInputError, match="batch=None"):
        client.lease("classifier")
    with pytest.raises(InvalidInputError, match=r"'INPUT0'.*variable dims"):
        client.lease("identity", batch=1)
    with pytest.raises(InvalidInputError, match=r"'INPUT0'.*\(5,\)") as info:
        client.lease("identity", batch=1, shapes={"INPUT0": (5,)})
    assert info.value.tensor == "INPUT0"
    with pytest.raises(InvalidInputError, match=r"'INPUT0' is BYTES"):
        client.lease("strings", batch=1)
    assert bytes(pool.region.buffer[REGION_HEADER_BYTES:]) == before
    assert client.shm_stats("classifier").in_use == 0
    assert registry_of(client).get("classifier").header.failures()["bad_input"] == 2


def test_close_with_outputs_kept_returns_at_once_and_leaves_nothing(grpc_url: str) -> None:
    """The guide's own example keeps ``outputs`` past its block: closing does not wait for
    them (Triton is done with them), yet they stay readable and right."""
    client = TritonSHMClient(url=grpc_url)
    client.register_shm_model("identity", pool_size=1, max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)})
    name = registry_of(client).get("identity").region.name
    with client.lease("identity", batch=1, shapes={"INPUT0": (4,)}) as lease:
        lease.inputs["INPUT0"][:] = 3.0
        outputs = lease.infer()
    started = time.monotonic()
    client.close()
    assert time.monotonic() - started < 5  # it waited 30 s for the kept view before
    assert name not in {r.name for r in list_local_regions()}
    assert name not in registered_on(grpc_url)
    np.testing.assert_array_equal(outputs["OUTPUT0"], np.full((1, 4), 3.0, np.float32))
    del outputs
    gc.collect()


def test_a_caller_waiting_on_kept_outputs_is_told_where_their_lease_was_made(
    client: TritonSHMClient,
) -> None:
    """A loop that keeps each lease's outputs, on a pool of 1 slot: its second lease waits
    for the first one's outputs, and is told so, with the line that made that lease."""
    client.register_shm_model("identity", pool_size=1, max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)})
    shape = {"INPUT0": (4,)}
    kept = []
    made_at = f"{__file__}:{sys._getframe().f_lineno + 1}"
    with client.lease("identity", batch=1, shapes=shape) as lease:
        lease.inputs["INPUT0"][:] = 1.0
        kept.append(lease.infer())
    waited = KEPT_WARNING_S + 0.5
    with (
        pytest.warns(RuntimeWarning, match="held only by arrays kept") as caught,
        pytest.raises(SlotTimeoutError) as error,
        client.lease("identity", batch=1, shapes=shape, slot_timeout_s=waited),
    ):
        pass
    assert made_at in str(caught[0].message)
    assert (
        f"all 1 slots busy); 1 of them held only by arrays kept from a lease made at "
        f"{made_at}" in str(error.value)
    )
    assert "del outputs" in str(error.value)
    kept.clear()  # the slot is back
    assert all_back(client, "identity")
    with client.lease("identity", batch=1, shapes=shape, slot_timeout_s=5) as lease:
        lease.inputs["INPUT0"][:] = 2.0
        np.testing.assert_array_equal(lease.infer()["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
