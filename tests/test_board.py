"""A region's batch boards with real processes and no Triton: a member or a leader killed at
each step of a batch, and the board's words as another writer may have left them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ray_triton_shm._slots._board import BatchBoard, BatchState
from ray_triton_shm._slots._header import RegionHeader
from ray_triton_shm._slots._shm import SharedMemoryRegion, new_region_name
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES

KEY = 1234
SLOTS = 4


@dataclass
class Region:
    name: str
    header: RegionHeader
    board: BatchBoard


@pytest.fixture
def region() -> Iterator[Region]:
    made = SharedMemoryRegion.create(new_region_name("test"), REGION_HEADER_BYTES + 4096)
    header = RegionHeader.new(made.buffer, SLOTS)
    board = BatchBoard(header, made.name, model="m")
    yield Region(made.name, header, board)
    board.close()
    made.unlink()
    made.close()


def _child(region: Region, body: str) -> subprocess.Popen[str]:
    """A process with the region's board (``board`` in scope) that runs ``body``, prints
    ``ready`` and then waits to be killed."""
    script = (
        textwrap.dedent(
            f"""
        import time
        from ray_triton_shm._slots._board import BatchBoard
        from ray_triton_shm._slots._header import RegionHeader
        from ray_triton_shm._slots._shm import SharedMemoryRegion
        region = SharedMemoryRegion.attach({region.name!r})
        board = BatchBoard(RegionHeader(region.buffer, {SLOTS}), {region.name!r})
        """
        )
        + textwrap.dedent(body)
        # The load itself: a process that lives on, holding its locks, until killed.
        + "\nprint('ready', flush=True)\ntime.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _kill(child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait()


def test_a_member_killed_after_reserving_rows_does_not_stop_the_batch(region: Region) -> None:
    """Its writer lock goes with it: the leader waits for no one, and finds its rows
    unwritten (they go out as they are, and their answer is dropped)."""
    board = region.board
    leader = board.open(1, KEY, 2, 16)
    member = _child(region, f"seat = board.join({KEY}, 3, {SLOTS}); assert seat.start == 2")
    _kill(member)
    written = board.join(KEY, 2, SLOTS)
    assert written is not None
    board.written(written, True)
    assert board.seal(leader) == 2
    for index in range(2):
        assert board.writer_wait(leader, index).wait()  # no wait: the dead let go
    assert board.members(leader) == [(2, 3, False), (5, 2, True)]
    assert written.start == 5 and board.rows(leader) == 7
    board.sent(leader)
    board.answered(leader, [(4,)])
    assert board.outcome(written) == BatchState.ANSWERED
    board.leave(written)
    assert board.readers_wait(leader).wait()  # the dead member reads nothing: no wait
    board.done(leader)


def test_a_leader_killed_lets_its_members_go_and_send_again(region: Region) -> None:
    """Killed before its answer, the leader lets go of the answer lock: its members wake at
    once and find the batch lost, not answered; nobody joins its batch any more."""
    board = region.board
    leader = _child(region, f"seat = board.open(2, {KEY}, 1, 16)")
    member = board.join(KEY, 1, SLOTS)
    assert member is not None and member.slot == 2 and member.start == 1
    board.written(member, True)
    _kill(leader)
    assert board.answer_wait(member.slot, None).wait()
    assert board.outcome(member) == BatchState.LOST
    board.leave(member)
    assert board.join(KEY, 1, SLOTS) is None  # open still, on its words, but leaderless


def test_a_batch_is_joined_only_by_calls_of_its_key_with_room(region: Region) -> None:
    board = region.board
    leader = board.open(0, KEY, 14, 16)
    assert board.join(KEY + 1, 1, SLOTS) is None  # another shape or options
    assert board.join(KEY, 3, SLOTS) is None  # no room for 3 rows
    seat = board.join(KEY, 2, SLOTS)
    assert seat is not None and (seat.start, seat.rows) == (14, 2)
    assert board.full(leader)
    board.written(seat, True)
    board.seal(leader)
    assert board.join(KEY, 1, SLOTS) is None  # sealed
    board.lost(leader)
    board.leave(seat)
    board.done(leader)


def test_a_batch_in_triton_is_never_joined(region: Region) -> None:
    board = region.board
    leader = board.open(3, KEY, 1, 16)
    board.seal(leader)
    board.sent(leader)
    assert board.forming(SLOTS) == []
    assert board.join(KEY, 1, SLOTS) is None
    board.answered(leader, [(4,)])
    assert board.outcome(leader) == BatchState.ANSWERED
    board.done(leader)


def test_a_member_that_gives_up_waiting_lets_the_leader_finish(region: Region) -> None:
    """A member's wait with a timeout (on a thread) given up: its descriptor closes when the
    wait ends, so the leader's wait for readers never hangs on it."""
    board = region.board
    leader = board.open(1, KEY, 1, 16)
    member = board.join(KEY, 1, SLOTS)
    assert member is not None
    board.written(member, True)
    assert not board.answer_wait(member.slot, 0.01).wait()  # timed out: still in Triton
    board.leave(member)
    board.seal(leader)
    board.sent(leader)
    board.answered(leader, [(4,)])
    assert board.readers_wait(leader).wait()
    board.done(leader)
