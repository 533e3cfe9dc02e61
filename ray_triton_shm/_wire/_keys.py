"""gRPC headers for Triton: its access keys, from code, files or the environment, kept out
of sight, and read again when they rotate.

Triton's restricted protocols (``--grpc-restricted-protocol=<protocols>:<key>=<value>``) want
the header ``triton-grpc-protocol-<key>: <value>`` on every call of those protocols. Those
values are secrets: nothing the library prints, raises, reports or pickles shows one
(:func:`redact`, :class:`Metadata`, :class:`Keys`).

Keys can come from a directory of key files, one file per header, as Kubernetes mounts a
Secret (:func:`headers_from_dir`; ``RAY_TRITON_SHM_KEYS_DIR`` names it). The kubelet updates
such a mount in place when the Secret changes, so :class:`Keys` reads the files again when
they change and when Triton refuses a key: keys rotate without restarting anyone. Keys can also
come from the environment, one variable per header (:func:`headers_from_env`)::

    RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_INFER_KEY=s3cret
    # -> triton-grpc-protocol-infer-key: s3cret
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "ENV_PREFIX",
    "GRPC_KEY_PREFIX",
    "KEYS_DIR_ENV_VAR",
    "REDACTED",
    "Keys",
    "KeysPlugin",
    "Metadata",
    "RedactedHeaders",
    "env_var_for",
    "headers_from_dir",
    "headers_from_env",
    "normalize",
    "redact",
]

logger = logging.getLogger(__name__)

#: Every environment variable named ``<ENV_PREFIX><NAME>`` is a header (see
#: :func:`headers_from_env`).
ENV_PREFIX = "RAY_TRITON_SHM_HEADER_"
#: How a restricted protocol's key is named over gRPC: ``triton-grpc-protocol-<key>``, where
#: the same key is ``<key>`` over HTTP (``--http-restricted-api``).
GRPC_KEY_PREFIX = "triton-grpc-protocol-"
#: The environment variable naming a directory of key files (see :func:`headers_from_dir`).
KEYS_DIR_ENV_VAR = "RAY_TRITON_SHM_KEYS_DIR"
#: The symlink through which the kubelet swaps a mounted Secret's files all at once.
_K8S_DATA = "..data"
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


def headers_from_dir(path: str | os.PathLike[str]) -> dict[str, str]:
    """The headers in a directory of key files, one file per header.

    A file's name is the header's name (``triton-grpc-protocol-infer-key``) or the variable
    :func:`headers_from_env` would read it from (``RAY_TRITON_SHM_HEADER_TRITON_GRPC_PROTOCOL_
    INFER_KEY``); its content, without surrounding whitespace, is the value. Names starting
    with ``.`` are skipped: a mounted Kubernetes Secret keeps its data in ``..data``, a
    symlink the kubelet swaps atomically on a change; the files are read again if it was
    swapped while they were read, so the headers always come from one version of the Secret.

    Args:
        path: The directory (a mounted Secret, ``docker secret``s, or plain files).

    Returns:
        ``{header name: value}``.

    Raises:
        OSError: the directory or one of its files cannot be read.
        ValueError: a file is not UTF-8 text (its value is never shown).
    """
    directory = Path(path)
    for _ in range(5):
        version = _data_version(directory)
        headers = {}
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            if entry.name.startswith(".") or not entry.is_file():
                continue
            try:
                value = Path(entry.path).read_text(encoding="utf-8").strip()
            except UnicodeDecodeError:
                raise ValueError(f"key file {entry.path} is not UTF-8 text") from None
            name = entry.name
            if name.upper().startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
                name = name[len(ENV_PREFIX) :].replace("_", "-")
            headers[name.lower()] = value
        if _data_version(directory) == version:
            return headers
    return headers


def _data_version(directory: Path) -> str | None:
    """Which version of a mounted Secret ``..data`` points at (``None``: not such a mount)."""
    try:
        return os.readlink(directory / _K8S_DATA)
    except OSError:
        return None


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


class RedactedHeaders(dict):  # type: ignore[type-arg]
    """A tritonclient call's headers, as a plugin leaves them (``request.headers``), whose repr
    shows no value: tritonclient sends their ``items()``, a :class:`Metadata`, and prints
    that in verbose mode."""

    def items(self) -> Metadata:  # type: ignore[override]
        return Metadata(super().items())

    def __repr__(self) -> str:
        return repr(dict.fromkeys(self, REDACTED))


class Keys:
    """The headers of a caller's calls, from code, key files and the environment, kept fresh.

    ``headers`` given in code win over key files, which win over the environment. The key
    files are read again at most every ``check_interval_s`` as calls ask for
    :meth:`metadata`, and at once when Triton refuses a key (:meth:`refused`): a rotated
    Kubernetes Secret is in use within about a second, without restarting anyone.

    A rotation reaches callers and Triton at different times: the kubelet updates the files
    of every pod within a minute or so, and Triton takes new keys only when it restarts. So
    the keys from before the last change are kept: while Triton refuses the new ones, calls
    use the old ones, and turn to the new ones when Triton refuses the old ones.

    Keys never leave the process: the repr shows only header names and pickling is refused
    (only configuration, the directory and the given headers, crosses a pickle boundary).

    Args:
        headers: Headers given in code (e.g. ``{"triton-grpc-protocol-infer-key": ...}``).
        keys_dir: A directory of key files (see :func:`headers_from_dir`); ``None`` reads
            ``$RAY_TRITON_SHM_KEYS_DIR`` (no key files if unset).
        environ: Also read ``RAY_TRITON_SHM_HEADER_*`` variables (see
            :func:`headers_from_env`).
        check_interval_s: How often the key files are looked at again.
        files: Read key files at all (``False``: none, whatever ``keys_dir`` and
            ``$RAY_TRITON_SHM_KEYS_DIR`` say: a tool's way on where they cannot be read).

    Raises:
        ValueError: ``keys_dir`` is not a readable directory of key files.
    """

    def __init__(
        self,
        headers: Mapping[str, str] | None = None,
        *,
        keys_dir: str | os.PathLike[str] | None = None,
        environ: bool = False,
        check_interval_s: float = 1.0,
        files: bool = True,
    ) -> None:
        self._given = normalize(headers)
        if keys_dir is None:
            keys_dir = os.environ.get(KEYS_DIR_ENV_VAR) or None
        if not files:
            keys_dir = None
        self.keys_dir = None if keys_dir is None else Path(keys_dir)
        self._env = headers_from_env() if environ else {}
        self._check_interval_s = check_interval_s
        self._lock = threading.Lock()
        self._files: dict[str, str] = {}
        if self.keys_dir is not None:
            try:
                self._files = headers_from_dir(self.keys_dir)
            except (OSError, ValueError) as exc:
                raise ValueError(
                    f"cannot read the key files in {self.keys_dir} (${KEYS_DIR_ENV_VAR} or "
                    f"keys_dir): {_reason(exc)}"
                ) from None
        self._next_check = time.monotonic() + check_interval_s
        self._current = self._merge(self._files)
        self._older: Metadata | None = None  # the keys before the last change of the files
        self._metadata = self._current  # the keys in use: the current ones, or the older

    def _merge(self, files: Mapping[str, str]) -> Metadata:
        return Metadata({**self._env, **files, **self._given}.items())

    @property
    def headers(self) -> dict[str, str]:
        """The headers now, values included: for the gRPC calls of this process only."""
        return dict(self.metadata())

    @property
    def names(self) -> list[str]:
        """The names of the headers now (fit to be shown)."""
        return sorted(name for name, _ in self.metadata())

    def metadata(self) -> Metadata:
        """The gRPC metadata of a call now; the key files are looked at again if it is time."""
        if self.keys_dir is not None and time.monotonic() >= self._next_check:
            self.refresh(blocking=False)
        return self._metadata

    def refresh(self, *, blocking: bool = True) -> bool:
        """Reads the key files again now (a refused key may have rotated).

        Args:
            blocking: Wait for a read already under way in another thread (else return).

        Returns:
            Whether the headers changed.
        """
        if self.keys_dir is None or not self._lock.acquire(blocking=blocking):
            return False
        try:
            self._next_check = time.monotonic() + self._check_interval_s
            try:
                files = headers_from_dir(self.keys_dir)
            except (OSError, ValueError) as exc:
                # The mount mid-change, or gone: the last keys stay in use.
                logger.warning(
                    "ray-triton-shm: cannot read the key files in %s (%s); keeping the last keys",
                    self.keys_dir,
                    _reason(exc),
                )
                return False
            if files == self._files:
                return False
            self._files = files
            self._older, self._current = self._current, self._merge(files)
            self._metadata = self._current
            logger.info(
                "ray-triton-shm: the key files in %s changed (%s)",
                self.keys_dir,
                ", ".join(sorted(files)) or "no keys",
            )
            return True
        finally:
            self._lock.release()

    def refused(self, used: Metadata) -> bool:
        """Triton refused a call made with ``used`` (from :meth:`metadata`): reads the key
        files again; if they did not change, turns from the current keys to those before
        the last change, or back (Triton may not have restarted with the new keys yet).

        Returns:
            Whether :meth:`metadata` now differs from ``used``: send the call once more.
        """
        self.refresh()
        with self._lock:
            if self._metadata == used and self._older is not None:
                turned = self._older if used == self._current else self._current
                if turned != used:
                    logger.info(
                        "ray-triton-shm: Triton refused the %s keys; using the %s ones",
                        *(("current", "older") if turned is self._older else ("older", "current")),
                    )
                self._metadata = turned
            return self._metadata != used

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "Keys hold secrets and are never pickled: pass the configuration (headers, "
            "keys_dir) and build Keys where they are used"
        )

    def __repr__(self) -> str:
        where = f" keys_dir={str(self.keys_dir)!r}" if self.keys_dir is not None else ""
        return f"<Keys {self.names}{where}>"


def _reason(exc: BaseException) -> str:
    """What went wrong reading key files, without any value (an ``OSError`` names a path)."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}"
    return str(exc)


class KeysPlugin:
    """A tritonclient plugin putting :class:`Keys` on every call of a plain tritonclient
    client (``client.register_plugin(KeysPlugin(keys))``); a call's own headers win."""

    def __init__(self, keys: Keys) -> None:
        self._keys = keys

    def __call__(self, request: Any) -> None:
        request.headers = RedactedHeaders(
            {**dict(self._keys.metadata()), **(request.headers or {})}
        )

    def __repr__(self) -> str:
        return f"KeysPlugin({self._keys!r})"
