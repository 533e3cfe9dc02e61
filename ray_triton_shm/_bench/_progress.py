"""A dependency-free progress bar for stderr."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


def _format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}:{seconds:02d}"


class ProgressBar:
    """A one-line progress bar redrawn in place on a terminal.

    When the stream is not a terminal (logs, CI, pytest), it prints a plain line at every
    tenth of the way instead of redrawing.

    Args:
        total: Number of units of work.
        stream: Where to draw; ``sys.stderr`` by default.
        enabled: Draw at all (``False`` makes every method a no-op).
        width: Width of the bar in characters.
        min_interval_s: Minimum time between two redraws on a terminal.
    """

    def __init__(
        self,
        total: int,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        width: int = 28,
        min_interval_s: float = 0.1,
    ) -> None:
        self._total = max(1, int(total))
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._width = width
        self._min_interval_s = min_interval_s
        self._done = 0
        self._status = ""
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._last_line_len = 0
        self._last_decile = -1
        try:
            self._tty = bool(self._stream.isatty())
        except (AttributeError, ValueError):
            self._tty = False

    def set_total(self, total: int) -> None:
        """Change the amount of work (e.g. when a path is skipped)."""
        self._total = max(1, int(total), self._done)
        self._draw(force=False)

    def update(self, *, advance: int = 0, status: str | None = None) -> None:
        """Advance by ``advance`` units and/or change the status text."""
        self._done = min(self._total, self._done + advance)
        changed = status is not None and status != self._status
        if status is not None:
            self._status = status
        # Status changes are rare (one per time slice) and always drawn on a terminal.
        self._draw(force=changed and self._tty)

    def close(self) -> None:
        """Finish: clear the line on a terminal (the caller prints the results)."""
        if not self._enabled:
            return
        if self._tty and self._last_line_len:
            self._write("\r" + " " * self._last_line_len + "\r")
            self._last_line_len = 0
        self._enabled = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _line(self) -> str:
        fraction = self._done / self._total
        filled = int(round(fraction * self._width))
        elapsed = time.monotonic() - self._start
        eta = ""
        if 0 < self._done < self._total:
            eta = f" eta {_format_duration(elapsed / self._done * (self._total - self._done))}"
        bar = "#" * filled + "." * (self._width - filled)
        return (
            f"bench [{bar}] {fraction * 100:3.0f}% {_format_duration(elapsed)}{eta}  {self._status}"
        )

    def _draw(self, *, force: bool) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if self._tty:
            if (
                not force
                and now - self._last_draw < self._min_interval_s
                and (self._done < self._total)
            ):
                return
            line = self._line()[: max(20, shutil.get_terminal_size().columns - 1)]
            pad = max(0, self._last_line_len - len(line))
            self._write("\r" + line + " " * pad)
            self._last_line_len = len(line)
        else:
            decile = int(self._done * 10 / self._total)
            if decile == self._last_decile and not force:
                return
            self._last_decile = decile
            self._write(self._line().rstrip() + "\n")
        self._last_draw = now

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            self._enabled = False
