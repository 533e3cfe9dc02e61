"""An embedded, local Triton Inference Server for demos, benchmarks and tests.

:class:`LocalTritonServer` runs a ``tritonserver`` binary (see :mod:`._install`) as a child
process on free loopback ports, waits until all models are ready, and makes sure the child
never outlives the Python process.

This module never imports Ray.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from .._exceptions import LocalServerError
from ._crashes import RestartPolicy, ServerCrash, ServerEvent, crash_reason, reason_lines
from ._install import TritonServerInstall, find_tritonserver
from ._onnx import onnx_via_python_repository
from ._process import ServerProcess, cleanup, proc_stats, terminate
from ._repository import (
    available_backends,
    model_backends,
    needs_auto_complete,
    unsupported_message,
)

__all__ = ["EXAMPLE_MODEL_REPOSITORY", "KEPT_LOG_DIR", "RESTRICTABLE_PROTOCOLS"]
__all__ += ["LocalServerError", "LocalTritonServer", "ServerCrash", "ServerEvent", "log_tail"]

#: Kept for the bench until it imports :func:`._process.proc_stats`.
_proc_stats = proc_stats

#: The example model repository that ships with the package (Python-backend models).
EXAMPLE_MODEL_REPOSITORY: Path = Path(__file__).resolve().parent / "models"

#: Default size of each Python-backend model instance's shared-memory pool.
DEFAULT_PYTHON_SHM_DEFAULT_BYTE_SIZE = 16 * 1024 * 1024
#: Default growth step of the Python-backend shared-memory pools; large enough that one
#: growth step fits a batch of two 3x1024x1024 FP32 inputs plus their outputs (~50 MB).
DEFAULT_PYTHON_SHM_GROWTH_BYTE_SIZE = 64 * 1024 * 1024

_LOG_TAIL_LINES = 40
#: Where the log of a server that crashed or failed to start is kept when it was written to
#: a temporary file (which goes with the server): the evidence outlives the server.
KEPT_LOG_DIR: Path = Path(tempfile.gettempdir()) / "ray-triton-shm-logs"
_PORT_NAMES = ("grpc", "http", "metrics")
_PORT_WAIT_S = 5.0
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
#: gRPC sends lowercase header names only.
_KEY_RE = re.compile(r"[0-9a-z][0-9a-z_.-]*")
#: A restriction on Triton's command line, up to its value (shown as ``***`` in the log).
_RESTRICTION_ARG_RE = re.compile(r"^(--(?:grpc-restricted-protocol|http-restricted-api)=[^=]*=).*")


# --------------------------------------------------------------------------------------
# The server process
# --------------------------------------------------------------------------------------


def _free_ports(host: str, count: int) -> list[int]:
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
        (port,) = _free_ports(host, 1)
        if port - 1 > 0 and taken.isdisjoint((port, port - 1)) and _port_is_free(host, port - 1):
            return port, port - 1
    first, second = _free_ports(host, 2)  # a crowded machine: no such pair found
    return first, second


def _port_is_free(host: str, port: int) -> bool:
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


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the log at ``path`` (a note if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log unavailable: {exc})"
    return "\n".join(data.splitlines()[-lines:])


def _why(text: str, path: Path) -> str:
    """What a log says of why the server did not start (:func:`reason_lines`), else its last
    lines."""
    lines = reason_lines(text)
    if lines:
        return "its log says:\n" + "\n".join(f"  {line}" for line in lines)
    return f"last lines:\n{log_tail(path)}"


def _watch(server: weakref.ref[LocalTritonServer], proc: subprocess.Popen[bytes]) -> None:
    """A watcher thread's body: waits for ``proc`` to end, then lets the server (if it is
    still alive) tell a crash from a stop."""
    proc.wait()
    owner = server()
    if owner is not None:
        owner._exited(proc)


def _is_bind_failure(log: str) -> bool:
    lowered = log.lower()
    return any(
        s in lowered
        for s in (
            "address already in use",
            "failed to start grpc",
            "failed to start http",
            "failed to start metrics",
            "failed to bind",
        )
    )


def _restrictions(
    restricted_protocols: Mapping[str, tuple[str, str]] | None,
) -> tuple[tuple[tuple[str, ...], str, str], ...]:
    """``(protocols, key, value)`` per restriction, checked; errors never show a value."""
    checked: list[tuple[tuple[str, ...], str, str]] = []
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


def _shown(args: Sequence[str]) -> str:
    """A command line as it may be shown: the values of restrictions are secrets."""
    return " ".join(_RESTRICTION_ARG_RE.sub(r"\1***", arg) for arg in args)


class LocalTritonServer:
    """A ``tritonserver`` child process on local ports.

    Example::

        with LocalTritonServer() as server:   # the example model repository
            client = tritonclient.grpc.InferenceServerClient(server.grpc_url)

    Restricted, with TLS on gRPC (for tests and demos of a locked-down Triton)::

        server = LocalTritonServer(
            restricted_protocols={
                "shared-memory,model-repository": ("admin-key", admin_secret),
                "inference": ("infer-key", infer_secret),
            },
            tls_cert="server.crt",
            tls_key="server.key",
        ).start()
        client = TritonSHMClient(
            server.grpc_url,
            headers=server.grpc_headers(),     # both keys
            ssl=True,
            root_certificates="server.crt",
        )

    The child runs in its own process group; :meth:`stop` (also called by the context
    manager, by garbage collection and at interpreter exit) stops it together with its
    Python-backend stub processes.

    The server is supervised, as Kubernetes or systemd supervise a production Triton: when
    ``tritonserver`` exits without being asked to (Triton's Python backend can abort under
    concurrent requests of a few MB: triton-inference-server/server issue 8882), the crash
    is recorded (:attr:`crashes`: when, its signal or exit code, the reason its log gives,
    the log's last lines), the log is kept, and the server is started again on the same
    ports with the same arguments, at once for a first crash and backing off after more.
    After ``max_crashes`` crashes within ``crash_window_s`` it gives up (:attr:`failure`
    names the log). Clients ride through the restart as through any Triton restart: they
    reconnect, register their regions again and resend.

    Before ``tritonserver`` starts, :meth:`start` reads each model's backend (its config's
    ``backend:`` or ``platform:``, else its model file): a model whose backend the server
    lacks (the embedded one has only the Python backend) fails at once, with the ways
    forward; ``onnx_via_python`` serves ONNX models through the Python backend instead.

    Args:
        model_repository: One model repository, several (each becomes a
            ``--model-repository`` flag), or ``None`` for :data:`EXAMPLE_MODEL_REPOSITORY`.
        host: Address the gRPC, HTTP and metrics endpoints bind to.
        grpc_port: gRPC port; a free port is picked if ``None`` or 0.
        http_port: HTTP port; a free port is picked if ``None`` or 0.
        metrics_port: Metrics port; a free port is picked if ``None`` or 0.
        startup_timeout_s: How long :meth:`start` waits for the server and all models to
            become ready.
        stop_grace_s: How long :meth:`stop` waits after SIGINT before escalating.
        log_path: File the server log is written to; a temporary file if ``None``.
        extra_args: Additional ``tritonserver`` command-line arguments.
        python_shm_default_byte_size: Initial size of each Python-backend model
            instance's shared-memory pool.
        python_shm_growth_byte_size: Growth step of those pools.
        install: A specific binary to use; otherwise :func:`find_tritonserver` finds one,
            and ``True`` lets it create the server environment (pip) when there is none.
        restricted_protocols: Triton's restricted protocols: ``{protocols: (key, value)}``,
            e.g. ``{"shared-memory,model-repository": ("admin-key", secret)}``, with
            ``protocols`` comma-separated from :data:`RESTRICTABLE_PROTOCOLS`. Applied to the
            gRPC endpoint (``--grpc-restricted-protocol``: a call then needs the header
            ``triton-grpc-protocol-<key>: <value>``, see :meth:`grpc_headers`) and to the HTTP
            one (``--http-restricted-api``: the header ``<key>: <value>``), so that neither
            is an open door. The server's own readiness checks carry every key. Values are
            secrets: they are on tritonserver's command line (as Triton wants them), but never
            in the log, the repr or an error.
        tls_cert: PEM server certificate: the gRPC endpoint then speaks TLS only
            (``--grpc-use-ssl``); clients pass ``ssl=True, root_certificates=...``. Needs
            ``tls_key``.
        tls_key: PEM private key of ``tls_cert``.
        tls_client_ca: PEM CA that client certificates must be signed by: mutual TLS
            (``--grpc-use-ssl-mutual``); clients also pass ``private_key=`` and
            ``certificate_chain=``. Needs ``tls_cert``. The TLS files are read at each start:
            write new ones and :meth:`restart` to rotate them.
        launcher: A command ``tritonserver`` is started under, which must ``exec`` it, e.g.
            ``("taskset", "-c", "1")``, or ``("setpriv", "--reuid=1000", "--regid=1000",
            "--clear-groups")`` to run it as another user (who must be able to read the model
            repositories and the server environment).
        restart_on_crash: Start ``tritonserver`` again when it exits without being asked to
            (``False``: a crash leaves it stopped, :attr:`failure` says why).
        max_crashes: The crashes within ``crash_window_s`` after which the supervisor gives
            up instead of restarting.
        crash_window_s: The window in which crashes are counted.
        on_event: Called (from the supervisor's thread) when Triton crashed, was restarted,
            or the supervisor gave up: a :class:`ServerEvent`. It must not block for long.
        onnx_via_python: Serve each ONNX model of the repositories through the Python
            backend, running onnxruntime in the server environment (``ray-triton-shm
            setup-server --with onnxruntime``): the embedded server has no ONNX backend.
            Inputs, outputs and ``max_batch_size`` come from the model's ``config.pbtxt``
            where it says them, else from the ONNX graph.
        auto_complete_config: Triton's auto-complete of model configs. ``None``: on only
            where a model needs it (:func:`needs_auto_complete`, read at each start: a model
            with no ``config.pbtxt``, not on the Python backend, or defining
            ``auto_complete_config``), since it costs every Python model a stub process at
            each load, about a second. Say ``True`` where such a model is added to a running
            server (``--model-control-mode=poll|explicit``).

    """

    def __init__(
        self,
        model_repository: str | Path | Sequence[str | Path] | None = None,
        *,
        host: str = "127.0.0.1",
        grpc_port: int | None = None,
        http_port: int | None = None,
        metrics_port: int | None = None,
        startup_timeout_s: float = 120.0,
        stop_grace_s: float = 15.0,
        log_path: str | Path | None = None,
        extra_args: Sequence[str] = (),
        python_shm_default_byte_size: int = DEFAULT_PYTHON_SHM_DEFAULT_BYTE_SIZE,
        python_shm_growth_byte_size: int = DEFAULT_PYTHON_SHM_GROWTH_BYTE_SIZE,
        install: TritonServerInstall | bool = False,
        restricted_protocols: Mapping[str, tuple[str, str]] | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        tls_client_ca: str | Path | None = None,
        launcher: Sequence[str] = (),
        restart_on_crash: bool = True,
        max_crashes: int = 5,
        crash_window_s: float = 60.0,
        on_event: Callable[[ServerEvent], None] | None = None,
        onnx_via_python: bool = False,
        auto_complete_config: bool | None = None,
    ) -> None:
        if model_repository is None:
            repos = [EXAMPLE_MODEL_REPOSITORY]
        elif isinstance(model_repository, (str, os.PathLike)):
            repos = [Path(model_repository)]
        else:
            repos = [Path(r) for r in model_repository]
        if not repos:
            raise ValueError("model_repository must name at least one directory")
        self._model_repositories = tuple(p.expanduser().absolute() for p in repos)
        self._served_repositories = self._model_repositories
        self._onnx_via_python = bool(onnx_via_python)
        self._auto_complete_config = auto_complete_config
        self._auto_complete = True
        self._host = host
        grpc_port, http_port, metrics_port = (
            _port_or_none(name, port)
            for name, port in (
                ("grpc_port", grpc_port),
                ("http_port", http_port),
                ("metrics_port", metrics_port),
            )
        )
        self._ports_fixed = {
            "grpc": grpc_port is not None,
            "http": http_port is not None,
            "metrics": metrics_port is not None,
        }
        self._grpc_port = grpc_port
        self._http_port = http_port
        self._metrics_port = metrics_port
        self._startup_timeout_s = float(startup_timeout_s)
        self._stop_grace_s = float(stop_grace_s)
        self._extra_args = tuple(str(a) for a in extra_args)
        self._restrictions = _restrictions(restricted_protocols)
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        self._tls_cert = None if tls_cert is None else Path(tls_cert).expanduser().absolute()
        self._tls_key = None if tls_key is None else Path(tls_key).expanduser().absolute()
        if tls_client_ca is not None and tls_cert is None:
            raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        self._tls_client_ca = (
            None if tls_client_ca is None else Path(tls_client_ca).expanduser().absolute()
        )
        self._python_shm_default_byte_size = int(python_shm_default_byte_size)
        self._python_shm_growth_byte_size = int(python_shm_growth_byte_size)
        self._may_install = install is True
        self._install = install if isinstance(install, TritonServerInstall) else None
        self._launcher = tuple(str(a) for a in launcher)
        self._tmpdir = tempfile.mkdtemp(prefix="ray-triton-shm-server-")
        # Readable by a server that a launcher runs as another user (it holds no secret).
        os.chmod(self._tmpdir, 0o755)
        self._log_path = (
            Path(log_path).expanduser().absolute()
            if log_path is not None
            else Path(self._tmpdir) / "tritonserver.log"
        )
        self._shm_prefix = f"triton_pb_rts_{os.getpid()}_{id(self):x}_"
        self._backend_dir: Path | None = None
        self._backend_prepared = False
        self._started_once = False
        self._restart_on_crash = bool(restart_on_crash)
        self._policy = RestartPolicy(max_crashes=max_crashes, window_s=crash_window_s)
        self._on_event = on_event
        self._crashes: list[ServerCrash] = []
        self._failure: str | None = None
        self._restarting = False
        self._box = ServerProcess(shm_prefix=self._shm_prefix, tmpdir=self._tmpdir)
        self._finalizer = weakref.finalize(self, cleanup, self._box, self._stop_grace_s)

    # ---- properties -------------------------------------------------------------------

    @property
    def model_repositories(self) -> tuple[Path, ...]:
        """The model repositories served."""
        return self._model_repositories

    @property
    def host(self) -> str:
        """The address the endpoints bind to."""
        return self._host

    @property
    def grpc_port(self) -> int | None:
        """The gRPC port (``None`` before the first :meth:`start` if auto-picked)."""
        return self._grpc_port

    @property
    def http_port(self) -> int | None:
        """The HTTP port (``None`` before the first :meth:`start` if auto-picked)."""
        return self._http_port

    @property
    def metrics_port(self) -> int | None:
        """The metrics port (``None`` before the first :meth:`start` if auto-picked)."""
        return self._metrics_port

    @property
    def shm_prefix(self) -> str:
        """The prefix of the names of the server's Python-backend regions in ``/dev/shm``."""
        return self._shm_prefix

    @property
    def grpc_url(self) -> str:
        """The gRPC endpoint as ``"HOST:PORT"`` (what ``tritonclient.grpc`` expects)."""
        self._require_ports()
        return f"{self._host}:{self._grpc_port}"

    @property
    def http_url(self) -> str:
        """The HTTP endpoint as ``"HOST:PORT"`` (what ``tritonclient.http`` expects)."""
        self._require_ports()
        return f"{self._host}:{self._http_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus metrics URL."""
        self._require_ports()
        return f"http://{self._host}:{self._metrics_port}/metrics"

    @property
    def tls_cert(self) -> Path | None:
        """The gRPC endpoint's TLS certificate, ``None`` without TLS."""
        return self._tls_cert

    def grpc_headers(self, *protocols: str) -> dict[str, str]:
        """The headers a gRPC client needs for ``protocols`` (every restricted one if none
        is named), e.g. ``{"triton-grpc-protocol-admin-key": ...}``; empty if unrestricted.

        Raises:
            ValueError: a name is not one of :data:`RESTRICTABLE_PROTOCOLS`.
        """
        unknown = [p for p in protocols if p not in RESTRICTABLE_PROTOCOLS]
        if unknown:
            raise ValueError(f"unknown protocol(s) {unknown}: {', '.join(RESTRICTABLE_PROTOCOLS)}")
        return {
            f"triton-grpc-protocol-{key}": value
            for restricted, key, value in self._restrictions
            if not protocols or set(protocols).intersection(restricted)
        }

    @property
    def log_path(self) -> Path:
        """The server log file."""
        return self._log_path

    @property
    def pid(self) -> int | None:
        """The server's process id, or ``None`` if it is not running."""
        proc = self._box.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        """Whether the server process is alive."""
        proc = self._box.proc
        return proc is not None and proc.poll() is None

    @property
    def is_restarting(self) -> bool:
        """Whether the supervisor is bringing a crashed server back."""
        return self._restarting

    @property
    def crashes(self) -> tuple[ServerCrash, ...]:
        """Every crash since this object was made, oldest first."""
        return tuple(self._crashes)

    @property
    def failure(self) -> str | None:
        """Why the server is down for good after a crash (the supervisor gave up, or
        restarts are off), naming its log; ``None`` otherwise."""
        return self._failure

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        extras = "".join(
            f", restricted {','.join(protocols)}: {key}" for protocols, key, _ in self._restrictions
        )
        if self._tls_cert is not None:
            extras += ", mutual TLS" if self._tls_client_ca is not None else ", TLS"
        return (
            f"LocalTritonServer(grpc={self._host}:{self._grpc_port}, "
            f"http={self._host}:{self._http_port}, {state}{extras})"
        )

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> LocalTritonServer:
        """Start the server and wait until it and all its models are ready.

        Calling it on a running server does nothing. After :meth:`stop`, it starts again
        on the same ports.

        Returns:
            ``self``.

        Raises:
            LocalServerError: If the server exits or does not become ready within
                ``startup_timeout_s`` (the message includes the tail of the server log), or,
                before any start, if a model needs a backend the server lacks (the message
                names it and the ways forward).
        """
        with self._box.lock:
            if self.is_running:
                return self
            if not self._finalizer.alive:
                raise LocalServerError("this LocalTritonServer has been finalized")
            self._box.stopping = False
            self._box.wake.clear()
            self._failure = None
            self._check_files()
            proc = self._start_process()
        self._supervise(proc)
        return self

    def _check_files(self) -> None:
        for repo in self._model_repositories:
            if not repo.is_dir():
                raise LocalServerError(f"model repository {repo} is not a directory")
        for pem in (self._tls_cert, self._tls_key, self._tls_client_ca):
            if pem is not None and not pem.is_file():
                raise LocalServerError(f"TLS file {pem} does not exist")
        if self._install is None:
            self._install = find_tritonserver(install=self._may_install)
        if not self._backend_prepared:
            self._backend_dir = self._install.prepare_backend_directory(
                Path(self._tmpdir) / "backends"
            )
            self._backend_prepared = True
        self._served_repositories = self._repositories_to_serve()
        self._check_backends()
        self._auto_complete = (
            needs_auto_complete(self._served_repositories)
            if self._auto_complete_config is None
            else self._auto_complete_config
        )

    def _repositories_to_serve(self) -> tuple[Path, ...]:
        """The repositories as asked for, or with their ONNX models served through the
        Python backend (``onnx_via_python``), generated in the temporary directory."""
        if not self._onnx_via_python:
            return self._model_repositories
        assert self._install is not None
        python = self._install.python()
        if python is None:
            raise LocalServerError(
                f"onnx_via_python: no Python found for the server ({self._install.executable})"
            )
        generated = Path(self._tmpdir) / "onnx-via-python"
        return tuple(
            onnx_via_python_repository(
                repo, generated / str(i), python=python, env=self._install.environ()
            )
            for i, repo in enumerate(self._model_repositories)
        )

    def _backend_directory(self) -> Path | None:
        """The backend directory the server will load backends from; ``None``: unknown."""
        for arg in reversed(self._extra_args):
            if arg.startswith("--backend-directory="):
                return Path(arg.partition("=")[2])
        if self._backend_dir is not None:
            return self._backend_dir
        assert self._install is not None
        default = self._install.default_backend_directory()
        return default if default.is_dir() else None

    def _check_backends(self) -> None:
        """Fails, before Triton starts, for each model whose backend the server lacks."""
        directory = self._backend_directory()
        if directory is None:
            return
        available = available_backends(directory)
        lacking = [
            model
            for repo in self._served_repositories
            for model in model_backends(repo)
            if model.backend is not None and model.backend not in available
        ]
        if lacking:
            raise LocalServerError(
                unsupported_message(lacking, available, self._model_repositories)
            )

    def _start_process(self) -> subprocess.Popen[bytes]:
        """Spawns ``tritonserver`` and waits until it is ready (a taken port, or the Python
        backend's known abort while loading models, retried)."""
        attempts = 3
        for attempt in range(attempts):
            self._ensure_ports_free()
            proc = self._spawn()
            try:
                self._wait_ready(proc)
            except (_BindFailure, _StartupAbort) as exc:
                self._discard(proc)
                if attempt == attempts - 1:
                    raise LocalServerError(str(exc)) from None
                if isinstance(exc, _BindFailure) and not self._started_once:
                    self._forget_auto_ports()
                time.sleep(0.5 * (attempt + 1))
                continue
            except BaseException:
                self._discard(proc)
                raise
            self._started_once = True
            return proc
        raise AssertionError("unreachable")

    def _discard(self, proc: subprocess.Popen[bytes]) -> None:
        terminate(proc, 2.0, self._shm_prefix)
        with self._box.lock:
            if self._box.proc is proc:
                self._box.proc = None

    def _supervise(self, proc: subprocess.Popen[bytes]) -> None:
        """Watches ``proc`` from a thread of its own, which holds only a weak reference."""
        threading.Thread(
            target=_watch,
            args=(weakref.ref(self), proc),
            name=f"tritonserver-{proc.pid}-watch",
            daemon=True,
        ).start()

    def _exited(self, proc: subprocess.Popen[bytes]) -> None:
        """``proc`` ended: nothing to do after a stop; after a crash, record it and start
        the server again (backing off), or give up."""
        with self._box.lock:
            if self._box.stopping or self._box.proc is not proc:
                return
            self._restarting = self._restart_on_crash
        try:
            self._recover(proc)
        finally:
            self._restarting = False

    def _recover(self, proc: subprocess.Popen[bytes]) -> None:
        while True:
            crash = self._record_crash(proc)
            terminate(proc, 0.0, self._shm_prefix)  # its stubs and their regions
            delay = self._policy.crashed() if self._restart_on_crash else None
            if delay is None:
                return self._give_up(proc, crash)
            self._emit(ServerEvent("crashed", crash, pid=proc.pid))
            if self._box.wake.wait(delay):
                return  # stopped meanwhile
            with self._box.lock:
                if self._box.stopping:
                    return
                try:
                    self._ensure_ports_free()
                    proc = self._spawn()
                except (LocalServerError, OSError) as exc:
                    self._failure = f"Triton could not be started again after a crash: {exc}"
                    self._box.proc = None
                    self._emit(ServerEvent("gave_up", crash, error=self._failure))
                    return
            try:
                self._wait_ready(proc)
            except LocalServerError:
                with self._box.lock:
                    if self._box.stopping:
                        return
                if proc.poll() is None:  # never became ready: ended like a crash
                    terminate(proc, 0.0, self._shm_prefix)
                continue  # crashed again while starting: counted as another crash
            back = time.time()
            self._crashes = [
                c if c.restarted_at is not None else dataclasses.replace(c, restarted_at=back)
                for c in self._crashes
            ]
            self._emit(ServerEvent("restarted", self._crashes[-1], pid=proc.pid))
            self._supervise(proc)
            return

    def _record_crash(self, proc: subprocess.Popen[bytes]) -> ServerCrash:
        self._keep_log()
        returncode = proc.wait()
        crash = ServerCrash(
            number=len(self._crashes) + 1,
            at=time.time(),
            pid=proc.pid,
            returncode=returncode,
            reason=crash_reason(returncode, self._new_log_text()[-64 * 1024 :]),
            log_tail=log_tail(self._log_path),
            log_path=self._log_path,
        )
        self._crashes.append(crash)
        return crash

    def _give_up(self, proc: subprocess.Popen[bytes], crash: ServerCrash) -> None:
        with self._box.lock:
            if self._box.proc is proc:
                self._box.proc = None
        why = (
            f"tritonserver crashed {self._policy.recent} times within "
            f"{self._policy.window_s:g} s; the supervisor gave up"
            if self._restart_on_crash
            else "tritonserver crashed (restarts are off)"
        )
        self._failure = f"{why}. Last: {crash.reason}. Log: {self._log_path}"
        self._emit(ServerEvent("gave_up", crash, error=self._failure))

    def _emit(self, event: ServerEvent) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # a listener's bug must not stop the supervisor
                pass

    def _keep_log(self) -> None:
        """Moves a temporary log out of the server's temporary directory, which goes with
        the server, into :data:`KEPT_LOG_DIR`; later runs append to it there."""
        if not self._log_path.is_relative_to(self._tmpdir) or not self._log_path.exists():
            return
        KEPT_LOG_DIR.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        kept = KEPT_LOG_DIR / f"tritonserver-{stamp}-{os.getpid()}-{id(self):x}.log"
        try:
            os.replace(self._log_path, kept)
        except OSError:
            shutil.copyfile(self._log_path, kept)
        self._log_path = kept

    def stop(self) -> None:
        """Stop the server (SIGINT, then SIGTERM and SIGKILL after a grace period).

        Idempotent. The ports are kept for a later :meth:`start`. A restart the supervisor
        has under way is given up.
        """
        proc = self._box.stop()
        if proc is not None:
            terminate(proc, self._stop_grace_s, self._shm_prefix)

    def kill(self) -> None:
        """Stop the server at once (SIGKILL to its process group), without Triton's graceful
        shutdown: for a server whose end nobody waits on (a test's own). Idempotent; its
        Python-backend regions are removed as by :meth:`stop`, and it can be started again."""
        proc = self._box.stop()
        if proc is not None:
            terminate(proc, 0.0, self._shm_prefix, graceful=False)

    def restart(
        self, *, restricted_protocols: Mapping[str, tuple[str, str]] | None = None
    ) -> LocalTritonServer:
        """Stop and start again on the same ports.

        The new process has none of the old one's state (e.g. shared-memory
        registrations).

        Args:
            restricted_protocols: New keys to start with (a rotation), in the form of the
                constructor's; ``None`` keeps the current ones.

        Returns:
            ``self``.
        """
        restrictions = None if restricted_protocols is None else _restrictions(restricted_protocols)
        self.stop()
        if restrictions is not None:
            self._restrictions = restrictions
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its temporary files; the object is unusable after."""
        self._finalizer()

    def __enter__(self) -> LocalTritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- internals --------------------------------------------------------------------

    def _require_ports(self) -> None:
        if self._grpc_port is None or self._http_port is None or self._metrics_port is None:
            self._assign_ports()

    def _assign_ports(self) -> None:
        """Picks free ports for those not given: where both the gRPC and the HTTP port are,
        the HTTP port next below the gRPC port (Triton's own layout, 8000 beside 8001, where
        clients look for it: ``TritonSHMClient(http_url="auto")``). A given gRPC port gets a
        free HTTP port anywhere: 8000 is often Serve's."""
        if self._grpc_port is None and self._http_port is None:
            self._grpc_port, self._http_port = _free_pair(self._host, {self._metrics_port})
        missing = [
            name
            for name, port in (
                ("grpc", self._grpc_port),
                ("http", self._http_port),
                ("metrics", self._metrics_port),
            )
            if port is None
        ]
        if not missing:
            return
        taken = {self._grpc_port, self._http_port, self._metrics_port}
        while True:
            ports = _free_ports(self._host, len(missing))
            if not taken.intersection(ports):
                break
        for name, port in zip(missing, ports, strict=True):
            setattr(self, f"_{name}_port", port)

    def _ensure_ports_free(self) -> None:
        """Assign ports and check they can be bound, before paying for a server start.

        Auto-picked ports that turn out to be taken are re-picked (until the first
        successful start; after that the ports are kept). Taken fixed ports are waited for
        briefly (e.g. a previous server of ours still shutting down), then reported.
        """
        deadline = time.monotonic() + _PORT_WAIT_S
        while True:
            self._assign_ports()
            busy = [
                name
                for name in _PORT_NAMES
                if not _port_is_free(self._host, getattr(self, f"_{name}_port"))
            ]
            if not busy:
                return
            movable = [n for n in busy if not self._ports_fixed[n] and not self._started_once]
            for name in movable:
                setattr(self, f"_{name}_port", None)
            if len(movable) == len(busy):
                continue
            if time.monotonic() > deadline:
                taken = ", ".join(f"{n} {getattr(self, f'_{n}_port')}" for n in busy)
                raise LocalServerError(f"port(s) already in use on {self._host}: {taken}")
            time.sleep(0.2)

    def _forget_auto_ports(self) -> None:
        for name, fixed in self._ports_fixed.items():
            if not fixed:
                setattr(self, f"_{name}_port", None)

    def _command(self) -> list[str]:
        assert self._install is not None
        args = [*self._launcher, str(self._install.executable)]
        args += [f"--model-repository={repo}" for repo in self._served_repositories]
        if self._backend_dir is not None:
            args.append(f"--backend-directory={self._backend_dir}")
        args += [
            f"--grpc-address={self._host}",
            f"--grpc-port={self._grpc_port}",
            f"--http-address={self._host}",
            f"--http-port={self._http_port}",
            f"--metrics-address={self._host}",
            f"--metrics-port={self._metrics_port}",
            "--allow-gpu-metrics=false",
            "--log-verbose=0",
            "--exit-on-error=true",
            "--strict-readiness=true",
            f"--exit-timeout-secs={max(1, int(self._stop_grace_s) - 1)}",
            f"--backend-config=python,shm-default-byte-size={self._python_shm_default_byte_size}",
            f"--backend-config=python,shm-growth-byte-size={self._python_shm_growth_byte_size}",
            f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}",
        ]
        if not self._auto_complete:
            args.append("--disable-auto-complete-config")
        for protocols, key, value in self._restrictions:
            restriction = f"{','.join(protocols)}:{key}={value}"
            args.append(f"--grpc-restricted-protocol={restriction}")
            args.append(f"--http-restricted-api={restriction}")
        if self._tls_cert is not None:
            args += [
                "--grpc-use-ssl=true",
                f"--grpc-server-cert={self._tls_cert}",
                f"--grpc-server-key={self._tls_key}",
            ]
        if self._tls_client_ca is not None:
            args += ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={self._tls_client_ca}"]
        args += self._extra_args
        return args

    def _spawn(self) -> subprocess.Popen[bytes]:
        assert self._install is not None
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log_path, "ab") as log:
            header = f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {_shown(self._command())}\n"
            log.write(header.encode())
            log.flush()
            self._log_offset = log.tell()
            return self._box.spawn(self._command(), log=log, env=self._install.environ())

    def _new_log_text(self) -> str:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _http_request(self, method: str, path: str) -> urllib.request.Request:
        """A request to the HTTP endpoint, carrying every key of its restricted APIs."""
        return urllib.request.Request(
            f"http://{self._host}:{self._http_port}{path}",
            method=method,
            data=b"" if method == "POST" else None,
            headers={key: value for _, key, value in self._restrictions},
        )

    def _http_json(self, method: str, path: str, timeout_s: float = 2.0) -> object:
        with urllib.request.urlopen(self._http_request(method, path), timeout=timeout_s) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def _http_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self._http_request("GET", path), timeout=2.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        while True:
            code = proc.poll()
            if code is not None:
                text = self._new_log_text()
                bind_failure = _is_bind_failure(text)
                if not bind_failure:
                    self._keep_log()
                message = (
                    f"tritonserver exited with code {code} during startup "
                    f"(log: {self._log_path}); {_why(text, self._log_path)}"
                )
                if bind_failure:
                    raise _BindFailure(message)
                if _PYTHON_BACKEND_ABORT in text:
                    raise _StartupAbort(message)
                raise LocalServerError(message)
            if self._http_ok("/v2/health/ready") and self._all_models_ready():
                return
            if time.monotonic() > deadline:
                self._keep_log()
                raise LocalServerError(
                    f"tritonserver did not become ready within {self._startup_timeout_s:.0f} s "
                    f"(log: {self._log_path}); {_why(self._new_log_text(), self._log_path)}"
                )
            time.sleep(0.2)

    def _all_models_ready(self) -> bool:
        try:
            index = self._http_json("POST", "/v2/repository/index")
        except (urllib.error.URLError, OSError, ValueError):
            return False
        if not isinstance(index, list):
            return False
        return all(isinstance(m, dict) and m.get("state") == "READY" for m in index)


class _BindFailure(LocalServerError):
    """The server exited because a port was taken (retried with new ports)."""


#: How the Python backend aborts the whole server, now and then, while it loads models or
#: under concurrent requests (triton-inference-server/server issue 8882).
_PYTHON_BACKEND_ABORT = "boost::interprocess::lock_exception"


class _StartupAbort(LocalServerError):
    """The server aborted while loading its models (the Python backend's known fault: retried)."""
