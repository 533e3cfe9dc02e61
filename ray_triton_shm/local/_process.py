"""The embedded Triton's process group: spawning ``tritonserver`` in a session of its own,
ending it with its Python-backend stubs, and a guard that ends it when its owner dies.

``tritonserver`` runs as the leader of its own process group; its Python-backend stubs
(``triton_python_backend_stub``) are its children, in the same group, and its Python-backend
regions are the files of ``/dev/shm`` named with the server's prefix
(``--backend-config=python,shm-region-prefix-name=...``). :func:`terminate` ends all three.

An owner that dies without running its cleanup (SIGKILL, or SIGTERM, which a Python
process does not survive to run ``atexit``) would leave Triton re-parented to init, holding
its ports and its regions. :class:`OwnerGuard` is a small process of its own that holds the
read end of a pipe whose write end only the owner has: the kernel closes it when the owner
dies, of whatever cause, and the guard then kills every process group serving the prefix
and removes its regions and its temporary directory. ``PR_SET_PDEATHSIG`` would not do:
it fires when the *thread* that forked ends (the supervisor restarts Triton from a thread
that ends right after), and it reaches neither the stubs nor ``/dev/shm``.

Stdlib only, with no import of the package: the guard runs this file as a script
(``python -I _process.py PREFIX TMPDIR``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

__all__ = [
    "SHM_DIR",
    "OwnerGuard",
    "ServerProcess",
    "cleanup",
    "group_alive",
    "kill_group",
    "proc_stats",
    "remove_shm_files",
    "terminate",
]

#: Where POSIX shared memory lives.
SHM_DIR = Path("/dev/shm")
#: How long the guard keeps looking for processes of its prefix after the owner died: a
#: server forked at that moment closes the pipe just before it execs ``tritonserver``.
_GUARD_SETTLE_S = 0.5
#: How long the guard waits for the groups it killed to be gone before removing the regions.
_GUARD_DEADLINE_S = 4.0
_STUB = "triton_python_backend_stub"


def kill_group(pgid: int, sig: int) -> None:
    """Sends ``sig`` to the process group ``pgid``; a group already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """Every process here: its pid and its ``/proc/<pid>/stat`` fields after the name (the
    state first, then the parent, then the process group)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            yield int(entry.name), fields


def group_alive(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` is still running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(int(f[2]) == pgid and f[0] not in ("Z", "X") for _, f in proc_stats())


def remove_shm_files(shm_prefix: str) -> None:
    """Removes the files of ``/dev/shm`` whose name starts with ``shm_prefix``."""
    with contextlib.suppress(OSError):
        for leftover in SHM_DIR.glob(shm_prefix + "*"):
            with contextlib.suppress(OSError):
                leftover.unlink()


#: The start of a run's part of the server log (see ``local._log.ServerLog.begin_run``).
RUN_HEADER = b"\n==== "
#: What Triton logs as it loads a model, and as it unloads one (each version; Triton answers a
#: model's requests in execution before it unloads it).
_LOADED = re.compile(rb"\"successfully loaded '([^']*)'")
_UNLOADED = re.compile(rb"\"successfully unloaded '([^']*)'")
#: How long the group lives on once every model is unloaded: Triton's endpoints write out the
#: last answers they were handed.
_FLUSH_S = 0.1


def terminate(
    proc: subprocess.Popen[bytes],
    grace_s: float,
    shm_prefix: str | None = None,
    *,
    graceful: bool = True,
    log_path: Path | None = None,
) -> None:
    """Stop a server process and its process group (SIGINT, then SIGTERM, then SIGKILL; only
    SIGKILL if not ``graceful``), then remove the regions of ``shm_prefix``.

    With ``log_path`` (the server's log), a graceful stop ends the group as soon as Triton
    logs that it unloaded every model it loaded in this run (it answers the requests in
    execution first), without waiting for its shutdown to notice: that looks once a second,
    and exiting takes most of another.

    Module-level so that ``weakref.finalize`` does not capture the server object.
    """
    pgid = proc.pid  # started with start_new_session=True: pid == pgid
    if proc.poll() is None and graceful:
        offset = _size(log_path)
        for sig, wait_s in (
            (signal.SIGINT, grace_s),
            (signal.SIGTERM, 5.0),
            (signal.SIGKILL, 10.0),
        ):
            kill_group(pgid, sig)
            if sig == signal.SIGINT and log_path is not None:
                if _wait_drained(proc, log_path, offset, wait_s):
                    break
                continue
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
    # Python-backend stubs live in the same group; make sure none is left behind.
    kill_group(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    # A killed stub takes a moment to exit (its mappings torn down): the group is gone, or as
    # good as gone (reaped by init), before stop() returns.
    deadline = time.monotonic() + 5.0
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)
    if shm_prefix:
        remove_shm_files(shm_prefix)


def _size(path: Path | None) -> int:
    """The size of ``path`` now (0 if none, or unreadable)."""
    try:
        return 0 if path is None else path.stat().st_size
    except OSError:
        return 0


def _wait_drained(
    proc: subprocess.Popen[bytes], log_path: Path, offset: int, wait_s: float
) -> bool:
    """Waits up to ``wait_s`` for ``proc`` to end, or to log past ``offset`` (its SIGINT)
    that it unloaded every model of its run (see :func:`terminate`); whether either
    happened."""
    try:
        head = log_path.read_bytes()[:offset]
    except OSError:
        head = b""
    loaded = Counter(_LOADED.findall(head[head.rfind(RUN_HEADER) + 1 :]))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            proc.wait(timeout=0.02)
            return True
        except subprocess.TimeoutExpired:
            pass
        if loaded and _unloaded(log_path, offset) >= loaded:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_FLUSH_S)
            return True
    return False


def _unloaded(log_path: Path, offset: int) -> Counter[bytes]:
    """The models (each version) the log says were unloaded past ``offset``."""
    try:
        with log_path.open("rb") as log:
            log.seek(offset)
            return Counter(_UNLOADED.findall(log.read()))
    except OSError:
        return Counter()


class OwnerGuard:
    """A process that ends the servers of ``shm_prefix`` when their owner (this process)
    dies, and removes their regions and ``tmpdir``.

    Started by :meth:`ensure` (again if it died), before each server is spawned, so that no
    server ever runs unguarded; told by :meth:`close` that the owner cleaned up itself.
    Thread-safe.

    Args:
        shm_prefix: The servers' region prefix: it names them on their command lines (the
            server's ``--backend-config=python,shm-region-prefix-name=``, each stub's region
            argument) and names their files in ``/dev/shm``.
        tmpdir: A directory of the owner's, removed with them.
    """

    def __init__(self, *, shm_prefix: str, tmpdir: str) -> None:
        self._shm_prefix = shm_prefix
        self._tmpdir = tmpdir
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: IO[bytes] | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The guard's process id, ``None`` while none runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def ensure(self) -> None:
        """Starts the guard unless it runs (a no-op once closed)."""
        with self._lock:
            if self._closed or (self._proc is not None and self._proc.poll() is None):
                return
            self._drop()
            read_fd, write_fd = os.pipe()  # both close-on-exec: no other child inherits them
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", __file__, self._shm_prefix, self._tmpdir],
                    stdin=read_fd,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd="/",
                    start_new_session=True,  # neither a terminal's Ctrl-C nor killpg of ours
                    close_fds=True,
                )
            except BaseException:
                os.close(write_fd)
                raise
            finally:
                os.close(read_fd)
            self._pipe = os.fdopen(write_fd, "wb", buffering=0)
            _GUARDS.add(self)

    def close(self) -> None:
        """Tells the guard that the owner cleaned up itself, and lets it end. Idempotent."""
        with self._lock:
            self._closed = True
            if self._pipe is not None:
                with contextlib.suppress(OSError):
                    self._pipe.write(b"bye\n")
            self._drop()

    def _forget(self) -> None:
        """In a forked child: the owner is the parent, whose guard this child must not hold
        open (nor dismiss); its lock may have been held by a thread the fork left behind."""
        self._lock = threading.Lock()
        self._closed = True
        self._proc = None
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()

    def _drop(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)


#: The guards of this process, which a forked child lets go of.
_GUARDS: weakref.WeakSet[OwnerGuard] = weakref.WeakSet()


def _forget_guards_after_fork() -> None:
    for guard in list(_GUARDS):
        guard._forget()


os.register_at_fork(after_in_child=_forget_guards_after_fork)


def _serves(argv: list[bytes], flag: bytes, prefix: bytes) -> bool:
    """Whether a command line is a server of ``prefix`` (or its launcher), or a stub of one."""
    if flag in argv:
        return True
    return (
        bool(argv)
        and argv[0].endswith(_STUB.encode())
        and any(a.startswith(prefix) for a in argv[1:])
    )


def _groups_of(shm_prefix: str) -> set[int]:
    """The process groups of every process serving ``shm_prefix``, but the caller's."""
    prefix = shm_prefix.encode()
    flag = b"--backend-config=python,shm-region-prefix-name=" + prefix
    own = {os.getpid(), os.getpgrp()}
    groups = set()
    for pid, fields in proc_stats():
        if pid in own or fields[0] in ("Z", "X"):
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if _serves(argv, flag, prefix) and int(fields[2]) not in own:
            groups.add(int(fields[2]))
    return groups


def _end_servers_of(shm_prefix: str, tmpdir: str | None = None) -> None:
    """Kills every process group serving ``shm_prefix`` and removes its regions (and
    ``tmpdir``): what the guard does once the owner died."""
    start = time.monotonic()
    last_seen = start
    while time.monotonic() - start < _GUARD_DEADLINE_S:
        groups = _groups_of(shm_prefix)
        if groups:
            last_seen = time.monotonic()
            for pgid in groups:
                kill_group(pgid, signal.SIGKILL)
        elif time.monotonic() - last_seen > _GUARD_SETTLE_S:
            break
        time.sleep(0.02)
    remove_shm_files(shm_prefix)
    if tmpdir:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _guard_main(argv: Sequence[str]) -> int:
    """The guard: waits for the end of its stdin; ends the servers unless told ``bye``."""
    shm_prefix, tmpdir = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    received = b""
    while True:
        chunk = os.read(0, 64)
        if not chunk:
            break
        received += chunk
        if b"bye\n" in received:
            return 0
    _end_servers_of(shm_prefix, tmpdir)
    return 0


class ServerProcess:
    """The server's current process, shared with its finalizer and its watcher threads (so
    that neither holds the server): ``stopping`` once a stop was asked for, which the
    supervisor must not take for a crash; ``wake`` ends a supervisor's wait early.

    Args:
        shm_prefix: The prefix of the server's Python-backend regions.
        tmpdir: The server's temporary directory (its working directory).
    """

    def __init__(self, *, shm_prefix: str, tmpdir: str) -> None:
        self.shm_prefix = shm_prefix
        self.tmpdir = tmpdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.wake = threading.Event()
        self.lock = threading.RLock()
        self.guard = OwnerGuard(shm_prefix=shm_prefix, tmpdir=tmpdir)

    def spawn(
        self, command: Sequence[str], *, log: IO[bytes], env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        """Starts ``command`` as the leader of a new process group, guarded, writing to
        ``log``; it becomes the current process."""
        self.guard.ensure()
        proc = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=self.tmpdir,
            start_new_session=True,
            close_fds=True,
        )
        self.proc = proc
        return proc

    def stop(self) -> subprocess.Popen[bytes] | None:
        """Marks a stop as asked for; returns the process to end (now no longer current)."""
        with self.lock:
            self.stopping = True
            self.wake.set()
            proc, self.proc = self.proc, None
        return proc


class _Log(Protocol):
    """A server's log, wherever it is now (``local._log.ServerLog``)."""

    @property
    def path(self) -> Path: ...


def cleanup(process: ServerProcess, grace_s: float, log: _Log | None = None) -> None:
    """Stops the server of ``process`` (``log``: its log, see :func:`terminate`), removes its
    temporary directory, and dismisses its guard: a finalizer's body (it holds no server)."""
    proc = process.stop()
    if proc is not None:
        log_path = None if log is None else log.path
        terminate(proc, grace_s, process.shm_prefix, log_path=log_path)
    shutil.rmtree(process.tmpdir, ignore_errors=True)
    process.guard.close()


if __name__ == "__main__":
    sys.exit(_guard_main(sys.argv[1:]))
