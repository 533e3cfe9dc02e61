"""Node batching across the processes of a real local Ray, against a real Triton: calls of
many task processes merged into one Triton request, each answered exactly its own rows
(``batch_affine``: Y = 2 X + 1), and a batch's sender or member SIGKILLed mid-batch.

Where a batch stands is read from the region's boards in the test's process (it is on the
node): each step is waited for as an event, never as time."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from _helpers import node_actor_of_module, wait_for
from ray import cloudpickle

from ray_triton_shm import NodeBatching
from ray_triton_shm._slots._board import BatchBoard
from ray_triton_shm._slots._header import RegionHeader
from ray_triton_shm._slots._shm import SharedMemoryRegion, list_local_regions
from ray_triton_shm.ray import ShmModel

# Ship this module's functions and actor classes by value (workers cannot import it).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODEL = "batch_affine"
MAX_SHAPES = {"X": (16,), "Y": (16,)}
#: How long a request held in Triton takes (the model sleeps it): the next batch forms.
HELD_US = 1_500_000


@pytest.fixture(scope="module")
def node_actor(ray_local: str) -> Iterator[Any]:
    with node_actor_of_module() as actor:
        yield actor


@pytest.fixture(scope="module")
def model(node_actor: Any) -> Iterator[ShmModel]:
    handle = ShmModel(
        MODEL,
        max_shapes=MAX_SHAPES,
        pool_size=6,
        node_batching=NodeBatching(max_delay_s=30.0, max_in_triton=1),
    )
    assert handle.spec.max_batch_size == 32  # registered, here in the driver
    try:
        yield handle
    finally:
        handle.close()


def inputs(value: float, rows: int, delay_us: int = 0) -> dict[str, np.ndarray]:
    x = (value + np.arange(rows * 4, dtype=np.float32) / 8).reshape(rows, 4)
    return {"X": x, "DELAY_US": np.full((rows, 1), delay_us, np.int32)}


def stats(node_actor: Any) -> dict[str, Any]:
    return ray.get(node_actor.stats.remote()).models[MODEL]  # type: ignore[no-any-return]


@ray.remote(num_cpus=0)
def calls_in_task(model: ShmModel, worker: int, calls: int) -> int:
    """``calls`` calls of 1 to 3 rows, each row its own values; returns the wrong answers."""
    wrong = 0
    for n in range(calls):
        given = inputs(worker * 1000 + n, 1 + (worker + n) % 3, delay_us=200)
        y = model.infer(given)["Y"]
        wrong += not np.array_equal(y, 2 * given["X"] + 1)
    return wrong


def test_sixteen_processes_get_exactly_their_own_rows(model: ShmModel, node_actor: Any) -> None:
    before = stats(node_actor)
    calls = 80
    wrong = ray.get([calls_in_task.remote(model, worker, calls) for worker in range(16)])
    assert wrong == [0] * 16
    after = stats(node_actor)
    requests = after["requests"] - before["requests"]
    samples = after["samples"] - before["samples"]
    assert samples == sum(1 + (w + n) % 3 for w in range(16) for n in range(calls))
    assert requests < 16 * calls, "no call of one process was merged with another's"
    # Seen: rows per Triton request in the node actor's stats, and the same in a process's
    # shm_stats() (the region's counters); batches of over 4 rows, which no call has alone.
    assert after["node_batching"] and after["rows_per_request"] > 1, after
    assert after["rows_per_request"] == pytest.approx(after["samples"] / after["requests"])
    assert sum(after["rows_histogram"].values()) == after["requests"]
    grew = {b: n - before["rows_histogram"][b] for b, n in after["rows_histogram"].items()}
    assert sum(n for bound, n in grew.items() if bound > 4) > 0, grew
    seen = model.shm_stats()
    assert seen.node_batching and seen.rows_histogram == after["rows_histogram"], seen
    assert seen.rows_per_request == after["rows_per_request"]


@ray.remote(num_cpus=0)
class Caller:
    """A process of the node that calls the model when told."""

    def pid(self) -> int:
        return os.getpid()

    def call(self, model: ShmModel, value: float, delay_us: int) -> bool:
        given = inputs(value, 1, delay_us)
        return bool(np.array_equal(model.infer(given)["Y"], 2 * given["X"] + 1))


class Boards:
    """The model's boards on the node, read from the test's process."""

    def __init__(self, model: ShmModel) -> None:
        region_name = next(r.name for r in list_local_regions() if MODEL in r.name)
        self._region = SharedMemoryRegion.attach(region_name)
        self.size = 6
        self.header = RegionHeader(self._region.buffer, self.size)
        self.board = BatchBoard(self.header, region_name)

    def in_triton(self) -> int:
        """Requests of the model in Triton, batched or not."""
        return self.header.in_triton(self.size)

    def forming(self) -> list[tuple[int, int, int]]:
        return self.board.forming(self.size)

    def close(self) -> None:
        self.board.close()
        self._region.close()


@pytest.fixture
def boards(model: ShmModel) -> Iterator[Boards]:
    seen = Boards(model)
    yield seen
    seen.close()


def _callers(model: ShmModel, count: int) -> list[tuple[Any, int]]:
    """``count`` processes, started and bound to the model (each answered once)."""
    callers = [Caller.remote() for _ in range(count)]  # type: ignore[attr-defined]
    assert ray.get([c.call.remote(model, 0.0, 0) for c in callers]) == [True] * count
    return [(c, ray.get(c.pid.remote())) for c in callers]


def test_the_sender_killed_mid_request_loses_no_other_answer(
    model: ShmModel, node_actor: Any, boards: Boards
) -> None:
    """A batch forms behind one held in Triton; once it is in Triton too, its sender is
    SIGKILLed: its member finds the batch lost and sends its row again, answered right."""
    (first_caller, _), (sender, sender_pid), (member_caller, _) = _callers(model, 3)
    held = first_caller.call.remote(model, 1.0, HELD_US)
    wait_for(lambda: boards.in_triton() == 1, what="the first request in Triton")
    sender.call.remote(model, 2.0, HELD_US)
    wait_for(lambda: len(boards.forming()) == 1, what="a batch forming")
    member = member_caller.call.remote(model, 3.0, 0)
    wait_for(lambda: [m for _, _, m in boards.forming()] == [1], what="a member joined")
    assert ray.get(held, timeout=60) is True  # answered: the batch goes out
    wait_for(lambda: not boards.forming() and boards.in_triton() == 1, what="the batch in Triton")
    os.kill(sender_pid, signal.SIGKILL)
    assert ray.get(member, timeout=60) is True  # sent again, alone, and answered
    ray.kill(sender)
    wait_for(
        lambda: (s := stats(node_actor))["in_use"] == s["abandoned"] == 0,
        what="every slot back (the sender's once Triton is done with it)",
        timeout_s=60,
    )


def test_a_member_killed_in_a_forming_batch_does_not_stop_it(
    model: ShmModel, node_actor: Any, boards: Boards
) -> None:
    """Its rows were written; killed before its answer, it reads nothing: the batch goes out
    all the same, and its sender is answered right."""
    (first_caller, _), (sender_caller, _), (member, member_pid) = _callers(model, 3)
    held = first_caller.call.remote(model, 4.0, HELD_US)
    wait_for(lambda: boards.in_triton() == 1, what="the first request in Triton")
    sender = sender_caller.call.remote(model, 5.0, 0)
    wait_for(lambda: len(boards.forming()) == 1, what="a batch forming")
    member.call.remote(model, 6.0, 0)
    wait_for(lambda: [m for _, _, m in boards.forming()] == [1], what="a member joined")
    os.kill(member_pid, signal.SIGKILL)
    assert ray.get(sender, timeout=60) is True
    assert ray.get(held, timeout=60) is True
    ray.kill(member)
    wait_for(
        lambda: (s := stats(node_actor))["in_use"] == s["abandoned"] == 0,
        what="every slot back",
        timeout_s=60,
    )
