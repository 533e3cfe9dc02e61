"""Byte locks on a region's file, shared by every process on the machine, and the threads
that wait on them.

An open-file-description lock (``F_OFD_SETLK``) on one byte of a region's file belongs to one
open file description, so two callers of one process each need a descriptor of their own, and
the kernel drops a lock when its process dies, however it dies. The slots of a region (see
:mod:`._shared_slots`) and its batches (see :mod:`._board`) are held this way.

A wait in the kernel cannot be interrupted: one with a timeout, or from a coroutine, runs on
a daemon thread of :func:`in_wait_thread` (a process may exit while one waits: the kernel drops
its locks).
"""

from __future__ import annotations

import concurrent.futures
import errno
import fcntl
import os
import queue
import struct
import threading
from collections.abc import Callable
from functools import cache
from typing import TypeVar

__all__ = ["in_wait_thread", "lock_byte", "locked_by_another", "unlock_byte"]

T = TypeVar("T")


@cache
def _flock(kind: int, start: int) -> bytes:
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks), padded.
    return struct.pack("@hhqqi4x", kind, os.SEEK_SET, start, 1, 0)


def lock_byte(fd: int, byte: int, *, wait: bool, shared: bool = False) -> bool:
    """Locks one byte for this descriptor (``shared``: a read lock, which others may hold
    too); ``False`` if another holds it (``wait=False``)."""
    try:
        command = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
        fcntl.fcntl(fd, command, _flock(fcntl.F_RDLCK if shared else fcntl.F_WRLCK, byte))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def unlock_byte(fd: int, byte: int) -> None:
    """Unlocks one byte this descriptor holds (nothing if it holds none)."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_UNLCK, byte))


def locked_by_another(fd: int, byte: int) -> bool:
    """Whether another open file description holds any lock on the byte."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK, byte))
    return struct.unpack("@hhqqi4x", answer)[0] != fcntl.F_UNLCK


class _WaitThreads:
    """Daemon threads for waits in the kernel, started as needed and reused."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], concurrent.futures.Future]]
        self._jobs = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        self._jobs.put((fn, future))
        if start:
            name = "ray-triton-shm-lock-wait"
            threading.Thread(target=self._work, name=name, daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1


_threads = _WaitThreads()


def in_wait_thread(fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Runs ``fn`` (a wait in the kernel) on a daemon thread; its future."""
    return _threads.submit(fn)


def _after_fork_in_child() -> None:
    global _threads
    _threads = _WaitThreads()


os.register_at_fork(after_in_child=_after_fork_in_child)
