"""An embedded, local Triton Inference Server for demos, benchmarks and tests.

:class:`LocalTritonServer` runs a ``tritonserver`` binary (see :mod:`._install`) as a child
process on free loopback ports, waits until all models are ready, and makes sure the child
never outlives the Python process. It is the facade of the parts: what it serves
(:mod:`._config`), its process group and the guard against its owner's death
(:mod:`._process`), its log (:mod:`._log`) and its supervisor (:mod:`._supervisor`).

This module never imports Ray.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from .._exceptions import LocalServerError
from ._config import (
    DEFAULT_PYTHON_SHM_DEFAULT_BYTE_SIZE,
    DEFAULT_PYTHON_SHM_GROWTH_BYTE_SIZE,
    EXAMPLE_MODEL_REPOSITORY,
    RESTRICTABLE_PROTOCOLS,
    Served,
    ServerConfig,
    parse_restrictions,
)
from ._crashes import RestartPolicy, ServerCrash, ServerEvent
from ._install import TritonServerInstall, find_tritonserver
from ._log import KEPT_LOG_DIR, ServerLog, log_tail
from ._onnx import onnx_via_python_repository
from ._process import ServerProcess, cleanup, terminate
from ._repository import (
    available_backends,
    model_backends,
    needs_auto_complete,
    unsupported_message,
)
from ._supervisor import Supervisor

__all__ = ["EXAMPLE_MODEL_REPOSITORY", "KEPT_LOG_DIR", "RESTRICTABLE_PROTOCOLS"]
__all__ += ["LocalServerError", "LocalTritonServer", "ServerCrash", "ServerEvent", "log_tail"]


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
    Python-backend stub processes. Should this process die without stopping it (SIGKILL,
    or a SIGTERM it does not handle), a guard process kills that group and removes its
    Python-backend regions and temporary files within a second.

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
            repos: list[str | Path] = [EXAMPLE_MODEL_REPOSITORY]
        elif isinstance(model_repository, (str, os.PathLike)):
            repos = [Path(model_repository)]
        else:
            repos = [Path(r) for r in model_repository]
        self._shm_prefix = f"triton_pb_rts_{os.getpid()}_{id(self):x}_"
        self._config = ServerConfig(
            model_repositories=repos,
            host=host,
            grpc_port=grpc_port,
            http_port=http_port,
            metrics_port=metrics_port,
            startup_timeout_s=startup_timeout_s,
            stop_grace_s=stop_grace_s,
            extra_args=extra_args,
            python_shm_default_byte_size=python_shm_default_byte_size,
            python_shm_growth_byte_size=python_shm_growth_byte_size,
            restricted_protocols=restricted_protocols,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
            launcher=launcher,
            shm_prefix=self._shm_prefix,
            onnx_via_python=onnx_via_python,
            auto_complete_config=auto_complete_config,
        )
        policy = RestartPolicy(max_crashes=max_crashes, window_s=crash_window_s)
        self._may_install = install is True
        self._install = install if isinstance(install, TritonServerInstall) else None
        self._backend_dir: Path | None = None
        self._backend_prepared = False
        self._tmpdir = tempfile.mkdtemp(prefix="ray-triton-shm-server-")
        # Readable by a server that a launcher runs as another user (it holds no secret).
        os.chmod(self._tmpdir, 0o755)
        self._log = ServerLog(log_path, tmpdir=self._tmpdir)
        self._box = ServerProcess(shm_prefix=self._shm_prefix, tmpdir=self._tmpdir)
        self._supervisor = Supervisor(
            config=self._config,
            process=self._box,
            log=self._log,
            restart_on_crash=restart_on_crash,
            policy=policy,
            on_event=on_event,
        )
        self._finalizer = weakref.finalize(
            self, cleanup, self._box, self._config.stop_grace_s, self._log
        )

    # ---- properties -------------------------------------------------------------------

    @property
    def model_repositories(self) -> tuple[Path, ...]:
        """The model repositories served."""
        return self._config.model_repositories

    @property
    def host(self) -> str:
        """The address the endpoints bind to."""
        return self._config.host

    @property
    def grpc_port(self) -> int | None:
        """The gRPC port (``None`` before the first :meth:`start` if auto-picked)."""
        return self._config.grpc_port

    @property
    def http_port(self) -> int | None:
        """The HTTP port (``None`` before the first :meth:`start` if auto-picked)."""
        return self._config.http_port

    @property
    def metrics_port(self) -> int | None:
        """The metrics port (``None`` before the first :meth:`start` if auto-picked)."""
        return self._config.metrics_port

    @property
    def shm_prefix(self) -> str:
        """The prefix of the names of the server's Python-backend regions in ``/dev/shm``."""
        return self._shm_prefix

    @property
    def grpc_url(self) -> str:
        """The gRPC endpoint as ``"HOST:PORT"`` (what ``tritonclient.grpc`` expects)."""
        self._config.assign_ports()
        return f"{self._config.host}:{self._config.grpc_port}"

    @property
    def http_url(self) -> str:
        """The HTTP endpoint as ``"HOST:PORT"`` (what ``tritonclient.http`` expects)."""
        self._config.assign_ports()
        return f"{self._config.host}:{self._config.http_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus metrics URL."""
        self._config.assign_ports()
        return f"http://{self._config.host}:{self._config.metrics_port}/metrics"

    @property
    def tls_cert(self) -> Path | None:
        """The gRPC endpoint's TLS certificate, ``None`` without TLS."""
        return self._config.tls_cert

    def grpc_headers(self, *protocols: str) -> dict[str, str]:
        """The headers a gRPC client needs for ``protocols`` (every restricted one if none
        is named), e.g. ``{"triton-grpc-protocol-admin-key": ...}``; empty if unrestricted.

        Raises:
            ValueError: a name is not one of :data:`RESTRICTABLE_PROTOCOLS`.
        """
        return self._config.grpc_headers(*protocols)

    @property
    def log_path(self) -> Path:
        """The server log file."""
        return self._log.path

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
        return self._supervisor.restarting

    @property
    def crashes(self) -> tuple[ServerCrash, ...]:
        """Every crash since this object was made, oldest first."""
        return tuple(self._supervisor.crashes)

    @property
    def failure(self) -> str | None:
        """Why the server is down for good after a crash (the supervisor gave up, or
        restarts are off), naming its log; ``None`` otherwise."""
        return self._supervisor.failure

    def __repr__(self) -> str:
        config = self._config
        state = f"pid={self.pid}" if self.is_running else "stopped"
        extras = "".join(
            f", restricted {','.join(protocols)}: {key}"
            for protocols, key, _ in config.restrictions
        )
        if config.tls_cert is not None:
            extras += ", mutual TLS" if config.tls_client_ca is not None else ", TLS"
        return (
            f"LocalTritonServer(grpc={config.host}:{config.grpc_port}, "
            f"http={config.host}:{config.http_port}, {state}{extras})"
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
            self._supervisor.clear()
            proc = self._supervisor.launch(self._served())
        self._supervisor.watch(proc)
        return self

    def stop(self) -> None:
        """Stop the server (SIGINT, then SIGTERM and SIGKILL after a grace period).

        Idempotent. The ports are kept for a later :meth:`start`. A restart the supervisor
        has under way is given up.
        """
        proc = self._box.stop()
        if proc is not None:
            terminate(proc, self._config.stop_grace_s, self._shm_prefix, log_path=self.log_path)

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
        restrictions = (
            None if restricted_protocols is None else parse_restrictions(restricted_protocols)
        )
        self.stop()
        if restrictions is not None:
            self._config.restrictions = restrictions
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

    # ---- what a start serves ----------------------------------------------------------

    def _served(self) -> Served:
        """Checks the files, finds the binary, prepares its backends and the repositories as
        served, and checks every model's backend, before ``tritonserver`` starts."""
        self._config.check_files()
        if self._install is None:
            self._install = find_tritonserver(install=self._may_install)
        if not self._backend_prepared:
            self._backend_dir = self._install.prepare_backend_directory(
                Path(self._tmpdir) / "backends"
            )
            self._backend_prepared = True
        repositories = self._repositories_to_serve(self._install)
        self._check_backends(self._install, repositories)
        auto_complete = self._config.auto_complete_config
        return Served(
            executable=self._install.executable,
            environ=self._install.environ(),
            repositories=repositories,
            backend_dir=self._backend_dir,
            auto_complete=(
                needs_auto_complete(repositories) if auto_complete is None else auto_complete
            ),
        )

    def _repositories_to_serve(self, install: TritonServerInstall) -> tuple[Path, ...]:
        """The repositories as asked for, or with their ONNX models served through the
        Python backend (``onnx_via_python``), generated in the temporary directory."""
        if not self._config.onnx_via_python:
            return self._config.model_repositories
        python = install.python()
        if python is None:
            raise LocalServerError(
                f"onnx_via_python: no Python found for the server ({install.executable})"
            )
        generated = Path(self._tmpdir) / "onnx-via-python"
        return tuple(
            onnx_via_python_repository(
                repo, generated / str(i), python=python, env=install.environ()
            )
            for i, repo in enumerate(self._config.model_repositories)
        )

    def _backend_directory(self, install: TritonServerInstall) -> Path | None:
        """The backend directory the server will load backends from; ``None``: unknown."""
        flagged = self._config.backend_directory_flag()
        if flagged is not None:
            return flagged
        if self._backend_dir is not None:
            return self._backend_dir
        default = install.default_backend_directory()
        return default if default.is_dir() else None

    def _check_backends(self, install: TritonServerInstall, repositories: tuple[Path, ...]) -> None:
        """Fails, before Triton starts, for each model whose backend the server lacks."""
        directory = self._backend_directory(install)
        if directory is None:
            return
        available = available_backends(directory)
        lacking = [
            model
            for repo in repositories
            for model in model_backends(repo)
            if model.backend is not None and model.backend not in available
        ]
        if lacking:
            raise LocalServerError(
                unsupported_message(lacking, available, self._config.model_repositories)
            )
