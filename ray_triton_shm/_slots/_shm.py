"""POSIX shared-memory regions: naming, creating, attaching, unlinking, and finding our own.

Region names look like ``rtshm_<pid>-<pidns>_<token>_<label>``: a fixed prefix, the owner, a
random token (so one process can own several regions for the same model), and a readable label.
The owner is its pid and the inode of its pid namespace: containers that share ``/dev/shm``
(``docker run --ipc=host``, Kubernetes ``hostIPC``) do not share pid namespaces, and a pid means
nothing outside its own. The owner also holds an ``flock`` on its region's file for as long as
the region lives, which every namespace sharing the file can see.

So a region's owner is proven dead (:func:`owner_state`) when it ran in our pid namespace and its
pid is gone, or when it ran in another one and nobody holds the lock of the region's file. Where
neither can be proven, the region is another namespace's and is left alone.

Each slot of a region also has a name of its own, a hard link to the region's file:
``<region>@<slot>`` (:func:`slot_key`). Triton registers every slot under its own name, so it
counts the requests using each slot apart, and refuses to unregister a slot while one does:
that is how a slot whose request was abandoned is proven free again (see
:mod:`.._pools._abandoned`). Triton refuses to register one key twice, hence names, not offsets
into one name.

The owner creates the region with owner-only permissions and also hands it to
:mod:`multiprocessing.resource_tracker`, so the name is unlinked even if the owner is killed.
Other processes :meth:`SharedMemoryRegion.attach` without the tracker: on Python < 3.13 the
tracker of an attaching process would unlink a region it does not own when that process exits.
A region is only created where ``/dev/shm`` has room for it (:func:`ensure_room`), so that a
full ``/dev/shm`` is a :class:`SharedMemoryFullError` and not a ``SIGBUS`` on first write.
"""

from __future__ import annotations

import _posixshmem  # CPython's shm_open/shm_unlink, as used by multiprocessing.shared_memory
import contextlib
import errno
import fcntl
import functools
import glob
import math
import mmap
import os
import re
import secrets
import time
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path

from .._exceptions import ClientClosedError, SharedMemoryFullError

__all__ = [
    "ALIVE",
    "DEAD",
    "OTHER_NAMESPACE",
    "REGION_PREFIX",
    "LocalRegion",
    "Owner",
    "SharedMemoryRegion",
    "ensure_room",
    "list_local_regions",
    "mib",
    "new_region_name",
    "object_store_in_dev_shm",
    "own_raylet",
    "owner_state",
    "pid_alive",
    "pid_namespace",
    "region_of",
    "region_owner",
    "shm_space",
    "slot_key",
]

REGION_PREFIX = "rtshm"
SHM_DIR = Path("/dev/shm")
_NAME_RE = re.compile(rf"^{REGION_PREFIX}_(\d+)-(\d+)_[0-9a-f]+_")
_MAX_NAME = 200
#: A region's file this young may still be taking its owner's lock: never judged dead.
_CREATE_GRACE_S = 5.0

#: What :func:`owner_state` can tell of a region's owner.
ALIVE, DEAD, OTHER_NAMESPACE = "alive", "dead", "other namespace"


@dataclass(frozen=True)
class Owner:
    """Who owns one of our regions.

    Attributes:
        pid: Its pid, in its own pid namespace.
        pid_namespace: The inode of that namespace (``0`` where ``/proc`` did not tell).
    """

    pid: int
    pid_namespace: int


@functools.cache
def pid_namespace() -> int:
    """The inode of this process's pid namespace, ``0`` where ``/proc`` does not tell."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _forget_namespace_in_child() -> None:
    pid_namespace.cache_clear()  # a child of unshare --pid --fork is in a new namespace


os.register_at_fork(after_in_child=_forget_namespace_in_child)


def new_region_name(label: str) -> str:
    """Returns a fresh, unique region name for ``label``, owned by this process."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", label)
    token = secrets.token_hex(4)
    return f"{REGION_PREFIX}_{os.getpid()}-{pid_namespace()}_{token}_{safe}"[:_MAX_NAME]


def slot_key(region_name: str, slot: int) -> str:
    """The name of one slot of a region: a hard link to the region's file, registered in
    Triton on its own."""
    return f"{region_name}@{slot}"


def region_of(name: str) -> str:
    """The region a name belongs to: itself, or the region of a slot's name."""
    return name.lstrip("/").partition("@")[0]


def region_owner(name: str) -> Owner | None:
    """The owner encoded in one of our region names, or ``None`` for foreign names."""
    match = _NAME_RE.match(name.lstrip("/"))
    return Owner(int(match.group(1)), int(match.group(2))) if match else None


def owner_state(name: str) -> str | None:
    """Whether the owner of one of our regions is :data:`ALIVE`, proven :data:`DEAD`, or runs in
    :data:`OTHER_NAMESPACE` where that cannot be proven; ``None`` for foreign names.

    A region of another pid namespace is dead only if its file is in our ``/dev/shm``, is not
    brand new, and nobody holds its lock.
    """
    owner = region_owner(name)
    if owner is None:
        return None
    if owner.pid_namespace == pid_namespace():
        return ALIVE if pid_alive(owner.pid) else DEAD
    return DEAD if _lock_is_free(name.lstrip("/")) else OTHER_NAMESPACE


def _lock_is_free(name: str) -> bool:
    try:
        fd = os.open(SHM_DIR / name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False  # gone, or not ours to open: nothing proven
    try:
        if time.time() - os.fstat(fd).st_ctime < _CREATE_GRACE_S:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its owner lives, in whatever namespace
        return True
    finally:
        os.close(fd)  # and with it our lock


def shm_space() -> tuple[int, int] | None:
    """``(free, total)`` bytes of ``/dev/shm``, or ``None`` where it cannot be read."""
    try:
        fs = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize


def ensure_room(needed: int, *, what: str, model: str = "", fix: str = "") -> None:
    """Raises :class:`SharedMemoryFullError` if ``/dev/shm`` has less than ``needed`` bytes free.

    Args:
        needed: Bytes about to be created.
        what: What needs them, for the message (e.g. ``"model 'x': 4 slots of 12 MB"``).
        model: The model, for the error's attributes.
        fix: A remedy of the caller's own, offered besides a bigger ``/dev/shm``.
    """
    space = shm_space()
    if space is not None and needed > space[0]:
        raise _full(needed, *space, what=what, model=model, fix=fix)


def _full(
    needed: int, free: int, total: int, *, what: str, model: str, fix: str
) -> SharedMemoryFullError:
    # Room for what is there now plus this region, rounded up to a power of two of MiB.
    suggested = 2 ** math.ceil(math.log2(max(1, (total - free + needed) / 2**20)))
    remedy = f", or {fix}" if fix else ""
    return SharedMemoryFullError(
        f"{what} needs {mib(needed)} of shared memory, but /dev/shm has {mib(free)} free "
        f"(of {mib(total)}). Give /dev/shm more room: `docker run --shm-size={suggested}m ...`, "
        "or in Kubernetes mount an emptyDir with `medium: Memory` (and a sizeLimit) at /dev/shm"
        f"{remedy}.",
        model=model,
        needed=needed,
        free=free,
    )


def object_store_in_dev_shm(
    object_store_bytes: int, node: str = "", shm_total: int | None = None
) -> bool:
    """Whether Ray's object store of this node lives in ``/dev/shm`` (and so takes its room).

    The node's own raylet says (where several raylets share a host, the others say nothing
    about this node): the ``--plasma_directory`` it was started with, or a file it maps under
    ``/dev/shm``. Where it cannot be found, Ray's own rule: the store goes to ``/dev/shm`` when
    it fits there, else to ``/tmp``.

    Args:
        object_store_bytes: The size of the node's object store; ``0``: no Ray, or unknown.
        node: The Ray node id, to find its raylet (see :func:`own_raylet`).
        shm_total: The size of ``/dev/shm``; ``None``: read now.
    """
    if shm_total is None:
        space = shm_space()
        shm_total = 0 if space is None else space[1]
    if not object_store_bytes or object_store_bytes > shm_total:
        return False
    pid = own_raylet(node)
    if pid is None:
        return True
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace")
        for arg in argv.split("\0"):
            if arg.startswith("--plasma_directory="):
                return arg.partition("=")[2].rstrip("/") == str(SHM_DIR)
        return f" {SHM_DIR}/" in (Path("/proc") / str(pid) / "maps").read_text()
    except OSError:
        return True


def own_raylet(node: str = "") -> int | None:
    """The pid of this node's raylet: an ancestor of this process (a Ray worker's), else the
    raylet started for ``node`` (a Ray node id), else the only raylet of this host; ``None``
    if unknown."""
    proc = Path("/proc")
    pid = os.getpid()
    with contextlib.suppress(OSError, ValueError, IndexError):
        while pid > 1:
            if (proc / str(pid) / "comm").read_text().strip() == "raylet":
                return pid
            pid = int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    raylets = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (entry / "comm").read_text().strip() != "raylet":
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if node and f"--node_id={node}".encode() in argv:
                return int(entry.name)
            raylets.append(int(entry.name))
    return raylets[0] if len(raylets) == 1 else None


def mib(size: int) -> str:
    """``size`` bytes in MiB, for messages (``"1,024.0 MiB"``)."""
    return f"{size / 2**20:,.1f} MiB"


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

    def __init__(
        self, name: str, size: int, mapping: mmap.mmap, *, owner: bool, lock_fd: int | None = None
    ) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self._mmap: mmap.mmap | None = mapping
        self._lock_fd = lock_fd  # the owner's open file, flock-ed while the region lives

    @property
    def key(self) -> str:
        """The ``shm_open`` key Triton needs: the name with a leading slash."""
        return "/" + self.name

    @property
    def buffer(self) -> mmap.mmap:
        """The mapping; NumPy views are made with ``np.frombuffer(region.buffer, ...)``."""
        if self._mmap is None:
            raise ClientClosedError(f"shared memory region {self.name!r} is closed")
        return self._mmap

    @classmethod
    def create(
        cls, name: str, size: int, *, slots: int = 0, backed: int | None = None
    ) -> SharedMemoryRegion:
        """Creates a new region (mode 0600) and the names of its ``slots``, locks it, reserves
        the pages of its first ``backed`` bytes (default: all), and maps it.

        The rest of the file is a hole: it costs ``/dev/shm`` nothing until :meth:`back`
        reserves it (a pool that grows, see :mod:`.._pools._scaling`).

        Raises:
            FileExistsError: if the name is taken.
            SharedMemoryFullError: if ``/dev/shm`` has no room for ``backed`` bytes (raised
                now, instead of a SIGBUS on first write); nothing is left behind.
        """
        backed = size if backed is None else backed
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, backed)
            # Populating would fault in (and so allocate) the holes too.
            populate = getattr(mmap, "MAP_POPULATE", 0) if backed == size else 0
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | populate)
            for slot in range(slots):
                os.link(SHM_DIR / name, SHM_DIR / slot_key(name, slot))
        except BaseException as exc:
            unlink_region(name)
            os.close(fd)
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                space = shm_space() or (0, 0)
                raise _full(backed, *space, what=f"region {name!r}", model="", fix="") from exc
            raise
        for key in (name, *(slot_key(name, slot) for slot in range(slots))):
            resource_tracker.register("/" + key, "shared_memory")
        return cls(name, size, mapping, owner=True, lock_fd=fd)

    def back(self, offset: int, length: int) -> None:
        """Reserves the pages of ``length`` bytes at ``offset`` in ``/dev/shm`` (owner only;
        idempotent), so that writing there can never fault.

        Raises:
            SharedMemoryFullError: ``/dev/shm`` has no room (nothing was reserved).
        """
        fd = self._owner_fd()
        try:
            os.posix_fallocate(fd, offset, length)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            free, total = shm_space() or (0, 0)
            raise _full(
                length, free, total, what=f"region {self.name!r}", model="", fix=""
            ) from exc

    def unback(self, offset: int, length: int) -> None:
        """Gives the pages of ``length`` bytes at ``offset`` back to ``/dev/shm`` (a hole again:
        it reads as zeros). Only for bytes no one uses: Triton included."""
        self.buffer.madvise(mmap.MADV_REMOVE, offset, length)

    @property
    def allocated(self) -> int:
        """Bytes of the region ``/dev/shm`` holds now (its size, less its holes), as every
        process that maps it reads it: its owner through its file, the others by its name
        (``0`` once the file is gone)."""
        if self._lock_fd is None:
            try:
                return os.stat(SHM_DIR / self.name).st_blocks * 512
            except OSError:
                return 0
        try:
            return os.fstat(self._lock_fd).st_blocks * 512
        except OSError:
            return self.size

    def _owner_fd(self) -> int:
        if self._lock_fd is None:
            raise ClientClosedError(f"shared memory region {self.name!r} is not owned here")
        return self._lock_fd

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
        self._unlock()
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
        for key in unlink_region(self.name):
            resource_tracker.unregister("/" + key, "shared_memory")
        self._unlock()  # nobody can find the file by its name any more

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        return f"SharedMemoryRegion(name={self.name!r}, size={self.size}, owner={self.owner})"


def unlink_region(name: str) -> list[str]:
    """Unlinks a region and the names of its slots; returns the names that existed."""
    name = name.lstrip("/")
    unlinked = []
    for key in [name, *(path.name for path in SHM_DIR.glob(f"{glob.escape(name)}@*"))]:
        try:
            _posixshmem.shm_unlink("/" + key)
        except FileNotFoundError:
            continue
        unlinked.append(key)
    return unlinked


@dataclass(frozen=True)
class LocalRegion:
    """One of our regions found in ``/dev/shm``.

    Attributes:
        name: Region name.
        size: Size in bytes.
        owner: Its owner, from the name.
        owner_state: :data:`ALIVE`, :data:`DEAD` or :data:`OTHER_NAMESPACE`.
    """

    name: str
    size: int
    owner: Owner
    owner_state: str


def list_local_regions() -> list[LocalRegion]:
    """Our regions present in ``/dev/shm`` on this machine, sorted by name."""
    regions: list[LocalRegion] = []
    if not SHM_DIR.is_dir():
        return regions
    names = {path.name for path in SHM_DIR.iterdir()}
    for path in sorted(SHM_DIR.iterdir()):
        owner = region_owner(path.name)
        if owner is None or region_of(path.name) in names - {path.name}:
            continue  # not ours, or the name of a slot, listed with its region
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        regions.append(LocalRegion(path.name, size, owner, owner_state(path.name) or DEAD))
    return regions
