"""Slots shared by processes through a region's file locks, with real processes and no Triton."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from _helpers import in_threads, wait_for

from ray_triton_shm import OverloadedError, SlotTimeoutError
from ray_triton_shm._slots._header import RegionHeader
from ray_triton_shm._slots._shared_slots import SharedSlots
from ray_triton_shm._slots._shm import SharedMemoryRegion, new_region_name
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES


@dataclass
class Region:
    name: str
    header: RegionHeader
    slots: SharedSlots
    size: int


@pytest.fixture
def make_region() -> Iterator:  # type: ignore[type-arg]
    made: list[tuple[SharedMemoryRegion, SharedSlots]] = []

    def make(size: int, *, max_waiting: int = 8) -> Region:
        region = SharedMemoryRegion.create(new_region_name("test"), REGION_HEADER_BYTES + 4096)
        header = RegionHeader.new(region.buffer, size)
        header.configure(max_waiting=max_waiting)
        slots = SharedSlots(region.name, header, size, model="m")
        made.append((region, slots))
        return Region(region.name, header, slots, size)

    yield make
    for region, slots in made:
        slots.close(wait_s=5)
        region.unlink()
        region.close()


def _child(region: Region, body: str) -> subprocess.Popen[str]:
    """A process that attaches the region, runs ``body`` (with ``slots`` and ``header`` in
    scope), prints ``ready`` and then waits to be killed."""
    script = (
        textwrap.dedent(
            f"""
        import sys, time
        from ray_triton_shm._slots._header import RegionHeader
        from ray_triton_shm._slots._shared_slots import SharedSlots
        from ray_triton_shm._slots._shm import SharedMemoryRegion
        region = SharedMemoryRegion.attach({region.name!r})
        header = RegionHeader(region.buffer, {region.size})
        slots = SharedSlots({region.name!r}, header, {region.size})
        """
        )
        + textwrap.dedent(body)
        # The load itself: a holder that lives on until killed.
        + "\nprint('ready', flush=True)\ntime.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _kill(child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait()


def test_slots_held_by_another_process_block_until_given_back(make_region) -> None:  # type: ignore[no-untyped-def]
    region = make_region(2)
    child = _child(region, "held = [slots.acquire(), slots.acquire()]")
    try:
        assert region.slots.try_acquire() is None
        with pytest.raises(SlotTimeoutError, match="within 0.2 s"):
            region.slots.acquire(0.2)
        assert region.slots.node_stats().in_use == 2
        assert region.slots.stats().in_use == 0  # none of them is this process's
    finally:
        _kill(child)
    # The holder never sent a request on them: the kernel dropped its locks, and they are free.
    started = time.monotonic()
    taken = {region.slots.acquire(5.0), region.slots.acquire(5.0)}
    assert taken == {0, 1} and time.monotonic() - started < 0.5
    assert region.slots.node_stats().abandoned == 0
    for slot in taken:
        region.slots.release(slot)
    assert region.slots.node_stats().in_use == 0


def test_a_slot_whose_holder_died_mid_request_is_abandoned(make_region) -> None:  # type: ignore[no-untyped-def]
    region = make_region(2)
    # As the engine does right before it sends a request on the slot.
    child = _child(region, "s = slots.acquire(); header.set_busy_since(s, time.monotonic_ns())")
    _kill(child)
    # The other slot serves on; the dead holder's is skipped and counted as abandoned.
    first = region.slots.acquire(1.0)
    assert region.slots.try_acquire() is None
    assert region.slots.node_stats().abandoned == 1
    assert region.header.abandoned_slots() == [1 - first]
    region.slots.release(first)
    assert region.slots.acquire(1.0) == first
    region.slots.release(first)


def test_an_abandoned_slot_comes_back_to_a_waiter_once_settled(make_region) -> None:  # type: ignore[no-untyped-def]
    import threading

    region = make_region(1)
    child = _child(region, "s = slots.acquire(); header.set_busy_since(s, time.monotonic_ns())")
    _kill(child)
    # However long Triton takes, nobody gets it until the owner proves Triton done with it.
    with pytest.raises(SlotTimeoutError):
        region.slots.acquire(0.3)
    assert region.header.abandoned_slots() == [0]
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(region.slots.acquire(5.0)))
    waiter.start()
    wait_for(lambda: region.slots.stats().waiting == 1, timeout_s=5, what="the waiter waiting")
    assert got == []
    region.header.settle(0, time.monotonic_ns())  # what the owner's Settler does
    waiter.join(5.0)
    assert got == [0] and region.slots.node_stats().abandoned == 0
    assert region.header.totals().abandoned == 1 and region.header.settle_quantile_s(0.99) > 0
    region.slots.release(0)


def test_the_owners_sweep_finds_a_dead_holder_too(make_region) -> None:  # type: ignore[no-untyped-def]
    region = make_region(1)
    child = _child(region, "s = slots.acquire(); header.set_busy_since(s, time.monotonic_ns())")
    _kill(child)
    region.slots.sweep()
    assert region.slots.node_stats().abandoned == 1
    with pytest.raises(SlotTimeoutError):
        region.slots.acquire(0.2)


def test_more_waiters_than_seats_are_refused_and_counted(make_region) -> None:  # type: ignore[no-untyped-def]
    region = make_region(1, max_waiting=2)
    waiters = """
        import threading
        for _ in range(2):
            threading.Thread(target=slots.acquire, daemon=True).start()
    """
    holder = _child(region, "held = slots.acquire()")
    queued = _child(region, waiters)
    try:
        wait_for(lambda: region.slots.node_stats().waiting == 2, timeout_s=5, what="2 waiting")
        with pytest.raises(OverloadedError, match="2 callers already wait") as info:
            region.slots.acquire(5.0)
        assert info.value.model == "m" and region.header.overloads == 1
    finally:
        _kill(queued)
        _kill(holder)
    # The killed waiters' seats are free again: this caller may wait once more.
    slot = region.slots.acquire(5.0)
    region.slots.release(slot)
    region.slots.sweep()
    assert region.slots.node_stats().waiting == 0 and sum(region.header.queued()) == 0


def test_a_cancelled_async_waiter_loses_no_slot(make_region) -> None:  # type: ignore[no-untyped-def]
    region = make_region(1)
    held = region.slots.acquire()

    async def scenario() -> int:
        waiter = asyncio.create_task(region.slots.acquire_async())
        await asyncio.to_thread(
            wait_for, lambda: region.slots.stats().waiting == 1, timeout_s=5, what="it waiting"
        )
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        with pytest.raises(SlotTimeoutError):
            await region.slots.acquire_async(0.1)
        region.slots.release(held)
        return await region.slots.acquire_async(5.0)  # the cancelled waiter passed it on

    slot = asyncio.run(scenario())
    region.slots.release(slot)
    # The waits given up are still in the kernel's queue: each takes the slot in turn, from
    # its own thread, and hands it straight back.
    wait_for(
        lambda: not (region.slots.stats().waiting or region.slots.node_stats().in_use),
        timeout_s=5,
        what="the waits given up to take and hand back the slot",
    )
    stats = region.slots.stats()
    assert (stats.in_use, stats.waiting, region.slots.node_stats().in_use) == (0, 0, 0)


def test_waiting_callers_are_served_fairly(make_region) -> None:  # type: ignore[no-untyped-def]
    """Six processes looping on two slots: each gets its turn (none under half the mean)."""
    region = make_region(2)
    loop = """
        import os
        done = 0
        deadline = time.monotonic() + 2.0  # the load itself: 2 s of it
        while time.monotonic() < deadline:
            slot = slots.acquire()
            time.sleep(0.001)  # the load itself: a holder's use of its slot
            slots.release(slot)
            done += 1
        print(done, flush=True)
        os._exit(0)
    """
    script_head = textwrap.dedent(
        f"""
        import time
        from ray_triton_shm._slots._header import RegionHeader
        from ray_triton_shm._slots._shared_slots import SharedSlots
        from ray_triton_shm._slots._shm import SharedMemoryRegion
        region = SharedMemoryRegion.attach({region.name!r})
        slots = SharedSlots({region.name!r}, RegionHeader(region.buffer, 2), 2)
        """
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script_head + textwrap.dedent(loop)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    counts = [int(child.communicate(timeout=60)[0]) for child in children]
    mean = sum(counts) / len(counts)
    assert min(counts) >= mean / 2, counts
    assert region.header.totals().waits > 0  # they did contend


def test_a_killed_waiter_hides_no_free_slot(make_region) -> None:  # type: ignore[no-untyped-def]
    """Its seat still names the slot it queued on; the next caller finds it dead and takes the
    slot, with no sweep."""
    region = make_region(2)
    holder = _child(region, "held = [slots.acquire(), slots.acquire()]")
    waiter = _child(
        region,
        "import threading\nthreading.Thread(target=slots.acquire, daemon=True).start()\n",
    )
    wait_for(lambda: sum(region.header.queued()) == 1, timeout_s=5, what="its thread queued")
    _kill(waiter)
    _kill(holder)  # both slots free; one still looks queued for
    taken = {region.slots.acquire(1.0), region.slots.acquire(1.0)}
    assert taken == {0, 1} and sum(region.header.queued()) == 0
    for slot in taken:
        region.slots.release(slot)


def test_a_caller_that_gives_up_frees_its_seat_at_once(make_region) -> None:  # type: ignore[no-untyped-def]
    region = make_region(1, max_waiting=2)
    held = region.slots.acquire()
    for _ in range(3):  # more timed-out waits than seats: none is refused as overloaded
        with pytest.raises(SlotTimeoutError):
            region.slots.acquire(0.05)
    assert region.slots.node_stats().waiting == 0 and region.header.overloads == 0
    region.slots.release(held)
    # The given-up waits pass the slot on as it reaches them; then it is free.
    slot = region.slots.acquire(5.0)
    region.slots.release(slot)
    assert region.slots.stats().in_use == 0


def test_a_forked_child_never_takes_its_parents_slots(make_region) -> None:  # type: ignore[no-untyped-def]
    region = make_region(1)
    held = region.slots.acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its inherited descriptors are closed, the pool refuses it
        os.close(read)
        try:
            region.slots.try_acquire()
            answer = b"took it"
        except Exception as exc:
            answer = type(exc).__name__.encode()
        os.write(write, answer)
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 100) == b"ClientClosedError"
    os.close(read)
    # The parent still holds its slot: the child closing its copies dropped no lock.
    assert region.slots.node_stats().in_use == 1
    region.slots.release(held)


def test_threads_of_one_process_share_slots_with_no_slot_lost(make_region) -> None:  # type: ignore[no-untyped-def]
    region = make_region(2)

    def loop(_: int) -> None:
        for _ in range(300):
            slot = region.slots.acquire(10.0)
            region.slots.release(slot)

    in_threads(loop, range(8))
    assert region.slots.stats().in_use == 0 and region.slots.node_stats().in_use == 0


def test_seats_taken_and_left_during_a_scan_never_look_all_taken(make_region, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Waiters come and go while a caller looks for a seat: one leaves seat 0 right after the
    caller found it taken, another then sits in seat 1 before the caller looks there. Never
    were both seats taken at once, so the caller waits instead of being refused."""
    import threading

    from ray_triton_shm._slots import _shared_slots as shared
    from ray_triton_shm._slots._shm import SHM_DIR

    region = make_region(1, max_waiting=2)
    held = region.slots.acquire()
    other = SharedSlots(region.name, region.header, 1, model="m")  # another process's pool
    seated = os.open(SHM_DIR / region.name, os.O_RDWR)  # a waiter already in seat 0
    probe = os.open(SHM_DIR / region.name, os.O_RDWR)
    assert shared.lock_byte(seated, shared._SEAT0, wait=False)
    results: list[BaseException] = []

    def arrive() -> None:
        try:
            other.acquire(0.5)
        except BaseException as exc:
            results.append(exc)

    newcomer = threading.Thread(target=arrive)
    real_lock = shared.lock_byte

    def lock(fd: int, byte: int, *, wait: bool, shared_lock: bool = False) -> bool:
        taken = real_lock(fd, byte, wait=wait, shared=shared_lock)
        if byte == shared._SEAT0 and fd != seated and not taken and not newcomer.is_alive():
            os.close(seated)  # the waiter in seat 0 leaves; a newcomer looks from seat 1
            newcomer.start()
            wait_for(
                lambda: shared.locked_by_another(probe, shared._SEAT0 + 1),
                timeout_s=5,
                every_s=0.005,
                what="the newcomer in seat 1",
            )
        return taken

    monkeypatch.setattr(shared, "lock_byte", lock)
    region.slots._next, other._next = 1, 0  # this caller looks at seat 0 first, other at 1
    try:
        with pytest.raises(SlotTimeoutError):
            region.slots.acquire(0.5)
        newcomer.join(5)
        assert [type(exc) for exc in results] == [SlotTimeoutError]
        assert region.header.overloads == 0
    finally:
        region.slots.release(held)
        other.close(wait_s=5)
        os.close(probe)
