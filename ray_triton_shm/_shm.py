"""POSIX shared-memory regions: naming, creating, attaching, unlinking, and finding our own.

Region names look like ``rtshm_<pid>_<token>_<label>``: a fixed prefix, the owning process id
(so a leftover region can be traced to a dead owner and reclaimed), a random token (so one
process can own several regions for the same model), and a readable label.

The owner creates the region with owner-only permissions and also hands it to
:mod:`multiprocessing.resource_tracker`, so the name is unlinked even if the owner is killed.
Other processes :meth:`SharedMemoryRegion.attach` without the tracker: on Python < 3.13 the
tracker of an attaching process would unlink a region it does not own when that process exits.
"""

from __future__ import annotations

import _posixshmem  # CPython's shm_open/shm_unlink, as used by multiprocessing.shared_memory
import mmap
import os
import re
import secrets
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path

__all__ = [
    "REGION_PREFIX",
    "LocalRegion",
    "SharedMemoryRegion",
    "list_local_regions",
    "new_region_name",
    "owner_pid",
    "pid_alive",
]

REGION_PREFIX = "rtshm"
_SHM_DIR = Path("/dev/shm")
_NAME_RE = re.compile(rf"^{REGION_PREFIX}_(\d+)_[0-9a-f]+_")
_MAX_NAME = 200


def new_region_name(label: str, *, pid: int | None = None) -> str:
    """Returns a fresh, unique region name for ``label`` owned by ``pid`` (default: this one)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", label)
    name = f"{REGION_PREFIX}_{os.getpid() if pid is None else pid}_{secrets.token_hex(4)}_{safe}"
    return name[:_MAX_NAME]


def owner_pid(name: str) -> int | None:
    """The owner's pid encoded in one of our region names, or ``None`` for foreign names."""
    match = _NAME_RE.match(name.lstrip("/"))
    return int(match.group(1)) if match else None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this machine (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # gone meanwhile, unless there is no /proc
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


class SharedMemoryRegion:
    """A mapped POSIX shared-memory object.

    Use :meth:`create` in the owning process and :meth:`attach` elsewhere.

    Attributes:
        name: Region name, without the leading slash.
        size: Size in bytes.
        owner: Whether this process created the region (and will unlink it).
    """

    def __init__(self, name: str, size: int, mapping: mmap.mmap, *, owner: bool) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self._mmap: mmap.mmap | None = mapping

    @property
    def key(self) -> str:
        """The ``shm_open`` key Triton needs: the name with a leading slash."""
        return "/" + self.name

    @property
    def buffer(self) -> mmap.mmap:
        """The mapping; NumPy views are made with ``np.frombuffer(region.buffer, ...)``."""
        if self._mmap is None:
            raise ValueError(f"shared memory region {self.name!r} is closed")
        return self._mmap

    @classmethod
    def create(cls, name: str, size: int) -> SharedMemoryRegion:
        """Creates a new region (mode 0600), reserves its pages, and maps it.

        Raises:
            FileExistsError: if the name is taken.
            OSError: if ``/dev/shm`` has no room for ``size`` bytes (raised now, instead of a
                SIGBUS on first write).
        """
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mapping = mmap.mmap(fd, size, flags=flags)
            except BaseException:
                _posixshmem.shm_unlink("/" + name)
                raise
        finally:
            os.close(fd)
        resource_tracker.register("/" + name, "shared_memory")
        return cls(name, size, mapping, owner=True)

    @classmethod
    def attach(cls, name: str) -> SharedMemoryRegion:
        """Maps an existing region without registering it with the resource tracker."""
        fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name.lstrip("/"), size, mapping, owner=False)

    def close(self) -> None:
        """Unmaps the region; if NumPy views still use it, the unmapping waits for GC."""
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # views are still alive; the mapping goes when they do

    def unlink(self) -> None:
        """Removes the name from ``/dev/shm`` (owner only); idempotent."""
        if not self.owner:
            return
        self.owner = False
        unlink_region(self.name)
        resource_tracker.unregister("/" + self.name, "shared_memory")

    def __repr__(self) -> str:
        return f"SharedMemoryRegion(name={self.name!r}, size={self.size}, owner={self.owner})"


def unlink_region(name: str) -> bool:
    """Unlinks a region by name; returns whether it existed."""
    try:
        _posixshmem.shm_unlink("/" + name.lstrip("/"))
    except FileNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class LocalRegion:
    """One of our regions found in ``/dev/shm``.

    Attributes:
        name: Region name.
        size: Size in bytes.
        owner_pid: The pid encoded in the name.
        owner_alive: Whether that process still exists.
    """

    name: str
    size: int
    owner_pid: int
    owner_alive: bool


def list_local_regions() -> list[LocalRegion]:
    """Our regions present in ``/dev/shm`` on this machine, sorted by name."""
    regions: list[LocalRegion] = []
    if not _SHM_DIR.is_dir():
        return regions
    for path in sorted(_SHM_DIR.iterdir()):
        pid = owner_pid(path.name)
        if pid is None:
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        regions.append(LocalRegion(path.name, size, pid, pid_alive(pid)))
    return regions
