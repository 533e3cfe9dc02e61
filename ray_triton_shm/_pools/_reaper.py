"""A watchdog process that cleans up after this process when it dies without closing.

``close()`` and interpreter exit unregister and unlink every region; a process that is killed
(SIGKILL, the OOM killer, Ray killing a worker or tearing a node down) runs no cleanup, and its
regions stay registered in Triton, pinning memory there, and in ``/dev/shm``. So the first region
a process registers starts one reaper for the whole process: a small stdlib-only Python process
holding the read end of a pipe whose write end only we hold. We send it each Triton URL we
register regions with. When the pipe reaches EOF we are gone, however we ended; the reaper waits
for our pid to disappear, then unregisters and unlinks the regions our pid owns, and exits.

The reaper is started through a launcher that exits at once (a double fork) into a session of
its own, so that nothing that kills our children or our process group (Ray does both) takes it
down with us. Run as a script, it imports the library only once there is work to do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

__all__ = ["watch"]

#: How long the reaper waits for the owner to disappear after the pipe closes.
_OWNER_EXIT_WAIT_S = 60.0
#: How long it keeps trying registrations that requests the owner left running still use.
_IN_USE_WAIT_S = 600.0


@dataclass
class _Watch:
    fd: int | None  # our end of the pipe; None if the reaper could not be started
    urls: set[str] = field(default_factory=set)


_lock = threading.Lock()
_watch: _Watch | None = None


def _forget_in_child() -> None:
    """A forked child closes its copy of our pipe (else our reaper waits for it too) and
    starts a reaper of its own when it registers regions."""
    global _lock, _watch
    if _watch is not None and _watch.fd is not None:
        os.close(_watch.fd)
    _lock, _watch = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_in_child)


def watch(url: str | None) -> None:
    """Makes sure this process's reaper runs and will clean up at ``url`` too.

    Best effort: if the reaper cannot be started, this warns once and the process goes on
    without it (the next client, or ``ray-triton-shm reclaim``, then cleans up after a crash).

    Args:
        url: Triton's gRPC address where this process registers regions (``None``: only
            ``/dev/shm``).
    """
    global _watch
    with _lock:
        if _watch is None:
            _watch = _Watch(_start())
        if _watch.fd is not None and url is not None and url not in _watch.urls:
            os.write(_watch.fd, f"{url}\n".encode())
            _watch.urls.add(url)


def _start() -> int | None:
    read_end, write_end = os.pipe()  # both non-inheritable: no other child holds them
    try:
        subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--launch", str(os.getpid())],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(write_end)
        warnings.warn(
            f"ray_triton_shm: could not start the crash-cleanup process ({exc}); if this "
            "process is killed, its regions stay until the next client or "
            "`ray-triton-shm reclaim` takes them back",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    finally:
        os.close(read_end)
    return write_end


def _launch(owner: int) -> None:
    """Starts the reaper in a session of its own and returns (the launcher then exits)."""
    subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(owner)],
        stdin=sys.stdin,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
    )


def _reap(owner: int) -> None:
    """Waits for the owner to be gone, then reclaims what it owned."""
    urls = {line.strip() for line in sys.stdin.buffer.read().decode().splitlines()}
    urls.discard("")
    from ray_triton_shm._pools._reclaim import reclaim_regions
    from ray_triton_shm._slots._shm import pid_alive

    deadline = time.monotonic() + _OWNER_EXIT_WAIT_S
    while pid_alive(owner):
        if time.monotonic() > deadline:
            return  # it still runs: not ours to clean
        time.sleep(0.05)
    for url in sorted(urls) or [None]:
        reclaim_regions(url, owner=owner, in_use_wait_s=_IN_USE_WAIT_S)


if __name__ == "__main__":
    # Run as a script: import the package from where this file is, not its modules as top-level
    # ones (its "ray" subpackage would shadow Ray).
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if sys.argv[1] == "--launch":
        _launch(int(sys.argv[2]))
    else:
        _reap(int(sys.argv[1]))
