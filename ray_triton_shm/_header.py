"""The header at the start of every region: what every process using the region can see.

A region is shared by its owner and, in the Ray layer, by every process on the node that
leased slots of it. The header lets them share two things without a single message:

* ``waiting``: how many callers wait for a slot of the region (written by the owner's pool), so
  that a process holding leased slots gives them back as soon as somebody needs one;
* per-slot counters (requests, samples, bytes in and out, errors), each written only by the
  process using that slot at the time, so no two processes ever write the same word. The owner
  sums them for its statistics and metrics.

Layout, native ``int64`` words: ``[0]`` waiting, ``[1:8]`` reserved, then 5 words per slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._specs import REGION_HEADER_BYTES

__all__ = ["MAX_SLOTS", "RegionHeader", "SlotCounters"]

_FIRST_SLOT_WORD = 8
_WORDS_PER_SLOT = 5
#: Most slots a region can have: as many as the header has counters for.
MAX_SLOTS = (REGION_HEADER_BYTES // 8 - _FIRST_SLOT_WORD) // _WORDS_PER_SLOT


@dataclass(frozen=True)
class SlotCounters:
    """Totals over a region's slots.

    Attributes:
        requests: Requests Triton answered (one per chunk).
        samples: Samples in them.
        bytes_in: Input bytes written.
        bytes_out: Output bytes read.
        errors: Requests that failed.
    """

    requests: int = 0
    samples: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: int = 0


class RegionHeader:
    """Typed access to a region's header.

    Args:
        buffer: The region's mapping.
        slot_count: Slots in the region (at most :data:`MAX_SLOTS`).
    """

    __slots__ = ("_counters", "_words")

    def __init__(self, buffer: Any, slot_count: int) -> None:
        self._words = np.frombuffer(buffer, np.int64, REGION_HEADER_BYTES // 8, 0)
        end = _FIRST_SLOT_WORD + slot_count * _WORDS_PER_SLOT
        self._counters = self._words[_FIRST_SLOT_WORD:end].reshape(slot_count, _WORDS_PER_SLOT)

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot of the region."""
        return int(self._words[0])

    def set_waiting(self, count: int) -> None:
        """Publishes how many callers wait (the owner's pool calls this)."""
        self._words[0] = count

    def count(self, slot: int, samples: int, bytes_in: int, bytes_out: int) -> None:
        """Counts one answered request on ``slot`` (only its current user calls this)."""
        words = self._counters[slot]
        words[0] += 1
        words[1] += samples
        words[2] += bytes_in
        words[3] += bytes_out

    def count_error(self, slot: int) -> None:
        """Counts one failed request on ``slot``."""
        self._counters[slot, 4] += 1

    def totals(self) -> SlotCounters:
        """The counters summed over every slot."""
        return SlotCounters(*(int(v) for v in self._counters.sum(axis=0)))
