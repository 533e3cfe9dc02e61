"""Words of a region's header that nobody of ours wrote, where they are read: a caller finds no
slot (a timeout, no seat), a ``retired`` word no owner set, a memory word out of range, and
one reading of the pool for stats and metrics. Each is refused by name (``ForeignRegionError``
naming the region and the model) or read as nothing, never believed.

The same against a real Triton and the Ray node actor: test_region_header.py and
test_ray_foreign_header.py; random words: tests/properties/test_prop_header.py."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from ray_triton_shm import ClientClosedError, ForeignRegionError, SlotTimeoutError
from ray_triton_shm._exceptions import ERROR_KINDS
from ray_triton_shm._inference._model_pool import ModelPool, PoolRetired
from ray_triton_shm._pools._retry import follow_model
from ray_triton_shm._pools._snapshot import PoolSnapshot
from ray_triton_shm._slots._header import _MAGIC, _MEMORY, _RETIRED, LAYOUT_VERSION, RegionHeader
from ray_triton_shm._slots._memory import SlotMemory, open_memory
from ray_triton_shm._slots._shared_slots import SharedSlots
from ray_triton_shm._slots._shm import SHM_DIR, SharedMemoryRegion, new_region_name
from ray_triton_shm._slots._slot_pool import SlotPool
from ray_triton_shm._slots._specs import ModelSpec, SlotLayout, TensorSpec

SPEC = ModelSpec(
    name="m",
    version="",
    inputs=(TensorSpec("X", (2,), np.dtype(np.float32)),),
    outputs=(TensorSpec("Y", (2,), np.dtype(np.float32)),),
    max_batch_size=2,
)
LAYOUT = SlotLayout.for_model(SPEC)


@pytest.fixture
def region() -> Iterator[SharedMemoryRegion]:
    """A region of two slots, its header stamped, two seats (no server needed)."""
    made = SharedMemoryRegion.create(new_region_name("m"), LAYOUT.region_bytes(2))
    RegionHeader.new(made.buffer, 2, region=made.name).configure(max_waiting=2)
    try:
        yield made
    finally:
        made.unlink()
        made.close()


def _write(region: SharedMemoryRegion, word: int, value: int) -> None:
    """``value`` into a header word, as a stray writer would: through the file."""
    fd = os.open(SHM_DIR / region.name, os.O_RDWR)
    try:
        os.pwrite(fd, np.int64(value).tobytes(), 8 * word)
    finally:
        os.close(fd)


def _pool(region: SharedMemoryRegion, *, shared: bool = False) -> ModelPool:
    header = RegionHeader(region.buffer, 2, region=region.name)
    slots = SharedSlots(region.name, header, 2, model="m") if shared else SlotPool(2, name="m")
    return ModelPool.over(SPEC, SlotMemory(region, LAYOUT, 2), slots, header)


class NoReplacement:
    """An owner of the model's layouts that knows none after the one a call ran on."""

    def replacement(self, target: ModelPool, exc: BaseException) -> ModelPool | None:
        return None

    def newer(self, target: ModelPool, exc: BaseException, since: float) -> ModelPool | None:
        return None


def _followed(pool: ModelPool) -> BaseException:
    with pytest.raises((ForeignRegionError, ClientClosedError)) as info:
        follow_model(
            pool, PoolRetired(pool), NoReplacement(), follows=True, sequence=False, started=0
        )
    return info.value


def test_a_retired_word_no_owner_wrote_is_refused_by_name(region: SharedMemoryRegion) -> None:
    """Its owner knows no layout after it, and the pool records none: the word is nobody's
    of ours (it used to reach the caller as the internal ``PoolRetired``)."""
    _write(region, _RETIRED, 1)
    error = _followed(_pool(region))
    assert isinstance(error, ForeignRegionError)
    assert (error.region, error.model, error.version) == (region.name, "m", LAYOUT_VERSION)
    assert "'retired' word" in str(error) and region.name in str(error)


def test_a_retired_word_with_the_stamp_gone_is_refused_for_the_stamp(
    region: SharedMemoryRegion,
) -> None:
    _write(region, _RETIRED, 1)
    _write(region, _MAGIC, 0)
    error = _followed(_pool(region))
    assert isinstance(error, ForeignRegionError) and error.version is None
    assert (error.region, error.model) == (region.name, "m")
    assert "no ray-triton-shm stamp" in str(error)


def test_a_pool_retired_by_its_owner_that_then_closed_is_closed(
    region: SharedMemoryRegion,
) -> None:
    """Its successor recorded (the owner retired it), none now: the client was closed or the
    model unregistered since."""
    pool = _pool(region)
    pool.following.successor = _pool(region)
    pool.header.retire()
    error = _followed(pool)
    assert type(error) is ClientClosedError and error.model == "m"


def test_no_free_slot_and_no_seat_in_a_header_written_over_is_refused_by_name(
    region: SharedMemoryRegion,
) -> None:
    """Both slots abandoned and no seat, by the words of a stray writer that wiped the stamp:
    refused by name, not "0 callers already wait" (``OverloadedError``, naming no region)."""
    pool = _pool(region, shared=True)
    try:
        pool.header.abandon(0, 1)
        pool.header.abandon(1, 1)
        _write(region, 0, 0)  # max_waiting
        _write(region, _MAGIC, 0)
        for timeout_s in (None, 0.05):
            with pytest.raises(ForeignRegionError) as info:
                pool.slots.acquire(timeout_s=timeout_s)
            assert (info.value.region, info.value.model) == (region.name, "m")
        assert pool.header.failures()["overloaded"] == 0  # nothing counted into its words
    finally:
        pool.slots.close(wait_s=0)


def test_a_wait_that_ends_after_the_stamp_was_wiped_is_refused_by_name(
    region: SharedMemoryRegion,
) -> None:
    """A caller queued behind busy slots when the header lost its stamp: at its deadline, it
    is told the region is not ours, not that the slots were busy."""
    pool = _pool(region, shared=True)
    try:
        held = [pool.slots.acquire(), pool.slots.acquire()]
        with pytest.raises(SlotTimeoutError):
            pool.slots.acquire(timeout_s=0.05)  # ours: the load's
        _write(region, _MAGIC, 0)
        with pytest.raises(ForeignRegionError) as info:
            pool.slots.acquire(timeout_s=0.05)
        assert (info.value.region, info.value.model) == (region.name, "m")
        for slot in held:
            pool.slots.release(slot)
    finally:
        pool.slots.close(wait_s=0)


@pytest.mark.parametrize("model", ["m", None])
def test_a_memory_word_out_of_range_is_refused_naming_the_region(
    region: SharedMemoryRegion, model: str | None
) -> None:
    assert type(open_memory(region, LAYOUT, 2, model=model)) is SlotMemory
    _write(region, _MEMORY, 2**63 - 1)
    with pytest.raises(ForeignRegionError) as info:
        open_memory(region, LAYOUT, 2, model=model)
    assert (info.value.region, info.value.model) == (region.name, model)
    assert region.name in str(info.value) and "memory word" in str(info.value)
    assert info.value.expected_version == LAYOUT_VERSION


@pytest.mark.parametrize("node_wide", [False, True])
def test_a_snapshot_of_a_header_written_over_reads_none_of_its_words(
    region: SharedMemoryRegion, node_wide: bool
) -> None:
    """Counters past any request, a failure count below zero, the stamp gone: the stats and
    metrics read zeros, flagged ``foreign``; what the slots' locks say stays."""
    pool = _pool(region, shared=node_wide)
    try:
        slot = pool.slots.acquire()
        pool.header.count(slot, 2, 16, 16, 1_000_000)
        before = PoolSnapshot.of(pool, node_wide=node_wide)
        assert not before.foreign and before.counters["requests"] == 1 and before.in_use == 1
        # Failures, seats and the first slots' words: a stray writer's.
        np.frombuffer(region.buffer, np.int64, 2048)[16:2048] = -(2**40)
        _write(region, _MAGIC, 0)
        now = PoolSnapshot.of(pool, node_wide=node_wide)
        assert now.foreign and (now.region, now.in_use, now.max_size) == (region.name, 1, 2)
        assert now.size == now.min_size == now.abandoned == now.overloads == 0
        assert now.failures == dict.fromkeys(ERROR_KINDS, 0)
        assert set(now.counters.values()) == {0} and set(now.counters) == set(before.counters)
        assert all(
            not h.any() and h.shape == before.histograms[k].shape for k, h in now.histograms.items()
        )
        assert now.latency_p99_us == now.wait_p99_us == now.settle_p99_us == 0
        assert not now.rows_histogram.any() and now.rows_per_request == 0.0
        assert (now.company_waits, now.company_wait_ns, now.company_wait_mean_us) == (0, 0, 0.0)
        pool.slots.release(slot)
    finally:
        pool.slots.close(wait_s=0)
