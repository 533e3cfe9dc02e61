"""TLS to Triton: the CA, and the client's certificate and key for mutual TLS, from files that
are read again when they rotate.

cert-manager keeps a certificate in a Secret with the files ``ca.crt``, ``tls.crt`` and
``tls.key``; mounted into a pod, the kubelet updates them in place when the certificate is
renewed. gRPC reads credentials once, when a channel is made, so the client talks through a
:class:`ReloadingChannel`: it looks at the files again every ``check_interval_s`` as calls go,
and when they changed, makes a new channel for the calls that follow (calls in flight finish
on the old one). ``RAY_TRITON_SHM_TLS_DIR`` names such a directory for every caller of a node.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

__all__ = [
    "CA_FILE",
    "CERT_FILE",
    "KEY_FILE",
    "TLS_DIR_ENV_VAR",
    "ReloadingChannel",
    "TlsFiles",
    "diagnose",
    "may_be_tls",
]

logger = logging.getLogger(__name__)

#: The environment variable naming a directory of TLS files (see :meth:`TlsFiles.from_dir`).
TLS_DIR_ENV_VAR = "RAY_TRITON_SHM_TLS_DIR"
#: The names cert-manager (and ``kubernetes.io/tls`` Secrets) give the files.
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"

_Pem = tuple[bytes | None, bytes | None, bytes | None]
#: Words of a failed connection that TLS may be behind (Triton closing the socket during the
#: handshake, or gRPC's own handshake errors).
_TLS_SYMPTOMS = ("socket closed", "handshake", "ssl", "tls", "certificate")
#: The start of an HTTP/2 connection, and an empty SETTINGS frame: what a plain gRPC server
#: answers with a SETTINGS frame of its own.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
#: OpenSSL's words for a server's refusal of the client's certificate.
_REFUSED_CERTIFICATE = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "DECRYPT_ERROR")


@dataclass(frozen=True)
class TlsFiles:
    """Where the PEM files of a TLS client are: paths only, so it crosses any pickle.

    Args:
        root_certificates: The CA that signed Triton's certificate (``None``: the system's).
        private_key: The client's key, for mutual TLS.
        certificate_chain: The client's certificate, for mutual TLS.
    """

    root_certificates: Path | None = None
    private_key: Path | None = None
    certificate_chain: Path | None = None

    def __post_init__(self) -> None:
        if (self.private_key is None) != (self.certificate_chain is None):
            raise ValueError(
                "a client certificate needs its key: give private_key and certificate_chain "
                f"together (got private_key={self.private_key}, certificate_chain="
                f"{self.certificate_chain})"
            )

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> TlsFiles:
        """The files of a directory laid out as cert-manager's Secrets: ``ca.crt``, and
        ``tls.crt`` with ``tls.key`` for mutual TLS (each used if present).

        Raises:
            ValueError: the directory holds none of them, or a certificate without its key.
        """
        directory = Path(path)
        present = {name: directory / name for name in (CA_FILE, CERT_FILE, KEY_FILE)}
        present = {name: p for name, p in present.items() if p.is_file()}
        if not present:
            raise ValueError(
                f"{directory} holds no {CA_FILE}, {CERT_FILE} or {KEY_FILE} (${TLS_DIR_ENV_VAR})"
            )
        return cls(present.get(CA_FILE), present.get(KEY_FILE), present.get(CERT_FILE))

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], tls_dir: str | os.PathLike[str] | None
    ) -> TlsFiles | None:
        """The files a client is configured with: tritonclient's ``ssl=True`` with
        ``root_certificates``, ``private_key`` and ``certificate_chain`` (paths), else
        ``tls_dir``, else ``$RAY_TRITON_SHM_TLS_DIR``; ``None`` for a plain channel (or one
        whose ``creds`` the caller made)."""
        if options.get("creds") is not None:
            return None
        if options.get("ssl"):
            paths = [options.get(k) for k in ("root_certificates", "private_key")]
            paths.append(options.get("certificate_chain"))
            return cls(*(None if p is None else Path(p) for p in paths))
        directory = tls_dir if tls_dir is not None else os.environ.get(TLS_DIR_ENV_VAR)
        return cls.from_dir(directory) if directory else None

    @property
    def mutual(self) -> bool:
        """Whether a client certificate is presented."""
        return self.certificate_chain is not None

    def read(self) -> _Pem:
        """The files' contents.

        Raises:
            ValueError: a file cannot be read (named).
        """
        contents = []
        for path in (self.root_certificates, self.private_key, self.certificate_chain):
            try:
                contents.append(None if path is None else path.read_bytes())
            except OSError as exc:
                raise ValueError(f"cannot read the TLS file {path}: {exc.strerror}") from None
        return contents[0], contents[1], contents[2]


class ReloadingChannel(grpc.Channel):
    """A secure gRPC channel that is made anew when its TLS files change.

    Stubs made on it stay valid: each call goes to the channel current at that moment.

    Args:
        target: Triton's address.
        files: The TLS files.
        options: gRPC channel arguments.
        check_interval_s: How often the files are looked at again.
    """

    def __init__(
        self,
        target: str,
        files: TlsFiles,
        options: Sequence[tuple[str, Any]] = (),
        *,
        check_interval_s: float = 1.0,
    ) -> None:
        self._target = target
        self._files = files
        self._options = list(options)
        self._check_interval_s = check_interval_s
        self._lock = threading.Lock()
        self._pem = files.read()
        self._channel = self._make(self._pem)
        self._old: list[grpc.Channel] = []
        self._next_check = time.monotonic() + check_interval_s
        self._closed = False

    @property
    def files(self) -> TlsFiles:
        return self._files

    def _make(self, pem: _Pem) -> grpc.Channel:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pem[0], private_key=pem[1], certificate_chain=pem[2]
        )
        return grpc.secure_channel(self._target, credentials, options=self._options)

    def current(self) -> grpc.Channel:
        """The channel of the next call; the files are looked at again if it is time."""
        if time.monotonic() >= self._next_check:
            self.reload(blocking=False)
        return self._channel

    def reload(self, *, blocking: bool = True) -> bool:
        """Reads the files again now; makes a new channel if they changed.

        Returns:
            Whether the channel was made anew.
        """
        if self._closed or not self._lock.acquire(blocking=blocking):
            return False
        try:
            self._next_check = time.monotonic() + self._check_interval_s
            try:
                pem = self._files.read()
            except ValueError as exc:  # a mount mid-change, or gone: keep the channel
                logger.warning("ray-triton-shm: %s; keeping the current TLS channel", exc)
                return False
            if pem == self._pem:
                return False
            try:
                channel = self._make(pem)
            except Exception as exc:  # e.g. a key that does not match its certificate yet
                logger.warning("ray-triton-shm: the new TLS files are not usable yet: %s", exc)
                return False
            # Calls in flight on the old channel may still run: it is closed at the next change
            # (days later, as certificates go) or with this one.
            for older in self._old:
                older.close()
            self._old = [self._channel]
            self._pem, self._channel = pem, channel
            logger.info("ray-triton-shm: the TLS files changed; new connections use them")
            return True
        finally:
            self._lock.release()

    # grpc.Channel: every multi-callable resolves the current channel per call.

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Reloading(self, "unary_unary", method, args, kwargs)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Reloading(self, "unary_stream", method, args, kwargs)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Reloading(self, "stream_unary", method, args, kwargs)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Reloading(self, "stream_stream", method, args, kwargs)

    def subscribe(self, callback: Callable[..., Any], try_to_connect: bool = False) -> None:
        self.current().subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback: Callable[..., Any]) -> None:
        self._channel.unsubscribe(callback)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for channel in [*self._old, self._channel]:
                channel.close()
            self._old.clear()

    def __enter__(self) -> ReloadingChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mutual = ", mutual" if self._files.mutual else ""
        return f"<ReloadingChannel {self._target} TLS{mutual}>"


class _Reloading:
    """A multi-callable of :class:`ReloadingChannel`: made on the current channel, and again
    when the channel changed."""

    __slots__ = ("_args", "_bound", "_callable", "_kind", "_kwargs", "_method", "_owner")

    def __init__(
        self,
        owner: ReloadingChannel,
        kind: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self._owner, self._kind, self._method = owner, kind, method
        self._args, self._kwargs = args, kwargs
        self._bound: grpc.Channel | None = None
        self._callable: Any = None

    def _resolve(self) -> Any:
        channel = self._owner.current()
        if channel is not self._bound:
            made = getattr(channel, self._kind)(self._method, *self._args, **self._kwargs)
            self._bound, self._callable = channel, made
            return made
        return self._callable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve()(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve().future(*args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve().with_call(*args, **kwargs)


def may_be_tls(exc: BaseException) -> bool:
    """Whether a failed connection's error may come from TLS (see :func:`diagnose`)."""
    message = str(exc).lower()
    details = getattr(exc, "details", None)
    if callable(details):
        message += " " + str(details() or "").lower()
    return any(word in message for word in _TLS_SYMPTOMS)


def diagnose(target: str, files: TlsFiles | None, timeout_s: float = 2.0) -> tuple[str, str] | None:
    """Whether TLS is why connections to ``target`` fail, found with a handshake of our own.

    Args:
        target: Triton's address, ``host:port``.
        files: The client's TLS files; ``None`` for a client that speaks plain gRPC.
        timeout_s: The longest wait for each step.

    Returns:
        ``(reason, what to do)`` (see :class:`TLSHandshakeError`), or ``None`` if TLS is not
        the problem (nothing listens there: Triton is down or restarting; or the handshake
        works).
    """
    host, _, port = target.rpartition(":")
    host = host.strip("[]") or "localhost"
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    except (OSError, ValueError):
        return None
    with sock:
        if files is None:
            return _plain_client(sock, host)
        try:
            context = _context(files)
        except (OSError, ssl.SSLError, ValueError) as exc:
            return "handshake_failed", f"the TLS files cannot be used: {exc}"
        return _tls_client(sock, host, context, files, (host, int(port)), timeout_s)


def _plain_client(sock: socket.socket, host: str) -> tuple[str, str] | None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        context.wrap_socket(sock, server_hostname=host).close()
    except ssl.SSLError as exc:
        if "CERTIFICATE_REQUIRED" not in str(exc):
            return None
    except OSError:
        return None
    return (
        "tls_required",
        "Triton speaks TLS (--grpc-use-ssl) and this client does not: set "
        f"${TLS_DIR_ENV_VAR} to a directory with {CA_FILE} (and {CERT_FILE}, {KEY_FILE} for "
        "mutual TLS), or pass ssl=True, root_certificates=... (and private_key=..., "
        "certificate_chain=...)",
    )


def _context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.set_alpn_protocols(["h2"])
    if files.root_certificates is not None:
        context.load_verify_locations(cafile=str(files.root_certificates))
    else:
        context.load_default_certs()
    if files.certificate_chain is not None and files.private_key is not None:
        context.load_cert_chain(str(files.certificate_chain), str(files.private_key))
    return context


def _tls_client(
    sock: socket.socket,
    host: str,
    context: ssl.SSLContext,
    files: TlsFiles,
    address: tuple[str, int],
    timeout_s: float,
) -> tuple[str, str] | None:
    try:
        tls = context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        return (
            "server_certificate_untrusted",
            f"this client does not trust Triton's certificate ({exc.verify_message}): its CA "
            f"({files.root_certificates or 'the system CAs'}) did not sign it",
        )
    except ssl.SSLError as exc:
        return _refusal(str(exc), files)
    except OSError:  # closed during the handshake: a plain server, or one going away
        return _plain_server(address, timeout_s)
    with tls:
        # With TLS 1.3 the server judges the client's certificate after the handshake: its
        # verdict is the first thing it sends (else its HTTP/2 SETTINGS frame).
        try:
            tls.settimeout(timeout_s)
            first = tls.recv(1)
        except ssl.SSLError as exc:
            return _refusal(str(exc), files)
        except OSError:
            return None
    if first:
        return None
    # Closed right after the handshake, without a word (gRPC sends no alert): refused.
    return _refusal("BAD_CERTIFICATE" if files.mutual else "CERTIFICATE_REQUIRED", files)


def _refusal(message: str, files: TlsFiles) -> tuple[str, str]:
    if "CERTIFICATE_REQUIRED" in message or ("HANDSHAKE_FAILURE" in message and not files.mutual):
        return (
            "client_certificate_required",
            "Triton wants a client certificate (mutual TLS, --grpc-use-ssl-mutual) and this "
            f"client has none: add {CERT_FILE} and {KEY_FILE} beside {CA_FILE} in "
            f"${TLS_DIR_ENV_VAR}, or pass private_key=... and certificate_chain=...",
        )
    if any(word in message for word in _REFUSED_CERTIFICATE):
        return (
            "client_certificate_refused",
            f"Triton refused this client's certificate ({files.certificate_chain}): the CA "
            "Triton trusts (--grpc-root-cert) did not sign it, or it expired",
        )
    return "handshake_failed", f"the TLS handshake with Triton failed: {message}"


def _plain_server(address: tuple[str, int], timeout_s: float) -> tuple[str, str] | None:
    try:
        with socket.create_connection(address, timeout=timeout_s) as sock:
            sock.sendall(_H2_PREFACE)
            answer = sock.recv(9)
    except OSError:
        return None
    if len(answer) == 9 and answer[3] == 0x04:  # a SETTINGS frame: plain HTTP/2
        return (
            "plain_server",
            "Triton does not speak TLS there (started without --grpc-use-ssl) and this client "
            "does: drop ssl=True and $RAY_TRITON_SHM_TLS_DIR, or start Triton with TLS",
        )
    return None
