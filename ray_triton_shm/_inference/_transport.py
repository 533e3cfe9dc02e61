"""How a pool's tensors reach Triton: through shared memory Triton maps (``"shm"``), or by
value, in the requests (``"inline"``), for a Triton that cannot map this process's memory: on
another host, in a container with a ``/dev/shm`` of its own, as another user.

The choice is made per model, by proof, never by guess. ``transport="auto"`` (the default)
tries each memory of :func:`attempts` in turn: Triton must open the region (its registration
is the first proof), then a probe request must land in it (:func:`probe`: Triton could open
another file of the same name in another mount namespace). A memory Triton cannot map raises
:class:`Unmappable` with the reason, and the next is tried; by value always works.
``transport="shm"`` stops with :class:`SharedMemoryUnreachableError` instead, naming the node
and the reasons.

Whether Triton opens a region made here at all, without a pool (a pool by value asking again,
the doctor), is :func:`region_refusal`.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from .._exceptions import ModelSpecError, SharedMemoryUnreachableError, TritonServerError
from .._slots._memory import BY_VALUE, CUDA, SYSTEM, SlotMemory
from .._slots._shm import SHM_DIR, SharedMemoryRegion, new_region_name
from .._slots._specs import ModelSpec
from .._wire._triton_errors import is_unopenable, status_and_message
from ._requests import SlotRequests

__all__ = [
    "AUTO_TRANSPORT",
    "INLINE",
    "SHM",
    "TRANSPORTS",
    "Transport",
    "OTHER_DEV_SHM",
    "OTHER_UID",
    "Unmappable",
    "attempts",
    "check_transport",
    "probe",
    "region_refusal",
    "unopenable_cause",
    "unreachable_error",
]

#: ``transport="auto"``: shared memory where Triton proves it maps this process's, else by
#: value (:func:`attempts`).
AUTO_TRANSPORT = "auto"
#: ``transport="shm"``: through shared memory Triton maps, or an error.
SHM = "shm"
#: ``transport="inline"``: by value, in the requests (a pool whose memory is
#: :data:`.._slots._memory.BY_VALUE`).
INLINE = "inline"
#: What ``transport=`` takes.
TRANSPORTS = (AUTO_TRANSPORT, SHM, INLINE)
#: How long the probe request waits for Triton's answer.
PROBE_TIMEOUT_S = 30.0
#: The id of the probe request, as Triton logs it.
PROBE_REQUEST_ID = "ray-triton-shm-probe"
#: The size of a region made only to see whether Triton opens it (:func:`region_refusal`).
_TRIAL_BYTES = 4096


@dataclass(frozen=True)
class Transport:
    """How a pool's tensors reach Triton, and why.

    Attributes:
        kind: ``"shm"`` (through shared memory Triton maps) or ``"inline"`` (by value, in the
            requests).
        reason: Why, in words: what proved it, or that it was asked for.
        asked: The ``transport=`` it was chosen for (``"auto"``: found by proof, and proven
            again after Triton restarts or moves).
    """

    kind: str
    reason: str
    asked: str = AUTO_TRANSPORT

    @property
    def by_value(self) -> bool:
        """Whether the tensors travel in the requests."""
        return self.kind == INLINE


#: :attr:`Unmappable.cause`: Triton sees another ``/dev/shm`` than this process (proven).
OTHER_DEV_SHM = "dev_shm"
#: :attr:`Unmappable.cause`: Triton runs as a user that cannot open this process's regions.
OTHER_UID = "uid"


class Unmappable(Exception):
    """Triton cannot map a region of this process.

    Args:
        reason: Why, in a sentence (the message).
        refusal: Triton's refusal, explained (what ``transport="shm"`` raises from).
        cause: What was proven: :data:`OTHER_DEV_SHM`, :data:`OTHER_UID`, or ``None``
            (either).
    """

    def __init__(
        self, reason: str, refusal: TritonServerError | None = None, cause: str | None = None
    ) -> None:
        super().__init__(reason)
        self.refusal = refusal
        self.cause = cause


def check_transport(model: str, transport: str) -> None:
    """Checks a ``transport=`` value, before anything is made.

    Raises:
        ModelSpecError: naming the model, the values allowed and the value given.
    """
    if transport not in TRANSPORTS:
        raise ModelSpecError(
            f"model {model!r}: transport must be one of {TRANSPORTS} ('auto': shared memory "
            f"where Triton can map it, else by value), got {transport!r}",
            model=model,
        )


def attempts(transport: str, memory: str) -> tuple[str, ...]:
    """The memories a pool tries, in order, for ``transport=`` and ``memory=``: where Triton
    cannot map one, the next (GPU memory falls back to system memory, then by value)."""
    if transport == INLINE:
        return (BY_VALUE,)
    shared = (CUDA, SYSTEM) if memory == CUDA else (SYSTEM,)
    return shared if transport == SHM else (*shared, BY_VALUE)


def node_name() -> str:
    """This host, as errors and reasons name it."""
    return socket.gethostname()


#: How to let Triton map this process's memory, by what was proven (:attr:`Unmappable.cause`).
_FIXES = {
    OTHER_DEV_SHM: "Run Triton where it shares /dev/shm with this process (the same host or pod; "
    "--ipc=host or a shared /dev/shm volume for containers)",
    OTHER_UID: "Run Triton and this process as the same uid (`docker run --user` on both, or "
    "the same securityContext.runAsUser)",
    None: "Run Triton where it shares /dev/shm with this process (the same host or pod; "
    "--ipc=host or a shared /dev/shm volume for containers), as the same uid",
}


def unreachable_error(
    model: str, url: str, reasons: Sequence[Unmappable | str]
) -> SharedMemoryUnreachableError:
    """The error of ``transport="shm"`` when Triton mapped no memory of this process: why
    (each reason, with Triton's own refusal), then what to do about what was proven."""
    node = node_name()
    refusals = [r.refusal for r in reasons if isinstance(r, Unmappable) and r.refusal]
    causes = {r.cause for r in reasons if isinstance(r, Unmappable) and r.cause}
    cause = causes.pop() if len(causes) == 1 else None
    reason = "; ".join(map(str, reasons))
    detail = "; ".join(str(r).strip().rstrip(".") for r in reasons)
    first = refusals[0] if refusals else None
    return SharedMemoryUnreachableError(
        f"model {model!r}: transport='shm', but Triton at {url} cannot map the shared memory "
        f"of this process on {node}: {detail}. {_FIXES[cause]}; or use transport='auto' to "
        "send the tensors by value there",
        node=node,
        reason=reason,
        status=None if first is None else first.status,
        server_message="" if first is None else first.server_message,
        model=model,
    )


def refusal_reason(url: str, key: str, refusal: BaseException, cause: str | None = None) -> str:
    """Why Triton's refusal to register ``key`` (a slot of a region made to try shared memory,
    removed once refused) means it cannot map this process's memory: ``cause`` where it was
    proven (:func:`unopenable_cause`)."""
    _, message = status_and_message(refusal)
    if cause == OTHER_DEV_SHM:
        why = (
            "it has another /dev/shm than this process (another host, container or mount "
            "namespace): it could not open a region readable by everyone either"
        )
    elif cause == OTHER_UID:
        why = (
            "it runs as another user than this process: it opened a region readable by "
            "everyone, not this process's own (mode 0600)"
        )
    else:
        why = (
            "it runs on another host, in another /dev/shm (a container, a mount namespace), or "
            "as a user that cannot open it"
        )
    return (
        f"Triton at {url} could not open /dev/shm/{key} ({message.strip() or refusal}; a slot "
        f"of the region made to try shared memory, removed since): {why}"
    )


def unopenable_cause(stub: Any, metadata: Any, timeout_s: float) -> str | None:
    """Why Triton could not open a region of this process (mode 0600): whether it opens one
    readable by everyone tells :data:`OTHER_UID` from :data:`OTHER_DEV_SHM` (``None``: it
    could not be told)."""
    try:
        refusal = region_refusal(stub, metadata, timeout_s, label="probe", mode=0o666)
    except Exception:  # Triton away, or /dev/shm full: the refusal says what it says
        return None
    if refusal is None:
        return OTHER_UID
    return OTHER_DEV_SHM if is_unopenable(refusal) else None


def region_refusal(
    stub: Any,
    metadata: Any,
    timeout_s: float,
    *,
    label: str,
    mode: int = 0o600,
    then: Callable[[str], object] | None = None,
) -> grpc.RpcError | None:
    """Whether Triton opens a region made here now: a small one of ``mode``, registered (and
    ``then`` called with its name while it is), then unregistered and removed.

    Returns:
        Triton's refusal, or ``None`` if it registered the region.
    """
    region = SharedMemoryRegion.create(new_region_name(label), _TRIAL_BYTES)
    try:
        os.chmod(SHM_DIR / region.name, mode)
        request = service_pb2.SystemSharedMemoryRegisterRequest(
            name=region.name, key=region.key, offset=0, byte_size=region.size
        )
        try:
            stub.SystemSharedMemoryRegister(request, metadata=metadata, timeout=timeout_s)
        except grpc.RpcError as exc:
            return exc
        try:
            if then is not None:
                then(region.name)
        finally:
            stub.SystemSharedMemoryUnregister(
                service_pb2.SystemSharedMemoryUnregisterRequest(name=region.name),
                metadata=metadata,
                timeout=timeout_s,
            )
        return None
    finally:
        region.close()
        region.unlink()


def probe(
    stub: Any,
    metadata: Any,
    memory: SlotMemory,
    spec: ModelSpec,
    key: str,
    url: str,
) -> str:
    """Proves that Triton maps the region it just registered as ``key`` (slot 0 of
    ``memory``, which nobody uses yet): a one-sample request of zeros, whose outputs must
    land in the slot over a random pattern written there first.

    Returns:
        Why the region counts as mapped: the proof, or why none could be had (the model
        refused the probe, or answered no output it writes into the slot), in which case
        Triton's opening a region of this unique name is the proof.

    Raises:
        Unmappable: Triton answered, and wrote none of its outputs into the region.
    """
    if spec.decoupled:  # answered only over a stream, and never into the slot
        return (
            f"Triton at {url} opened the region; a streaming model answers nothing into it, "
            "so its unique name is the proof"
        )
    views = memory.views(spec)[0]
    shapes = {t.name: tuple(1 if d == -1 else d for d in t.shape) for t in spec.inputs}
    written = []
    for tensor in spec.inputs:
        count = math.prod(shapes[tensor.name])  # one sample
        nbytes = count * (4 if tensor.is_bytes else tensor.dtype.itemsize)
        views.inputs[tensor.name].view(np.uint8)[:nbytes] = 0  # BYTES: empty elements
        written.append(nbytes)
    pattern = secrets.token_bytes(64)
    checked = [t for t in spec.outputs if not t.is_bytes and t.name not in spec.inline_outputs]
    for tensor in checked:
        place = views.outputs[tensor.name].view(np.uint8)
        place[:] = np.resize(np.frombuffer(pattern, np.uint8), place.size)
    requests = SlotRequests(spec, memory.layout, [key], [memory.offset(0)])
    rows = 1 if spec.batched else None
    request = requests.prepare(0, rows, shapes, written, PROBE_REQUEST_ID)
    try:
        response = stub.ModelInfer(request, metadata=metadata, timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError as exc:
        _, message = status_and_message(exc)
        return (
            f"Triton at {url} opened the region; a probe request could not run there "
            f"({message.strip()}), so its unique name is the proof"
        )
    compared = 0
    for output in response.outputs:
        found = spec.outputs_by_name.get(output.name)
        if found is None or found not in checked:
            continue
        place = views.outputs[found.name].view(np.uint8)
        nbytes = min(math.prod(output.shape) * found.dtype.itemsize, place.size)
        if nbytes == 0:
            continue
        compared += 1
        expected = np.resize(np.frombuffer(pattern, np.uint8), nbytes)
        if not np.array_equal(place[:nbytes], expected):
            return f"Triton at {url} mapped the region: a probe request's outputs landed in it"
    if compared:
        raise Unmappable(
            f"Triton at {url} registered the region, but a probe request's outputs never "
            "reached it: Triton opened another file of the same name (another /dev/shm)",
            cause=OTHER_DEV_SHM,
        )
    return (
        f"Triton at {url} opened the region; the model answers no output a probe can see "
        "land in it, so its unique name is the proof"
    )
