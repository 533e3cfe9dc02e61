"""Every error the library raises, in one tree.

::

    TritonSHMError
    ├── InvalidInputError (ValueError)         bad tensors, raised before any byte is written
    │   └── StreamingModelError                a unary call on a streaming (decoupled) model,
    │                                          or stream() on a model that is not one
    ├── ModelSpecError (ValueError)            specs that cannot be turned into a slot layout
    ├── ModelNotRegisteredError (LookupError)  infer on a model never registered
    ├── RegionReplacedError (LookupError)      the region a process bound to is gone or was
    │                                          replaced (node actor restart, new layout)
    ├── ForeignRegionError (RuntimeError)      a region whose header is not of this version's
    │                                          layout (another version made it, or something
    │                                          wrote over it); names both versions
    ├── SlotTimeoutError (TimeoutError)        no slot became free within ``slot_timeout_s``
    ├── OverloadedError (RuntimeError)         too many callers already waiting
    ├── ClientClosedError (RuntimeError)       the client or pool was closed
    ├── BlockingCallError (RuntimeError)       a blocking call on a thread that runs an
    │                                          event loop (use the ``_async`` twin)
    ├── SharedMemoryFullError (OSError)        /dev/shm has no room for a pool (errno ENOSPC)
    ├── CudaError (RuntimeError)               GPU memory cannot be used here: no GPU or
    │   │                                      driver, no CUDA bindings, a GPU not visible
    │   └── GPUMemoryFullError (MemoryError)   the GPU has no room for a pool
    ├── LocalServerError (RuntimeError)        the embedded Triton could not be set up or started
    └── TritonServerError (RuntimeError)       Triton answered with an error; keeps its status
        ├── ModelChangedError (ValueError)     the model's config on Triton no longer matches
        │                                      the specs given by hand; names what changed
        ├── ModelNotLoadedError (LookupError)  the model is not loaded on Triton (unloaded,
        │                                      or failed to load)
        ├── SharedMemoryNotAllowedError        the server refuses client shared memory
        ├── SharedMemoryUnreachableError       ``transport="shm"``, and Triton cannot map this
        │   │                                  process's shared memory (names node and why)
        │   └── LeaseByValueError              a lease on a model by value (an
        │       (InvalidInputError)            InvalidInputError too, as it was before)
        ├── AccessDeniedError                  a restricted protocol, and the request lacked
        │   (PermissionError)                  its key; names the header Triton expects
        ├── ServerUnreachableError             Triton stayed unreachable for
        │   (ConnectionError)                  ``reconnect_timeout_s``
        ├── StreamInterruptedError             a stream ended before its final response
        │   (ConnectionError)                  (Triton went away, a deadline): says how many
        │                                      responses it delivered
        └── TLSHandshakeError                  TLS stands between client and Triton (no
            (ConnectionError)                  client certificate, an untrusted one...)

Details are typed attributes (``model`` on every error; ``tensor``, ``expected``, ``actual``,
``status``... where they apply), so callers can react without parsing the message. Every
exception survives a :mod:`pickle` round trip with its attributes, because Ray ships exceptions
between processes.
"""

from __future__ import annotations

import warnings
from errno import EACCES, ENOSPC
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "AccessDeniedError",
    "BlockingCallError",
    "ClientClosedError",
    "CudaError",
    "ForeignRegionError",
    "GPUMemoryFullError",
    "InvalidInputError",
    "LeaseByValueError",
    "LocalServerError",
    "ModelChangedError",
    "ModelNotLoadedError",
    "ModelNotRegisteredError",
    "ModelSpecError",
    "OverloadedError",
    "RegionReplacedError",
    "ServerUnreachableError",
    "SharedMemoryFullError",
    "SharedMemoryNotAllowedError",
    "SharedMemoryUnreachableError",
    "SlotTimeoutError",
    "StreamInterruptedError",
    "StreamingModelError",
    "TLSHandshakeError",
    "TritonSHMError",
    "TritonServerError",
]


class TritonSHMError(Exception):
    """Base class of every error raised by ``ray_triton_shm``.

    Attributes:
        message: Human-readable description.
        model: The model concerned, when there is one.
    """

    def __init__(self, message: str, *, model: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.model = model

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from the message and restore every attribute: survives pickle for subclasses
        # whose __init__ takes more arguments.
        return (_rebuild, (type(self), self.message, self.__dict__))


def _rebuild(cls: type[TritonSHMError], message: str, state: dict[str, Any]) -> TritonSHMError:
    # OSError subclasses must be made by OSError.__new__, which any other base refuses to do.
    error = (OSError.__new__ if issubclass(cls, OSError) else Exception.__new__)(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class InvalidInputError(TritonSHMError, ValueError):
    """An input does not match what the model was registered with.

    Attributes:
        model: The model name.
        tensor: The tensor name (``None`` when the whole input mapping is wrong).
        expected: What was expected.
        actual: What was given.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        tensor: str | None = None,
        expected: Any = None,
        actual: Any = None,
    ) -> None:
        super().__init__(message, model=model)
        self.tensor = tensor
        self.expected = expected
        self.actual = actual


class StreamingModelError(InvalidInputError):
    """A call does not fit how the model answers: ``infer_shm`` (or a lease) on a streaming
    model (Triton's ``decoupled`` transaction policy: it answers only over a stream; call
    ``stream()``), or ``stream()`` on a model that answers each request once (call
    ``infer_shm``). Raised before any slot is taken.

    Attributes:
        expected: How the call needs the model to answer (``"decoupled"`` or ``"unary"``).
        actual: How it answers.
    """


class ModelSpecError(TritonSHMError, ValueError):
    """Specs given to, or read by, ``register_shm_model`` cannot be used.

    Examples: a ``-1`` dimension without a maximum, a tensor named twice, or a model registered
    again with different specs.

    Attributes:
        tensor: The tensor concerned, when there is one.
    """

    def __init__(
        self, message: str, *, model: str | None = None, tensor: str | None = None
    ) -> None:
        super().__init__(message, model=model)
        self.tensor = tensor


class ModelNotRegisteredError(TritonSHMError, LookupError):
    """Inference was requested for a model that has no shared-memory pool."""


class RegionReplacedError(TritonSHMError, LookupError):
    """The region this process bound to is gone or was replaced: the Ray node actor restarted
    (its regions with it), or it laid the model's pool out anew.

    ``ShmModel`` binds again and retries when it sees this. (``StaleLeaseError``, its earlier
    name, still works as a deprecated alias.)

    Attributes:
        incarnation: The actor incarnation the caller bound to.
    """

    def __init__(
        self, message: str, *, model: str | None = None, incarnation: str | None = None
    ) -> None:
        super().__init__(message, model=model)
        self.incarnation = incarnation


class ForeignRegionError(TritonSHMError, RuntimeError):
    """A region's header is not of this version's layout: its magic word or its layout
    version is another's. Another version of the library made it (a rolling upgrade: the node
    actor and its callers of different versions), or something other than the library wrote
    over it in ``/dev/shm``. Nothing is read from such a region, and no slot of it is used;
    the message names both versions and what to do. ``ray-triton-shm status`` marks such
    regions ``foreign``.

    Attributes:
        region: The region's name.
        version: The layout version its header says (``None``: it bears no stamp of this
            library's).
        expected_version: This version's layout version.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        region: str = "",
        version: int | None = None,
        expected_version: int = 0,
    ) -> None:
        super().__init__(message, model=model)
        self.region = region
        self.version = version
        self.expected_version = expected_version


class SlotTimeoutError(TritonSHMError, TimeoutError):
    """No slot of the model's pool became free within the timeout.

    Attributes:
        timeout_s: How long the caller waited.
    """

    def __init__(
        self, message: str, *, model: str | None = None, timeout_s: float | None = None
    ) -> None:
        super().__init__(message, model=model)
        self.timeout_s = timeout_s


class OverloadedError(TritonSHMError, RuntimeError):
    """More callers are already waiting for a slot than the configured limit allows."""


class ClientClosedError(TritonSHMError, RuntimeError):
    """The client, or the pool being waited on, was closed."""


class BlockingCallError(TritonSHMError, RuntimeError):
    """A blocking call was made on a thread that runs an asyncio event loop (an ``async def``
    Serve method): it would stop every other request of that loop until it returned. Await its
    ``_async`` twin instead, as Ray Serve's ``DeploymentHandle.result()`` asks for ``await``.
    """


class SharedMemoryFullError(TritonSHMError, OSError):
    """``/dev/shm`` has no room for a region; raised before anything is created.

    Its ``errno`` is ``ENOSPC``, as for the ``OSError`` it replaces.

    Attributes:
        model: The model whose pool did not fit.
        needed: Bytes the region needs.
        free: Bytes free in ``/dev/shm``.
    """

    errno = ENOSPC

    def __init__(
        self, message: str, *, model: str | None = None, needed: int = 0, free: int = 0
    ) -> None:
        super().__init__(message, model=model)
        self.needed = needed
        self.free = free


class CudaError(TritonSHMError, RuntimeError):
    """A pool in GPU memory (``memory="cuda"``) cannot be made or used here: no NVIDIA driver
    or GPU, the CUDA bindings missing (``pip install "ray-triton-shm[cuda]"``), a driver older
    than they need, a GPU this process does not see, or a CUDA call that failed.

    Raised before anything is left behind: no GPU memory, registration or slot.

    Attributes:
        cuda_error: The CUDA error's name (``"cudaErrorInsufficientDriver"``...), if one.
        device: The GPU concerned (its UUID), if one.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        cuda_error: str | None = None,
        device: str | None = None,
    ) -> None:
        super().__init__(message, model=model)
        self.cuda_error = cuda_error
        self.device = device


class GPUMemoryFullError(CudaError, MemoryError):
    """The GPU has no room for a pool's slots; raised before anything is left behind.

    Attributes:
        needed: Bytes the pool needs on the GPU.
        free: Bytes free on the GPU when it was tried.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        device: str | None = None,
        needed: int = 0,
        free: int = 0,
    ) -> None:
        super().__init__(
            message, model=model, cuda_error="cudaErrorMemoryAllocation", device=device
        )
        self.needed = needed
        self.free = free


class LocalServerError(TritonSHMError, RuntimeError):
    """The embedded local Triton server could not be found, installed, started or stopped."""


class TritonServerError(TritonSHMError, RuntimeError):
    """Triton answered a request with an error.

    Every subclass takes ``status``, ``server_message`` and ``model`` as keywords too (its
    ``**answer``), after its own.

    Attributes:
        status: The gRPC status name Triton answered with (e.g. ``"StatusCode.INVALID_ARGUMENT"``),
            or ``None`` when unknown.
        server_message: Triton's own message, unchanged.
        model: The model concerned, when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: str | None = None,
        server_message: str = "",
        model: str | None = None,
    ) -> None:
        super().__init__(message, model=model)
        self.status = status
        self.server_message = server_message


class _Answer(TypedDict, total=False):
    """What a :class:`TritonServerError` keeps of Triton's answer, as its subclasses take it."""

    status: str | None
    server_message: str
    model: str | None


class ModelChangedError(TritonServerError, ValueError):
    """The model's configuration on Triton no longer matches the pool's specs.

    A pool whose specs came from Triton's configuration follows the model on its own and never
    raises this; one registered with specs given by hand does, naming what changed. Register
    it again with the new specs (``register_shm_model(..., replace=True)``, or
    ``ShmModel.reregister(...)``), or leave the specs to Triton so that the pool follows.

    Attributes:
        tensor: The first tensor that differs (``None`` for ``max_batch_size``).
        registered: What the pool was registered with, e.g. ``"FP32 (16,)"``.
        current: What Triton's configuration says now.
    """

    #: Whether Triton ran the request (it answered, with outputs that did not fit the specs):
    #: a sequence step is then not sent again.
    _executed = False

    def __init__(
        self,
        message: str,
        *,
        tensor: str | None = None,
        registered: str = "",
        current: str = "",
        **answer: Unpack[_Answer],
    ) -> None:
        super().__init__(message, **answer)
        self.tensor = tensor
        self.registered = registered
        self.current = current


class ModelNotLoadedError(TritonServerError, LookupError):
    """Triton is up, but the model is not loaded (unloaded, not loaded yet, or it failed to
    load). Raised at once, without waiting ``reconnect_timeout_s``; once the model is loaded
    again, calls work with no new registration."""


class SharedMemoryNotAllowedError(TritonServerError):
    """The server refuses client shared memory.

    Newer Triton releases only accept client shared memory when started with
    ``--allow-client-shm=true`` (or an equivalent setting).
    """


class SharedMemoryUnreachableError(TritonServerError):
    """``transport="shm"`` was asked for, and Triton cannot map this process's shared memory:
    it runs on another host, in a container with another ``/dev/shm``, or as a user that
    cannot open the region. With ``transport="auto"`` (the default) the model sends its
    tensors by value instead.

    Attributes:
        node: The host (and Ray node, in the Ray layer) whose memory Triton cannot map.
        reason: What proved it (Triton's refusal, or a probe request).
    """

    def __init__(
        self, message: str, *, node: str = "", reason: str = "", **answer: Unpack[_Answer]
    ) -> None:
        super().__init__(message, **answer)
        self.node = node
        self.reason = reason


class LeaseByValueError(SharedMemoryUnreachableError, InvalidInputError):
    """A lease was asked of a model that sends its tensors by value: a lease writes into shared
    memory Triton maps, and Triton cannot map this process's (its reason is ``reason``). Call
    ``infer_shm()`` there, or run Triton where it shares ``/dev/shm`` with this process.

    An :class:`InvalidInputError` too, as this was raised before: ``except InvalidInputError``
    still catches it (its ``tensor`` is ``None``).

    Attributes:
        node: The host whose memory Triton cannot map.
        reason: Why the model sends its tensors by value (its ``transport_reason``).
        expected: ``"transport 'shm'"``.
        actual: The model's transport, ``"inline"``.
    """

    def __init__(
        self,
        message: str,
        *,
        node: str = "",
        reason: str = "",
        model: str | None = None,
        expected: Any = None,
        actual: Any = None,
    ) -> None:
        super().__init__(message, node=node, reason=reason, model=model)
        self.expected = expected
        self.actual = actual


class AccessDeniedError(TritonServerError, PermissionError):
    """Triton refused the request: its protocol is restricted (``--grpc-restricted-protocol``)
    and the request did not carry the right key.

    Raised at once, never retried. The message names the header Triton expects, never a value.
    Its ``errno`` is ``EACCES``.

    Attributes:
        header: The header Triton expects, e.g. ``"triton-grpc-protocol-admin-key"``.
    """

    errno = EACCES

    def __init__(self, message: str, *, header: str = "", **answer: Unpack[_Answer]) -> None:
        super().__init__(message, **answer)
        self.header = header


class ServerUnreachableError(TritonServerError, ConnectionError):
    """Triton could not be reached at its address, and did not come back within
    ``reconnect_timeout_s`` (``0``: not waited for).

    Attributes:
        url: The address tried.
        waited_s: How long the request waited for Triton.
    """

    def __init__(
        self, message: str, *, url: str = "", waited_s: float = 0.0, **answer: Unpack[_Answer]
    ) -> None:
        super().__init__(message, **answer)
        self.url = url
        self.waited_s = waited_s


class StreamInterruptedError(TritonServerError, ConnectionError):
    """A stream ended before Triton's final response: Triton went away (a crash, a restart),
    the connection was lost, or no response came within ``client_timeout_s``. A stream is
    never sent again once a response was delivered (it would deliver them twice).

    Attributes:
        delivered: The responses delivered before it ended.
    """

    def __init__(self, message: str, *, delivered: int = 0, **answer: Unpack[_Answer]) -> None:
        super().__init__(message, **answer)
        self.delivered = delivered


class TLSHandshakeError(TritonServerError, ConnectionError):
    """Triton is there, but the TLS handshake with it fails for a reason waiting does not fix.

    Raised at once instead of waiting ``reconnect_timeout_s``; the message says what is
    missing or refused, and how to fix it.

    Attributes:
        url: Triton's address.
        reason: Which: ``"tls_required"`` (Triton speaks TLS, the client does not),
            ``"plain_server"`` (the reverse), ``"client_certificate_required"`` (mutual TLS,
            and the client has no certificate), ``"client_certificate_refused"`` (one Triton's
            CA did not sign), ``"server_certificate_untrusted"`` (the client's CA did not sign
            Triton's certificate), or ``"handshake_failed"``.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str = "",
        reason: str = "handshake_failed",
        **answer: Unpack[_Answer],
    ) -> None:
        super().__init__(message, **answer)
        self.url = url
        self.reason = reason


#: The kinds failed calls are counted by (the ``kind`` of the ``errors`` metric).
ERROR_KINDS = (
    "overloaded",
    "deadline",
    "access_denied",
    "tls",
    "unavailable",
    "model_changed",
    "bad_input",
    "other",
)
_KINDS: tuple[tuple[type[TritonSHMError], str], ...] = (
    (OverloadedError, "overloaded"),
    (SlotTimeoutError, "deadline"),
    (AccessDeniedError, "access_denied"),
    (TLSHandshakeError, "tls"),
    (ServerUnreachableError, "unavailable"),
    (ModelChangedError, "model_changed"),
    (InvalidInputError, "bad_input"),
)


def error_kind(exc: TritonSHMError) -> str:
    """Which of :data:`ERROR_KINDS` a failed call's error is."""
    for cls, kind in _KINDS:
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, TritonServerError) and exc.status == "StatusCode.DEADLINE_EXCEEDED":
        return "deadline"
    return "other"


#: Names of earlier releases that still work, with a :class:`DeprecationWarning`: the name
#: each stands for now.
DEPRECATED_NAMES = {"StaleLeaseError": "RegionReplacedError"}


def deprecated_name(module: str, name: str) -> Any:
    """A module's ``__getattr__`` for :data:`DEPRECATED_NAMES`: warns, and gives the new
    class.

    Raises:
        AttributeError: ``name`` is not a deprecated name of ``module``.
    """
    new = DEPRECATED_NAMES.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is deprecated: it is {new} now (raised for node actor restarts and "
        "new layouts alike)",
        DeprecationWarning,
        stacklevel=3,
    )
    return globals()[new]


def __getattr__(name: str) -> Any:
    return deprecated_name(__name__, name)
