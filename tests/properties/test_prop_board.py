"""Random words over a slot's batch board (anyone of the same user can write into
``/dev/shm``): joining, a batch's outcome, its row shapes, its error and its members read in
range, or as a lost batch; nothing raises, nothing reads past the board."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from _counts import examples, tried
from hypothesis import example, given
from hypothesis import strategies as st

from ray_triton_shm._slots._board import MAX_MEMBERS, MAX_ROW_DIMS, BatchBoard, BatchState
from ray_triton_shm._slots._header import BOARD_WORDS, RegionHeader
from ray_triton_shm._slots._shm import SharedMemoryRegion, new_region_name
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES

KEY = 99
SLOTS = 2

#: Words near the ranges the board reads, at any place of it.
_SMALL = st.lists(st.tuples(st.integers(0, BOARD_WORDS - 1), st.integers(-3, 80)), max_size=40)


@pytest.fixture(scope="module")
def board() -> Iterator[tuple[RegionHeader, BatchBoard]]:
    made = SharedMemoryRegion.create(new_region_name("test"), REGION_HEADER_BYTES + 4096)
    header = RegionHeader.new(made.buffer, SLOTS)
    board = BatchBoard(header, made.name, model="m")
    yield header, board
    board.close()
    made.unlink()
    made.close()


@given(
    raw=st.binary(min_size=BOARD_WORDS * 8, max_size=BOARD_WORDS * 8),
    small=_SMALL,
    rows=st.integers(1, 8),
)
@example(  # open, of our key, with room: but nobody leads it
    raw=bytes(BOARD_WORDS * 8), small=[(0, 1), (2, KEY), (4, 8)], rows=1
)
@examples(300, soak=6_000)
def test_any_board_words_read_in_range_or_as_a_lost_batch(
    board: tuple[RegionHeader, BatchBoard], raw: bytes, small: list[tuple[int, int]], rows: int
) -> None:
    tried("boards: words")
    header, batches = board
    words = np.frombuffer(header.board(1), np.int64)
    words[:] = np.frombuffer(raw, np.int64)
    for index, value in small:
        words[index] = value
    assert batches.join(KEY, rows, SLOTS) is None  # nobody leads it: never joined
    seat = batches.open(0, KEY, 1, 8)
    try:
        seat.slot = 1  # read slot 1's words as a member of its batch would
        assert batches.outcome(seat) in (BatchState.LOST, BatchState.ANSWERED, BatchState.FAILED)
        shapes = batches.row_shapes(seat, 16)
        if shapes is not None:
            assert all(
                s is None or (len(s) <= MAX_ROW_DIMS and min(s, default=0) >= 0) for s in shapes
            )
        status, message = batches.error(seat)
        assert isinstance(status, str) and isinstance(message, str)
        assert len(batches.members(seat)) <= MAX_MEMBERS
        assert all(isinstance(slot, int) for slot, _, _ in batches.forming(SLOTS))
    finally:
        seat.slot = 0
        batches.lost(seat)
        batches.done(seat)
