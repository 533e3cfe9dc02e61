"""Taking back the regions whose owner process is gone: their registrations in Triton and
their files in ``/dev/shm``.

A process killed with SIGKILL runs no cleanup: its regions stay registered in Triton (which
keeps them mapped), and on some paths stay in ``/dev/shm``. Our region names carry their owner
(see :mod:`.._slots._shm`), so anything of ours whose owner is proven dead can be reclaimed.
Regions of owners in other pid namespaces (other containers sharing ``/dev/shm`` and Triton) are
taken back only when their file's lock proves the owner gone; otherwise they are left alone.

A client takes back dead owners' registrations before it registers a region of its own, its
watchdog (:mod:`._reaper`) what its owner left, a node actor what its previous incarnation
left; the ``reclaim`` command all of them (:mod:`.._tools._region_status` lists them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from .._defaults import DEFAULT_URL
from .._slots._header import LAYOUT_VERSION, header_version
from .._slots._shm import (
    DEAD,
    SHM_DIR,
    Owner,
    list_local_regions,
    owner_state,
    pid_namespace,
    region_of,
    region_owner,
    unlink_region,
)
from .._slots._specs import REGION_HEADER_BYTES
from .._wire._keys import Keys
from .._wire._plain_client import tritonclient_for
from .._wire._triton_errors import is_in_use, translate_error

__all__ = [
    "ReclaimReport",
    "headers_for_tool",
    "foreign_regions",
    "may_take",
    "reclaim_dead_registrations",
    "reclaim_regions",
    "region_header",
    "registrations",
]


def region_header(name: str) -> bytes | None:
    """The header of the region ``name`` (``None``: gone, another user's, or too small to be
    a pool's: a probe's, the doctor's)."""
    try:
        fd = os.open(SHM_DIR / name, os.O_RDONLY)
    except OSError:  # gone meanwhile, or another user's
        return None
    try:
        header = os.pread(fd, REGION_HEADER_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return header if len(header) == REGION_HEADER_BYTES else None


def foreign_regions() -> list[str]:
    """Our regions in ``/dev/shm`` whose header is not of this version's layout."""
    found = []
    for region in list_local_regions():
        header = region_header(region.name)
        if header is not None and header_version(header) != LAYOUT_VERSION:
            found.append(region.name)
    return found


@dataclass(frozen=True)
class ReclaimReport:
    """What :func:`reclaim_regions` did.

    Attributes:
        unregistered: Region names unregistered from Triton.
        unlinked: Region names removed from ``/dev/shm``.
        server_error: Why the server could not be cleaned, if it could not.
        foreign: Regions of ours left in ``/dev/shm`` whose header is not of this version's
            layout (another version of the library made them, or something wrote over them):
            left alone while their owner lives, as any other.
    """

    unregistered: list[str]
    unlinked: list[str]
    server_error: str | None = None
    foreign: list[str] = field(default_factory=list)


def registrations(
    client: grpcclient.InferenceServerClient, headers: Mapping[str, str] | None = None
) -> dict[str, tuple[int, bool]]:
    """Triton's registrations by name (a region's slots are registered one by one, see
    :func:`.._slots._shm.slot_key`), with their sizes and whether each is CUDA shared memory (a GPU
    pool's slot: its owner's GPU memory went with it, but Triton keeps the registration)."""
    answer = client.get_system_shared_memory_status(as_json=True, headers=headers)
    found = {
        name: (int(info.get("byte_size", 0)), False)
        for name, info in answer.get("regions", {}).items()
    }
    try:
        cuda = client.get_cuda_shared_memory_status(as_json=True, headers=headers)
    except InferenceServerException:
        return found  # a Triton without CUDA shared memory holds no GPU registration
    for name, info in cuda.get("regions", {}).items():
        found[name] = (int(info.get("byte_size", 0)), True)
    return found


def reclaim_dead_registrations(
    client: grpcclient.InferenceServerClient,
    *,
    owner: int | None = None,
    headers: Mapping[str, str] | None = None,
    in_use_wait_s: float = 0.0,
) -> list[str]:
    """Unregisters regions of ours whose owner is proven dead; returns their names.

    Args:
        client: A client of the server.
        owner: Only regions of this (gone) process of our pid namespace; ``None``: of any
            owner proven dead.
        headers: gRPC headers for the calls (``None``: the client's own, if it has any).
        in_use_wait_s: How long to keep trying a registration Triton refuses to drop because
            a request still uses it (a request the dead owner left running): Triton lets go
            of it once that request is done.

    Raises:
        InferenceServerException: when the server cannot be asked.
    """
    reclaimed: set[str] = set()
    found = registrations(client, headers)
    names = [name for name in found if _reclaimable(name, owner)]
    deadline = time.monotonic() + in_use_wait_s
    while names:
        in_use = []
        for name in names:
            try:
                if found[name][1]:
                    client.unregister_cuda_shared_memory(name, headers=headers)
                else:
                    client.unregister_system_shared_memory(name, headers=headers)
            except InferenceServerException as exc:
                if is_in_use(exc):
                    in_use.append(name)
                continue  # else another process reclaimed it first
            reclaimed.add(region_of(name))
        names = in_use
        if names and time.monotonic() < deadline:
            time.sleep(0.1)
        else:
            break
    return sorted(reclaimed)


def reclaim_regions(
    url: str | None = DEFAULT_URL,
    *,
    owner: int | None = None,
    headers: Mapping[str, str] | Keys | None = None,
    in_use_wait_s: float = 0.0,
) -> ReclaimReport:
    """Unregisters from Triton and unlinks from ``/dev/shm`` every region of ours whose owner
    is proven dead (see :func:`.._slots._shm.owner_state`); regions of other pid namespaces whose
    owner may live are left alone.

    Args:
        url: Triton's gRPC address; ``None`` to clean ``/dev/shm`` only.
        owner: Only regions of this (gone) process of our pid namespace; ``None``: of any
            owner proven dead.
        headers: gRPC headers (Triton's access keys), or :class:`Keys`; ``None`` reads them
            from the environment (``RAY_TRITON_SHM_HEADER_*``) and the key files of
            ``$RAY_TRITON_SHM_KEYS_DIR``, now.
        in_use_wait_s: How long to keep trying registrations that requests still use (see
            :func:`reclaim_dead_registrations`).
    """
    unregistered: list[str] = []
    server_error = None
    if url is not None:
        try:
            with tritonclient_for(url) as client:
                unregistered = reclaim_dead_registrations(
                    client,
                    owner=owner,
                    headers=headers_for_tool(headers),
                    in_use_wait_s=in_use_wait_s,
                )
        except InferenceServerException as exc:
            server_error = str(translate_error(exc, action="reclaiming registrations"))
    unlinked = [
        r.name
        for r in list_local_regions()  # which judged each owner already
        if r.owner_state == DEAD and may_take(r.owner, owner) and unlink_region(r.name)
    ]
    return ReclaimReport(
        unregistered=unregistered,
        unlinked=unlinked,
        server_error=server_error,
        foreign=foreign_regions(),
    )


def headers_for_tool(headers: Mapping[str, str] | Keys | None) -> dict[str, str]:
    """The headers given for a tool's calls (``None``: none, and the client's plugin puts the
    key files' and the environment's on each call: see :func:`tritonclient_for`)."""
    if headers is None:
        return {}
    return headers.headers if isinstance(headers, Keys) else Keys(headers).headers


def _reclaimable(name: str, only: int | None) -> bool:
    return may_take(region_owner(name), only) and owner_state(name) == DEAD


def may_take(owner: Owner | None, only: int | None) -> bool:
    """Whether a region of ``owner`` is one to take back if its owner is dead: ours, not this
    process's, and of process ``only`` of our namespace when given."""
    if owner is None or owner == Owner(os.getpid(), pid_namespace()):
        return False
    return only is None or owner == Owner(only, pid_namespace())
