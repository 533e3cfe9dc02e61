"""What the embedded Triton serves and how: its model repositories, its ports, its
restrictions and TLS files, and the ``tritonserver`` command line they make.

:class:`ServerConfig` is what a :class:`~._server.LocalTritonServer` was asked for, checked;
its ports are picked here (free loopback ports, the HTTP port beside the gRPC one where
both are free to choose). :class:`Served` is what one start resolved (the binary, the
repositories as served, the backend directory), and :meth:`ServerConfig.command` the command
line of both. No process is started here.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._exceptions import LocalServerError

__all__ = [
    "DEFAULT_PYTHON_SHM_DEFAULT_BYTE_SIZE",
    "DEFAULT_PYTHON_SHM_GROWTH_BYTE_SIZE",
    "EXAMPLE_MODEL_REPOSITORY",
    "RESTRICTABLE_PROTOCOLS",
    "Restriction",
    "Served",
    "ServerConfig",
    "free_ports",
    "parse_restrictions",
    "port_is_free",
    "shown",
]

#: The example model repository that ships with the package (Python-backend models).
EXAMPLE_MODEL_REPOSITORY: Path = Path(__file__).resolve().parent / "models"

#: Default size of each Python-backend model instance's shared-memory pool.
DEFAULT_PYTHON_SHM_DEFAULT_BYTE_SIZE = 16 * 1024 * 1024
#: Default growth step of the Python-backend shared-memory pools; large enough that one
#: growth step fits a batch of two 3x1024x1024 FP32 inputs plus their outputs (~50 MB).
DEFAULT_PYTHON_SHM_GROWTH_BYTE_SIZE = 64 * 1024 * 1024

#: What Triton can restrict (``--grpc-restricted-protocol``, ``--http-restricted-api``).
RESTRICTABLE_PROTOCOLS: tuple[str, ...] = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
#: A restriction: the protocols it covers, the key and the value callers must send.
Restriction = tuple[tuple[str, ...], str, str]

_PORT_NAMES = ("grpc", "http", "metrics")
#: How long a taken fixed port is waited for (a previous server of ours still stopping).
_PORT_WAIT_S = 5.0
#: gRPC sends lowercase header names only.
_KEY_RE = re.compile(r"[0-9a-z][0-9a-z_.-]*")
#: A restriction on Triton's command line, up to its value (shown as ``***`` in the log).
_RESTRICTION_ARG_RE = re.compile(r"^(--(?:grpc-restricted-protocol|http-restricted-api)=[^=]*=).*")


def free_ports(host: str, count: int) -> list[int]:
    """Pick ``count`` distinct free TCP ports on ``host``."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _free_pair(host: str, taken: set[int | None]) -> tuple[int, int]:
    """A free port whose port below is free too: ``(grpc, http)``."""
    for _ in range(64):
        (port,) = free_ports(host, 1)
        if port - 1 > 0 and taken.isdisjoint((port, port - 1)) and port_is_free(host, port - 1):
            return port, port - 1
    first, second = free_ports(host, 2)  # a crowded machine: no such pair found
    return first, second


def port_is_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` (with SO_REUSEADDR, as servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _port_or_none(name: str, port: int | None) -> int | None:
    """A port as given, ``None`` for any free one (0 says so too)."""
    if port is None or port == 0:
        return None
    if not 0 < port < 65536:
        raise ValueError(f"{name} must be a TCP port (1-65535, or 0 or None for a free one)")
    return int(port)


def parse_restrictions(
    restricted_protocols: Mapping[str, tuple[str, str]] | None,
) -> tuple[Restriction, ...]:
    """``(protocols, key, value)`` per restriction, checked; errors never show a value.

    Raises:
        ValueError: an unknown protocol, one restricted twice, a malformed key or value.
    """
    checked: list[Restriction] = []
    restricted: set[str] = set()
    values: dict[str, str] = {}
    for group, pair in (restricted_protocols or {}).items():
        protocols = tuple(p.strip() for p in group.split(","))
        unknown = [p for p in protocols if p not in RESTRICTABLE_PROTOCOLS]
        if unknown:
            raise ValueError(
                f"restricted_protocols: unknown protocol(s) {unknown} in {group!r}; Triton "
                f"restricts {', '.join(RESTRICTABLE_PROTOCOLS)}"
            )
        twice = sorted(restricted.intersection(protocols))
        if twice:
            raise ValueError(f"restricted_protocols: {twice} restricted more than once")
        restricted.update(protocols)
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(
                f"restricted_protocols[{group!r}] must be a (key, value) pair, "
                f"got a {type(pair).__name__}"
            )
        key, value = pair
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ValueError(
                f"restricted_protocols[{group!r}]: the key {key!r} must be lowercase letters, "
                "digits, '-', '_' or '.' (it becomes a header name)"
            )
        if not (isinstance(value, str) and value.isprintable() and value.isascii() and value):
            raise ValueError(
                f"restricted_protocols[{group!r}]: the value of {key!r} must be a non-empty "
                "string of printable ASCII"
            )
        if values.setdefault(key, value) != value:
            raise ValueError(f"restricted_protocols: the key {key!r} is given two values")
        checked.append((protocols, key, value))
    return tuple(checked)


def shown(args: Sequence[str]) -> str:
    """A command line as it may be shown: the values of restrictions are secrets."""
    return " ".join(_RESTRICTION_ARG_RE.sub(r"\1***", arg) for arg in args)


def _absolute(path: str | Path | None) -> Path | None:
    return None if path is None else Path(path).expanduser().absolute()


@dataclasses.dataclass(frozen=True)
class Served:
    """What one start resolved: the binary, its environment, the repositories as served
    (ONNX models rewritten for the Python backend), the backend directory, and whether
    Triton auto-completes model configs."""

    executable: Path
    environ: Mapping[str, str]
    repositories: tuple[Path, ...]
    backend_dir: Path | None
    auto_complete: bool


class ServerConfig:
    """What a local Triton serves and how, checked (see
    :class:`~._server.LocalTritonServer` for the arguments): ports not given (``None`` or 0)
    are picked by :meth:`assign_ports`, and :attr:`restrictions` may be replaced by a
    rotation; the rest is fixed.

    Raises:
        ValueError: a port out of range, a malformed restriction, TLS files that do not go
            together, or no model repository.
    """

    def __init__(
        self,
        *,
        model_repositories: Sequence[str | Path],
        host: str,
        grpc_port: int | None,
        http_port: int | None,
        metrics_port: int | None,
        startup_timeout_s: float,
        stop_grace_s: float,
        extra_args: Sequence[str],
        python_shm_default_byte_size: int,
        python_shm_growth_byte_size: int,
        restricted_protocols: Mapping[str, tuple[str, str]] | None,
        tls_cert: str | Path | None,
        tls_key: str | Path | None,
        tls_client_ca: str | Path | None,
        launcher: Sequence[str],
        shm_prefix: str,
        onnx_via_python: bool,
        auto_complete_config: bool | None,
    ) -> None:
        if not model_repositories:
            raise ValueError("model_repository must name at least one directory")
        self.model_repositories = tuple(Path(p).expanduser().absolute() for p in model_repositories)
        self.host = host
        self.grpc_port = _port_or_none("grpc_port", grpc_port)
        self.http_port = _port_or_none("http_port", http_port)
        self.metrics_port = _port_or_none("metrics_port", metrics_port)
        self._fixed = {
            "grpc": self.grpc_port is not None,
            "http": self.http_port is not None,
            "metrics": self.metrics_port is not None,
        }
        self.startup_timeout_s = float(startup_timeout_s)
        self.stop_grace_s = float(stop_grace_s)
        self.extra_args = tuple(str(a) for a in extra_args)
        self.python_shm_default_byte_size = int(python_shm_default_byte_size)
        self.python_shm_growth_byte_size = int(python_shm_growth_byte_size)
        self.restrictions = parse_restrictions(restricted_protocols)
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        if tls_client_ca is not None and tls_cert is None:
            raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        self.tls_cert = _absolute(tls_cert)
        self.tls_key = _absolute(tls_key)
        self.tls_client_ca = _absolute(tls_client_ca)
        self.launcher = tuple(str(a) for a in launcher)
        self.shm_prefix = shm_prefix
        self.onnx_via_python = bool(onnx_via_python)
        self.auto_complete_config = auto_complete_config

    # ---- ports --------------------------------------------------------------------------

    def port(self, name: str) -> int | None:
        """The port ``name`` (``"grpc"``, ``"http"`` or ``"metrics"``); ``None``: not yet
        picked."""
        port: int | None = getattr(self, f"{name}_port")
        return port

    def assign_ports(self) -> None:
        """Picks free ports for those not given: where both the gRPC and the HTTP port are,
        the HTTP port next below the gRPC port (Triton's own layout, 8000 beside 8001, where
        clients look for it: ``TritonSHMClient(http_url="auto")``). A given gRPC port gets a
        free HTTP port anywhere: 8000 is often Serve's."""
        if self.grpc_port is None and self.http_port is None:
            self.grpc_port, self.http_port = _free_pair(self.host, {self.metrics_port})
        missing = [name for name in _PORT_NAMES if self.port(name) is None]
        if not missing:
            return
        taken = {self.port(name) for name in _PORT_NAMES}
        while True:
            ports = free_ports(self.host, len(missing))
            if not taken.intersection(ports):
                break
        for name, port in zip(missing, ports, strict=True):
            setattr(self, f"{name}_port", port)

    def ensure_ports_free(self, *, keep: bool) -> None:
        """Assign ports and check they can be bound, before paying for a server start.

        Picked ports that turn out to be taken are picked again, unless ``keep`` (once a
        server started on them). Taken fixed ports are waited for briefly (e.g. a previous
        server of ours still shutting down), then reported.

        Raises:
            LocalServerError: a port stays taken.
        """
        deadline = time.monotonic() + _PORT_WAIT_S
        while True:
            self.assign_ports()
            busy = [n for n in _PORT_NAMES if not port_is_free(self.host, self.port(n) or 0)]
            if not busy:
                return
            movable = [n for n in busy if not self._fixed[n] and not keep]
            for name in movable:
                setattr(self, f"{name}_port", None)
            if len(movable) == len(busy):
                continue
            if time.monotonic() > deadline:
                taken = ", ".join(f"{n} {self.port(n)}" for n in busy)
                raise LocalServerError(f"port(s) already in use on {self.host}: {taken}")
            time.sleep(0.2)

    def forget_picked_ports(self) -> None:
        """Forgets the ports picked, for new ones at the next start."""
        for name, fixed in self._fixed.items():
            if not fixed:
                setattr(self, f"{name}_port", None)

    # ---- restrictions -------------------------------------------------------------------

    def grpc_headers(self, *protocols: str) -> dict[str, str]:
        """The headers a gRPC client needs for ``protocols`` (every restricted one if none
        is named); empty if unrestricted.

        Raises:
            ValueError: a name is not one of :data:`RESTRICTABLE_PROTOCOLS`.
        """
        unknown = [p for p in protocols if p not in RESTRICTABLE_PROTOCOLS]
        if unknown:
            raise ValueError(f"unknown protocol(s) {unknown}: {', '.join(RESTRICTABLE_PROTOCOLS)}")
        return {
            f"triton-grpc-protocol-{key}": value
            for restricted, key, value in self.restrictions
            if not protocols or set(protocols).intersection(restricted)
        }

    def http_headers(self) -> dict[str, str]:
        """The headers that open every restricted API of the HTTP endpoint."""
        return {key: value for _, key, value in self.restrictions}

    def check_files(self) -> None:
        """Raises :class:`LocalServerError` for a model repository or TLS file not there."""
        for repo in self.model_repositories:
            if not repo.is_dir():
                raise LocalServerError(f"model repository {repo} is not a directory")
        for pem in (self.tls_cert, self.tls_key, self.tls_client_ca):
            if pem is not None and not pem.is_file():
                raise LocalServerError(f"TLS file {pem} does not exist")

    # ---- the command line ---------------------------------------------------------------

    def command(self, served: Served) -> list[str]:
        """The ``tritonserver`` command line (ports assigned first); its restriction values
        are secrets (:func:`shown`)."""
        self.assign_ports()
        args = [*self.launcher, str(served.executable)]
        args += [f"--model-repository={repo}" for repo in served.repositories]
        if served.backend_dir is not None:
            args.append(f"--backend-directory={served.backend_dir}")
        args += [
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            "--log-verbose=0",
            "--exit-on-error=true",
            "--strict-readiness=true",
            f"--exit-timeout-secs={max(1, int(self.stop_grace_s) - 1)}",
            f"--backend-config=python,shm-default-byte-size={self.python_shm_default_byte_size}",
            f"--backend-config=python,shm-growth-byte-size={self.python_shm_growth_byte_size}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        if not served.auto_complete:
            args.append("--disable-auto-complete-config")
        for protocols, key, value in self.restrictions:
            restriction = f"{','.join(protocols)}:{key}={value}"
            args.append(f"--grpc-restricted-protocol={restriction}")
            args.append(f"--http-restricted-api={restriction}")
        if self.tls_cert is not None:
            args += [
                "--grpc-use-ssl=true",
                f"--grpc-server-cert={self.tls_cert}",
                f"--grpc-server-key={self.tls_key}",
            ]
        if self.tls_client_ca is not None:
            args += ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={self.tls_client_ca}"]
        args += self.extra_args
        return args

    def backend_directory_flag(self) -> Path | None:
        """The backend directory ``extra_args`` name, if any (the last one wins)."""
        for arg in reversed(self.extra_args):
            if arg.startswith("--backend-directory="):
                return Path(arg.partition("=")[2])
        return None
