"""Which GPU a pool lives on, decided without CUDA: what ``device=`` names, which of the GPUs a
process sees that is, how a GPU's UUID is written into a region, and the index Triton knows the
GPU by.

A GPU is named by its UUID across processes: Ray gives each worker its own
``CUDA_VISIBLE_DEVICES``, so the same GPU has different indices in the node actor, a Serve
replica and Triton. Indices are only used inside one process. These are pure functions of the
GPUs a process sees (:mod:`._cuda` lists them) and of its environment.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._exceptions import CudaError

__all__ = [
    "UUID_PREFIX",
    "VISIBLE_DEVICES_ENV_VAR",
    "Device",
    "choose_device",
    "describe_visible_devices",
    "parse_device",
    "triton_device_id",
    "uuid_bytes",
    "uuid_name",
]

VISIBLE_DEVICES_ENV_VAR = "CUDA_VISIBLE_DEVICES"
#: How ``nvidia-smi -L`` starts a GPU's UUID, and how this library writes every UUID.
UUID_PREFIX = "GPU-"


@dataclass(frozen=True)
class Device:
    """A GPU as this process sees it.

    Attributes:
        index: Its CUDA index in this process (depends on ``CUDA_VISIBLE_DEVICES``).
        uuid: Its UUID, ``"GPU-..."`` as ``nvidia-smi -L`` prints it: the same in every
            process.
        name: Its product name.
    """

    index: int
    uuid: str
    name: str


def uuid_name(raw: bytes) -> str:
    """A GPU's UUID as ``nvidia-smi -L`` prints it (``"GPU-..."``), from its 16 bytes (as CUDA
    gives them, and as a region's table holds them)."""
    h = raw.hex()
    return f"{UUID_PREFIX}{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def uuid_bytes(name: str) -> bytes:
    """The 16 bytes of a GPU's UUID ``"GPU-..."`` (the inverse of :func:`uuid_name`)."""
    return uuid.UUID(name.removeprefix(UUID_PREFIX)).bytes


def parse_device(device: int | str | None) -> int | str | None:
    """What ``device=`` names: an index in this process, a UUID (or its prefix), or ``None``
    for the current CUDA device.

    Args:
        device: ``0``, ``"1"`` or ``"cuda:1"`` (an index), ``"GPU-..."`` (a UUID, as
            ``nvidia-smi -L`` prints it; a prefix is enough), or ``None``.

    Returns:
        The index as an ``int``, the UUID as given, or ``None``.

    Raises:
        CudaError: ``device`` is none of these kinds (a float, a bool...).
    """
    if isinstance(device, str) and device.startswith("cuda:"):
        device = device.removeprefix("cuda:")
    if isinstance(device, str) and device.isdigit():
        device = int(device)
    if isinstance(device, bool) or not isinstance(device, (int, str, type(None))):
        raise CudaError(
            f"device must be a GPU index, 'cuda:N' or a GPU UUID ('GPU-...'), got {device!r}"
        )
    return device


def describe_visible_devices(environ: Mapping[str, str] = os.environ) -> str:
    """``CUDA_VISIBLE_DEVICES`` as an error message names it: its value, or that it is unset."""
    visible = environ.get(VISIBLE_DEVICES_ENV_VAR)
    if visible is None:
        return f"{VISIBLE_DEVICES_ENV_VAR} unset"
    return f"{VISIBLE_DEVICES_ENV_VAR}={visible!r}"


def choose_device(
    wanted: int | str, devices: Sequence[Device], environ: Mapping[str, str] = os.environ
) -> Device:
    """The one GPU of ``devices`` (those a process sees) that ``wanted`` names.

    Args:
        wanted: An index in the process, or a UUID or its prefix (as :func:`parse_device`
            returns them; the current device already resolved to its index).
        devices: The GPUs the process sees, by index.
        environ: The process's environment, for the error's message.

    Raises:
        CudaError: no GPU, or more than one, of ``devices`` is named by ``wanted`` (naming
            ``CUDA_VISIBLE_DEVICES`` and the GPUs seen).
    """
    if isinstance(wanted, int):
        found = [d for d in devices if d.index == wanted]
    else:
        found = [d for d in devices if d.uuid.startswith(wanted)]
    if len(found) != 1:
        seen = ", ".join(f"{d.index}: {d.uuid}" for d in devices) or "none"
        env = describe_visible_devices(environ)
        raise CudaError(
            f"GPU {wanted!r} is not visible to this process ({env}; it sees {seen}). Give "
            "this process that GPU (in Ray: num_gpus on the task, actor or Serve replica on "
            "the GPU's node), or name one it sees",
            device=str(wanted),
        )
    return found[0]


def triton_device_id(device: Device, environ: Mapping[str, str] = os.environ) -> int:
    """The index Triton most likely knows ``device`` by: its index on the machine, where
    ``CUDA_VISIBLE_DEVICES`` lists indices, else its index in the process.

    Right where Triton sees every GPU of the machine (as in its container by default). With
    UUIDs in ``CUDA_VISIBLE_DEVICES`` the machine's index is unknown here, so the process's
    index is the guess.

    Args:
        device: The GPU, as the process sees it.
        environ: The process's environment.
    """
    visible = environ.get(VISIBLE_DEVICES_ENV_VAR)
    if visible is None:
        return device.index
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if device.index < len(entries) and entries[device.index].isdigit():
        return int(entries[device.index])
    return device.index
