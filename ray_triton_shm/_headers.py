"""gRPC headers for Triton: its access keys, read from the environment, kept out of sight.

Triton's restricted protocols (``--grpc-restricted-protocol=<protocols>:<key>=<value>``) want
the header ``triton-grpc-protocol-<key>: <value>`` on every call of those protocols. Those
values are secrets: nothing the library prints, raises or reports shows one (:func:`redact`).

Keys can come from the environment, one variable per header, so that a Kubernetes Secret maps
to one ``secretKeyRef`` per key and no secret travels in task arguments
(:func:`headers_from_env`)::

    RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_INFER_KEY=s3cret
    # -> triton-grpc-protocol-infer-key: s3cret
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "ENV_PREFIX",
    "REDACTED",
    "Metadata",
    "env_var_for",
    "headers_from_env",
    "normalize",
    "redact",
]

#: Every environment variable named ``<ENV_PREFIX><NAME>`` is a header (see
#: :func:`headers_from_env`).
ENV_PREFIX = "RAY_TRITON_SHM_HEADER_"
#: What a header's value is shown as.
REDACTED = "***"


def headers_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The headers set in the environment.

    Every variable ``RAY_TRITON_SHM_HEADER_<NAME>=value`` becomes the header ``<name>``:
    lowercased, with ``_`` turned into ``-``. So
    ``RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_INFER_KEY=s3cret`` is the header
    ``triton-grpc-protocol-infer-key: s3cret``.

    Args:
        environ: The environment to read (``os.environ`` by default).

    Returns:
        ``{header name: value}``, empty when no such variable is set.
    """
    headers = {}
    for variable, value in environ.items():
        if variable.startswith(ENV_PREFIX) and len(variable) > len(ENV_PREFIX):
            headers[variable[len(ENV_PREFIX) :].lower().replace("_", "-")] = value
    return headers


def env_var_for(header: str) -> str:
    """The environment variable :func:`headers_from_env` reads ``header`` from."""
    return ENV_PREFIX + header.upper().replace("-", "_")


def normalize(headers: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``headers`` with lowercased names (gRPC sends no other), checked to be text.

    Raises:
        TypeError: a name or a value is not a ``str`` (the message never shows a value).
    """
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a mapping of str to str, got {type(headers).__name__}")
    normalized = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(
                f"headers must be a mapping of str to str; got a {type(value).__name__} value "
                f"for the {type(name).__name__} name {name!r}"
            )
        normalized[name.lower()] = value
    return normalized


def redact(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` with every value replaced by ``"***"``: the names, fit to be shown."""
    return dict.fromkeys(headers or {}, REDACTED)


class Metadata(tuple):  # type: ignore[type-arg]
    """gRPC call metadata, ``((name, value), ...)``, whose repr shows no value.

    tritonclient prints a call's metadata in verbose mode; this is what it prints.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(tuple((name, REDACTED) for name, _ in self))
