"""The embedded Triton's log: one file all its runs append to, each after a header line,
kept out of the server's temporary directory once a run crashed or failed to start."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ._crashes import reason_lines

__all__ = ["KEPT_LOG_DIR", "ServerLog", "log_tail"]

_LOG_TAIL_LINES = 40
#: Where the log of a server that crashed or failed to start is kept when it was written to
#: a temporary file (which goes with the server): the evidence outlives the server.
KEPT_LOG_DIR: Path = Path(tempfile.gettempdir()) / "ray-triton-shm-logs"


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the log at ``path`` (a note if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log unavailable: {exc})"
    return "\n".join(data.splitlines()[-lines:])


class ServerLog:
    """The log file of a server's runs.

    Args:
        path: The file; ``None`` for one in ``tmpdir``, moved to :data:`KEPT_LOG_DIR` by
            :meth:`keep`.
        tmpdir: The server's temporary directory.
    """

    def __init__(self, path: str | Path | None, *, tmpdir: str) -> None:
        self._tmpdir = tmpdir
        self._path = (
            Path(path).expanduser().absolute()
            if path is not None
            else Path(tmpdir) / "tritonserver.log"
        )
        self._offset = 0

    @property
    def path(self) -> Path:
        """Where the log is now."""
        return self._path

    @contextlib.contextmanager
    def begin_run(self, shown_command: str) -> Iterator[IO[bytes]]:
        """The file a new run writes to, open for appending after a header naming it."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._path, "ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {shown_command}\n".encode())
            log.flush()
            self._offset = log.tell()
            yield log

    def run_text(self) -> str:
        """What the current run wrote so far."""
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self) -> str:
        """The log's last lines."""
        return log_tail(self._path)

    def why(self, text: str) -> str:
        """What ``text`` (a run's log) says of why the server did not start
        (:func:`reason_lines`), else the log's last lines."""
        lines = reason_lines(text)
        if lines:
            return "its log says:\n" + "\n".join(f"  {line}" for line in lines)
        return f"last lines:\n{self.tail()}"

    def keep(self) -> None:
        """Moves a temporary log out of the server's temporary directory, which goes with
        the server, into :data:`KEPT_LOG_DIR`; later runs append to it there."""
        if not self._path.is_relative_to(self._tmpdir) or not self._path.exists():
            return
        KEPT_LOG_DIR.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        kept = KEPT_LOG_DIR / f"tritonserver-{stamp}-{os.getpid()}-{id(self):x}.log"
        try:
            os.replace(self._path, kept)
        except OSError:
            shutil.copyfile(self._path, kept)
        self._path = kept
