"""Where the runner reports its progress (:class:`Progress`); the terminal's is
:func:`.report._console.make_progress`."""

from __future__ import annotations

import sys

__all__ = ["Progress"]


class Progress:
    """Where the runner reports progress, here nowhere: ``start(total)`` units of work, a new
    ``stage(text)``, ``advance(units)`` done, and ``stop()`` when the run is over; and where
    it says what happened to Triton as it happens (``say(text)``, on stderr here)."""

    def start(self, total: int) -> None: ...
    def stage(self, text: str) -> None: ...
    def advance(self, units: int = 1) -> None: ...
    def stop(self) -> None: ...

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)
