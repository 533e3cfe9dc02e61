"""Random bytes over a region's header: every reader returns a value in its range or raises
:class:`ForeignRegionError`; every writer goes on; no slot is taken past the region, none
leaks, no caller hangs past its deadline."""

from __future__ import annotations

import math

import numpy as np
from _counts import examples, tried
from hypothesis import example, given
from hypothesis import strategies as st

from ray_triton_shm import ForeignRegionError, OverloadedError, SlotTimeoutError
from ray_triton_shm._exceptions import ERROR_KINDS
from ray_triton_shm._slots._header import (
    BUCKET_BOUNDS_S,
    LAYOUT_VERSION,
    LIMITS,
    MAX_SEATS,
    MAX_SLOTS,
    RegionHeader,
    header_version,
)
from ray_triton_shm._slots._shared_slots import SharedSlots
from ray_triton_shm._slots._shm import SharedMemoryRegion, new_region_name
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES

#: The words that matter most: settings, failures, the first seats, the first slots' words.
_HOT_BYTES = 8 * (32 + 64 + 2 * 130)

#: Writes over a stamped header: (offset, bytes), some over its stamp, most elsewhere.
writes = st.lists(
    st.tuples(
        st.one_of(st.integers(0, _HOT_BYTES), st.integers(0, REGION_HEADER_BYTES - 1), st.just(72)),
        st.one_of(
            st.binary(min_size=1, max_size=64),
            st.integers(-(2**63), 2**63 - 1).map(lambda v: v.to_bytes(8, "little", signed=True)),
            st.sampled_from([b"\xff" * 8, (2**63 - 1).to_bytes(8, "little"), b"\x00" * 8]),
        ),
    ),
    max_size=12,
)


def _scribbled(slot_count: int, scribbles: list[tuple[int, bytes]]) -> bytearray:
    buffer = bytearray(REGION_HEADER_BYTES)
    RegionHeader.new(buffer, slot_count, region="r")
    for offset, data in scribbles:
        buffer[offset : offset + len(data)] = data[: REGION_HEADER_BYTES - offset]
    return buffer


def _read_everything(header: RegionHeader, slot_count: int) -> None:
    """Every reader: a value in its range."""
    assert 1 <= header.size <= slot_count or header.size == slot_count
    assert 1 <= header.min_size <= header.size
    assert 0 <= header.max_waiting <= MAX_SEATS
    assert header.limited_by in LIMITS
    assert header.memory in ("system", "cuda", "inline")
    assert all(0 <= s < slot_count for s in header.busy_slots())
    assert all(0 <= s < slot_count for s in header.abandoned_slots())
    assert all(0 <= s < MAX_SEATS for s in header.queued_seats())
    assert len(header.queued()) == slot_count and min(header.queued(), default=0) >= 0
    assert set(header.failures()) == set(ERROR_KINDS)
    header.totals()
    assert all(len(h) == len(BUCKET_BOUNDS_S) for h in header.histograms().values())
    for q in (0.5, 0.99):
        assert header.latency_quantile_s(q) >= 0 and not math.isnan(header.settle_quantile_s(q))
    for seat in range(min(header.max_waiting, 4)):
        header.queued_on(seat)


def _write_everything(header: RegionHeader, slot_count: int) -> None:
    """Every writer a caller or the owner uses: none raises, whatever the words hold."""
    for slot in range(slot_count):
        header.count(slot, 3, 48, 48, 10_000)
        header.count_error(slot)
        header.count_wait(slot, 2**40)
        header.count_take(slot, 5_000)
        header.abandon(slot, 1)
        header.settle(slot, 2**62)
    header.count_failure("other")
    header.set_size(max(1, slot_count - 1))
    header.set_size(slot_count)


@given(slot_count=st.integers(1, MAX_SLOTS), scribbles=writes)
@example(slot_count=4, scribbles=[(8, b"\x07" + b"\x00" * 7)])  # a retired word, stamp kept
@example(slot_count=4, scribbles=[(24, (99).to_bytes(8, "little"))])  # a memory word past kinds
@example(slot_count=2, scribbles=[(32, (2**63 - 1).to_bytes(8, "little"))])  # a size past int64
@example(slot_count=2, scribbles=[(8 * 1056, b"\xff" * 7 + b"\x7f")])  # a counter at int64's max
@examples(900, soak=36_000)
def test_random_words_read_in_range_or_refused_by_name(
    slot_count: int, scribbles: list[tuple[int, bytes]]
) -> None:
    tried("header: words")
    buffer = _scribbled(slot_count, scribbles)
    header = RegionHeader(buffer, slot_count, region="r")
    try:
        header.check()
        _read_everything(header, slot_count)
    except ForeignRegionError as exc:
        assert exc.region == "r" and exc.expected_version == LAYOUT_VERSION
        assert not header.intact or "memory word" in str(exc)
    _write_everything(header, slot_count)


@given(data=st.binary(max_size=256), padding=st.integers(0, REGION_HEADER_BYTES))
@examples(1200, soak=24_000)
def test_random_bytes_open_as_ours_only_with_our_stamp(data: bytes, padding: int) -> None:
    """A region of random bytes, of any length: opened only if it bears this layout's stamp,
    else refused by name; ``status``'s reading agrees."""
    tried("header: open")
    buffer = bytearray(data + bytes(padding))
    ours = len(buffer) >= REGION_HEADER_BYTES and header_version(bytes(buffer)) == LAYOUT_VERSION
    try:
        RegionHeader.open(buffer, 1, region="r")
    except ForeignRegionError as exc:
        assert not ours and exc.version == (
            header_version(bytes(buffer)) if len(buffer) >= REGION_HEADER_BYTES else None
        )
    else:
        assert ours


@given(slot_count=st.integers(1, 8), scribbles=writes)
@example(slot_count=2, scribbles=[(8 * (1056 + 8), b"\x01")])  # slot 0 abandoned, stamp kept
# Its only slot abandoned, no seat (max_waiting 0), the stamp gone: once "0 callers already
# wait" (OverloadedError, naming no region), before anything checked the stamp.
@example(slot_count=1, scribbles=[(0, b"\x00" * 8), (8 * (1056 + 8), b"\x01"), (72, b"\x00")])
@examples(180, soak=1500)
def test_callers_on_a_scribbled_region_take_a_slot_or_fail_by_name(
    slot_count: int, scribbles: list[tuple[int, bytes]]
) -> None:
    """A caller of a region whose header was written over (shared slots, as in the Ray
    layer): a slot of the region, or a named error by its deadline; nothing held after. A
    header without its stamp is refused by name before any error its words could cause (a
    timeout, no seat); one with its stamp is believed (those errors are the load's)."""
    tried("header: shared slots")
    region = SharedMemoryRegion.create(new_region_name("prop"), REGION_HEADER_BYTES)
    try:
        RegionHeader.new(region.buffer, slot_count).configure(max_waiting=4)
        view = np.frombuffer(region.buffer, np.uint8, REGION_HEADER_BYTES)
        for offset, data in scribbles:
            end = min(offset + len(data), REGION_HEADER_BYTES)
            view[offset:end] = np.frombuffer(data[: end - offset], np.uint8)
        header = RegionHeader(region.buffer, slot_count, region=region.name)
        slots = SharedSlots(region.name, header, slot_count, model="m")
        try:
            try:
                slot = slots.acquire(timeout_s=0.02)
            except ForeignRegionError as exc:
                assert (exc.region, exc.model) == (region.name, "m") and not header.intact
            except (SlotTimeoutError, OverloadedError):
                assert header.intact
            else:
                assert 0 <= slot < header.size
                slots.release(slot)
            assert slots.stats().in_use == 0
        finally:
            slots.close(wait_s=0)
        del header, view
    finally:
        region.unlink()
        region.close()
