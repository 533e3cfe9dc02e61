"""What regions there are: ours in ``/dev/shm`` and Triton's registrations, each with its
owner, whether it is alive and how its pool reaches Triton (the ``status`` command;
:mod:`.._pools._reclaim` takes back those of dead owners)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tritonclient.utils import InferenceServerException

from .._defaults import DEFAULT_URL
from .._exceptions import ForeignRegionError
from .._inference._transport import INLINE, SHM
from .._pools._reclaim import headers_for_tool, region_header, registrations
from .._slots._header import LAYOUT_VERSION, RegionHeader, header_version
from .._slots._memory import BY_VALUE
from .._slots._shm import (
    list_local_regions,
    owner_state,
    region_of,
    region_owner,
)
from .._wire._keys import Keys
from .._wire._plain_client import tritonclient_for
from .._wire._triton_errors import translate_error

__all__ = ["RegionStatus", "StatusReport", "region_status"]


@dataclass(frozen=True)
class RegionStatus:
    """One region: ours (by name) or, for registrations, anybody's.

    Attributes:
        name: Region name.
        size: Size in bytes (from ``/dev/shm`` or from Triton).
        owner_pid: The owner's pid (in its own pid namespace), ``None`` for regions that are not
            ours.
        owner: ``"alive"``, ``"dead"`` (proven), ``"other namespace"`` (left alone), or
            ``None`` for regions that are not ours.
        in_dev_shm: Whether the name exists in ``/dev/shm``.
        registered: Whether Triton has it registered (``None`` when no server was asked).
        transport: How its pool reaches Triton, as its header says: ``"shm"`` (Triton maps
            it), ``"inline"`` (by value: a region of the header alone, never registered), or
            ``None`` (not in this machine's ``/dev/shm``, not a pool's, or foreign).
        layout_version: The layout version its header says (``None``: not in this machine's
            ``/dev/shm``, not a pool's, or no stamp of this library's).
        foreign: Whether it is a pool's region whose header is not of this version's layout
            (another version of the library made it, or something wrote over it): this
            version's processes refuse it (:class:`~ray_triton_shm.ForeignRegionError`).
    """

    name: str
    size: int
    owner_pid: int | None
    owner: str | None
    in_dev_shm: bool
    registered: bool | None
    transport: str | None = None
    layout_version: int | None = None
    foreign: bool = False


@dataclass(frozen=True)
class StatusReport:
    """What :func:`region_status` found.

    Attributes:
        url: The server asked, or ``None``.
        server_error: Why the server could not be asked, if it could not.
        regions: Every region of ours on this machine and every registration on the server.
    """

    url: str | None
    server_error: str | None
    regions: list[RegionStatus] = field(default_factory=list)


def region_status(
    url: str | None = DEFAULT_URL, *, headers: Mapping[str, str] | Keys | None = None
) -> StatusReport:
    """Lists our regions in ``/dev/shm`` and the shared-memory registrations (system and
    CUDA) of a server.

    Args:
        url: Triton's gRPC address; ``None`` to look at this machine only.
        headers: gRPC headers (Triton's access keys), or :class:`Keys`; ``None`` reads them
            from the environment (``RAY_TRITON_SHM_HEADER_*``) and the key files of
            ``$RAY_TRITON_SHM_KEYS_DIR``, now.
    """
    local = {r.name: r for r in list_local_regions()}
    registered: dict[str, int] | None = None
    server_error = None
    if url is not None:
        try:
            with tritonclient_for(url) as client:
                registered = {
                    region_of(name): size
                    for name, (size, _) in registrations(client, headers_for_tool(headers)).items()
                }
        except InferenceServerException as exc:
            server_error = str(translate_error(exc, action="reading shared memory status"))
    names = sorted(set(local) | set(registered or {}))
    regions = []
    for name in names:
        owner = region_owner(name)
        region = local.get(name)
        header = region_header(name) if region else None
        version = None if header is None else header_version(header)
        regions.append(
            RegionStatus(
                name=name,
                size=region.size if region else (registered or {}).get(name, 0),
                owner_pid=None if owner is None else owner.pid,
                owner=region.owner_state if region else owner_state(name),
                in_dev_shm=region is not None,
                registered=None if registered is None else name in registered,
                transport=_transport(header) if version == LAYOUT_VERSION else None,
                layout_version=version,
                foreign=header is not None and version != LAYOUT_VERSION,
            )
        )
    return StatusReport(url=url, server_error=server_error, regions=regions)


def _transport(header: bytes | None) -> str | None:
    """How the pool of a region reaches Triton, from its (stamped) header's memory kind."""
    if header is None:
        return None
    try:
        memory = RegionHeader(header, 0).memory
    except ForeignRegionError:  # not a memory kind: not a pool's header
        return None
    return INLINE if memory == BY_VALUE else SHM
