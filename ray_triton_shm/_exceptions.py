"""Every error the library raises, in one tree.

::

    TritonSHMError
    ├── InvalidInputError (ValueError)         bad tensors, raised before any byte is written
    ├── ModelSpecError (ValueError)            specs that cannot be turned into a slot layout
    ├── ModelNotRegisteredError (LookupError)  infer on a model never registered
    ├── StaleLeaseError (LookupError)          the Ray node actor restarted: bind again
    ├── SlotTimeoutError (TimeoutError)        no slot became free within ``timeout_s``
    ├── OverloadedError (RuntimeError)         too many callers already waiting
    ├── ClientClosedError (RuntimeError)       the client or pool was closed
    ├── LocalServerError (RuntimeError)        the embedded Triton could not be set up or started
    └── TritonServerError (RuntimeError)       Triton answered with an error; keeps its status
        └── SharedMemoryNotAllowedError        the server refuses client shared memory

Every exception survives a :mod:`pickle` round trip with its attributes, because Ray ships
exceptions between processes.
"""

from __future__ import annotations

from errno import ENOSPC
from typing import Any

__all__ = [
    "ClientClosedError",
    "InvalidInputError",
    "LocalServerError",
    "ModelNotRegisteredError",
    "ModelSpecError",
    "OverloadedError",
    "ServerUnreachableError",
    "SharedMemoryFullError",
    "SharedMemoryNotAllowedError",
    "SlotTimeoutError",
    "StaleLeaseError",
    "TritonSHMError",
    "TritonServerError",
]


class TritonSHMError(Exception):
    """Base class of every error raised by ``ray_triton_shm``.

    Args:
        message: Human-readable description.
        **context: Structured details (model, tensor, expected, actual, status, ...) kept as
            attributes so callers can react without parsing the message.
    """

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in context.items():
            setattr(self, key, value)

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

    model: str
    tensor: str | None
    expected: Any
    actual: Any

    def __init__(
        self,
        message: str,
        *,
        model: str = "",
        tensor: str | None = None,
        expected: Any = None,
        actual: Any = None,
    ) -> None:
        super().__init__(message, model=model, tensor=tensor, expected=expected, actual=actual)


class ModelSpecError(TritonSHMError, ValueError):
    """Specs given to, or read by, ``register_shm_model`` cannot be used.

    Examples: a ``-1`` dimension without a maximum, a tensor named twice, or a model registered
    again with different specs.
    """


class ModelNotRegisteredError(TritonSHMError, LookupError):
    """Inference was requested for a model that has no shared-memory pool."""


class StaleLeaseError(TritonSHMError, LookupError):
    """The Ray node actor restarted since this process bound to it; its slots are gone.

    ``ShmModel`` binds again and retries once when it sees this.
    """


class SlotTimeoutError(TritonSHMError, TimeoutError):
    """No slot of the model's pool became free within the timeout."""


class OverloadedError(TritonSHMError, RuntimeError):
    """More callers are already waiting for a slot than the configured limit allows."""


class ClientClosedError(TritonSHMError, RuntimeError):
    """The client, or the pool being waited on, was closed."""


class SharedMemoryFullError(TritonSHMError, OSError):
    """``/dev/shm`` has no room for a region; raised before anything is created.

    Its ``errno`` is ``ENOSPC``, as for the ``OSError`` it replaces.

    Attributes:
        model: The model whose pool did not fit.
        needed: Bytes the region needs.
        free: Bytes free in ``/dev/shm``.
    """

    errno = ENOSPC
    model: str
    needed: int
    free: int

    def __init__(self, message: str, *, model: str = "", needed: int = 0, free: int = 0) -> None:
        super().__init__(message, model=model, needed=needed, free=free)


class LocalServerError(TritonSHMError, RuntimeError):
    """The embedded local Triton server could not be found, installed, started or stopped."""


class TritonServerError(TritonSHMError, RuntimeError):
    """Triton answered a request with an error.

    Attributes:
        status: The gRPC status name Triton answered with (e.g. ``"StatusCode.INVALID_ARGUMENT"``),
            or ``None`` when unknown.
        server_message: Triton's own message, unchanged.
        model: The model concerned, when there is one.
    """

    status: str | None
    server_message: str
    model: str | None

    def __init__(
        self,
        message: str,
        *,
        status: str | None = None,
        server_message: str = "",
        model: str | None = None,
    ) -> None:
        super().__init__(message, status=status, server_message=server_message, model=model)


class SharedMemoryNotAllowedError(TritonServerError):
    """The server refuses client shared memory.

    Newer Triton releases only accept client shared memory when started with
    ``--allow-client-shm=true`` (or an equivalent setting).
    """


class ServerUnreachableError(TritonServerError, ConnectionError):
    """Triton could not be reached at its address, and did not come back within
    ``reconnect_timeout_s`` (``0``: not waited for).

    Attributes:
        url: The address tried.
        waited_s: How long the request waited for Triton.
    """

    url: str
    waited_s: float

    def __init__(
        self,
        message: str,
        *,
        url: str = "",
        waited_s: float = 0.0,
        status: str | None = None,
        server_message: str = "",
        model: str | None = None,
    ) -> None:
        super().__init__(message, status=status, server_message=server_message, model=model)
        self.url = url
        self.waited_s = waited_s
