"""What the embedded Triton's supervisor knows of a crash, and when it tries again.

A ``tritonserver`` that exits without being asked to has crashed: :class:`ServerCrash` records
when, how (its exit code or signal), why (:func:`crash_reason`, read from the end of its log)
and the log's last lines. :class:`RestartPolicy` decides, with injected time, how long to wait
before starting it again, and when to give up (too many crashes within a window). Pure: no
process, no thread, no file is touched here.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

__all__ = ["RestartPolicy", "ServerCrash", "ServerEvent", "crash_reason", "reason_lines"]

#: What a C++ abort prints: ``terminate called after throwing an instance of 'T'``.
_TERMINATE_RE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_WHAT_RE = re.compile(r"^\s*what\(\):\s*(.+)$")
#: Triton's own handler of fatal signals: ``Signal (11) received.``
_SIGNAL_RE = re.compile(r"Signal \((\d+)\) received")
#: A line Triton logged as an error: ``E1127 05:26:09.123456 4016 file.cc:12] text``.
_ERROR_RE = re.compile(r"^E\d{4} [\d:.]+\s+\d+\s+\S+\]\s*(.+)$")


#: The start of any line Triton logs: ``I1127 05:26:09.123456 4016 file.cc:12] ``.
_LOG_LINE_RE = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+\s+\S+\]")
#: Error lines every start on a machine without a GPU logs: no reason for anything.
_HARMLESS = ("CudaDriverHelper has not been initialized",)
#: The most lines :func:`reason_lines` gives.
REASON_LINES = 24


def reason_lines(log: str, *, limit: int = REASON_LINES) -> list[str]:
    """The lines of a ``tritonserver`` log that say why it failed, in their order, each once:
    its error lines (a quoted message unquoted: a model's Python traceback comes with it), an
    uncaught C++ exception (``terminate called ...``) and what it said, a Python traceback,
    and its last words (``error: creating server: ...``). Not its tables of options and
    models, which end every log.

    Args:
        log: What the server wrote to its log.
        limit: The most lines returned (the first ones: the cause comes before its echoes).
    """
    found: list[str] = []
    in_traceback = False
    for line in log.splitlines():
        error = _ERROR_RE.match(line)
        if error:
            in_traceback = False
            message = error.group(1).strip()
            if message.startswith('"') and message.endswith('"'):
                try:
                    message = json.loads(message)
                except ValueError:
                    pass
            if not any(noise in message for noise in _HARMLESS):
                found += message.splitlines()
        elif _LOG_LINE_RE.match(line):
            in_traceback = False
        elif line.startswith("Traceback (most recent call last)") or in_traceback:
            in_traceback = True
            found.append(line)
        elif _TERMINATE_RE.search(line) or _WHAT_RE.match(line) or line.startswith("error:"):
            found.append(line)
    kept = [line for line in dict.fromkeys(found) if line.strip()]
    return kept[:limit]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def crash_reason(returncode: int, log: str) -> str:
    """One line saying why a ``tritonserver`` ended: its signal or exit code, and what its
    log says last about it (an uncaught C++ exception, a fatal signal, an error line).

    Args:
        returncode: The process's exit status (negative: killed by that signal).
        log: What the process wrote to its log (its end is enough).
    """
    how = _signal_name(-returncode) if returncode < 0 else f"exit code {returncode}"
    lines = log.splitlines()
    # An uncaught exception says more than the SIGABRT it ends in, printed after it.
    for index in range(len(lines) - 1, -1, -1):
        thrown = _TERMINATE_RE.search(lines[index])
        if thrown:
            what = next(
                (m.group(1) for line in lines[index + 1 :] if (m := _WHAT_RE.match(line))), None
            )
            detail = f"terminate called after throwing '{thrown.group(1)}'"
            return f"{how}: {detail}" + (f" ({what.strip()})" if what else "")
    fatal = [m.group(1) for line in lines if (m := _SIGNAL_RE.search(line))]
    if fatal:
        return f"{how}: Triton received {_signal_name(int(fatal[-1]))}"
    errors = [m.group(1).strip() for line in lines if (m := _ERROR_RE.match(line))]
    return f"{how}: {errors[-1]}" if errors else how


@dataclasses.dataclass(frozen=True)
class ServerCrash:
    """One unexpected exit of the embedded ``tritonserver``.

    Attributes:
        number: 1 for the server's first crash, and so on.
        at: When it was seen (``time.time()``).
        pid: The process that crashed.
        returncode: Its exit status (negative: the signal that ended it).
        reason: One line: the signal or exit code, and what the log says (:func:`crash_reason`).
        log_tail: The last lines of its log.
        log_path: The log, kept after the server is closed.
        restarted_at: When a new server was ready again (``time.time()``), ``None`` until
            then, or for good when it was not restarted.
    """

    number: int
    at: float
    pid: int
    returncode: int
    reason: str
    log_tail: str
    log_path: Path
    restarted_at: float | None = None

    @property
    def down_s(self) -> float | None:
        """How long Triton was gone: from the crash until it was ready again."""
        return None if self.restarted_at is None else self.restarted_at - self.at

    def describe(self) -> str:
        """E.g. ``"crash 1 at 05:26:09 (pid 4016): SIGABRT: terminate called ..."``."""
        clock = time.strftime("%H:%M:%S", time.localtime(self.at))
        return f"crash {self.number} at {clock} (pid {self.pid}): {self.reason}"

    def to_dict(self) -> dict[str, object]:
        """The crash as JSON values."""
        return {
            **dataclasses.asdict(self),
            "log_path": str(self.log_path),
            "down_s": self.down_s,
        }


@dataclasses.dataclass(frozen=True)
class ServerEvent:
    """What the supervisor tells ``on_event``: Triton ``"crashed"`` (and will be started
    again), was ``"restarted"`` (ready again, as ``pid``), or the supervisor ``"gave_up"``
    (``error`` says why, naming the log; also when restarts are turned off)."""

    kind: Literal["crashed", "restarted", "gave_up"]
    crash: ServerCrash
    pid: int | None = None
    error: str | None = None


@dataclasses.dataclass
class RestartPolicy:
    """When to start a crashed server again: at once for a first crash, then after a delay
    that doubles with each crash of the last ``window_s`` (up to ``max_delay_s``), and never
    once ``max_crashes`` crashed within ``window_s``.

    Args:
        max_crashes: The crashes within ``window_s`` that make the supervisor give up.
        window_s: The window they are counted in.
        first_delay_s: The wait before the restart after a first crash.
        max_delay_s: The longest wait between a crash and the restart.
        clock: Seconds, monotonic (injected by tests).
    """

    max_crashes: int = 5
    window_s: float = 60.0
    first_delay_s: float = 0.25
    max_delay_s: float = 8.0
    clock: Callable[[], float] = time.monotonic
    _crashes: list[float] = dataclasses.field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_crashes < 1:
            raise ValueError(f"max_crashes must be >= 1, got {self.max_crashes}")
        if self.window_s <= 0:
            raise ValueError(f"crash_window_s must be > 0, got {self.window_s}")

    def crashed(self) -> float | None:
        """Records a crash now; returns the seconds to wait before the restart, or ``None``
        to give up."""
        now = self.clock()
        self._crashes = [t for t in self._crashes if now - t < self.window_s] + [now]
        recent = len(self._crashes)
        if recent >= self.max_crashes:
            return None
        return min(self.first_delay_s * 2 ** (recent - 1), self.max_delay_s)

    @property
    def recent(self) -> int:
        """The crashes within the window, now."""
        now = self.clock()
        return sum(now - t < self.window_s for t in self._crashes)
