"""The embedded Triton's supervisor: starting ``tritonserver`` until it and its models are
ready, watching it, and, when it exits without being asked to, recording the crash and
starting it again (backing off), or giving up.

A watcher thread per process holds the supervisor by a weak reference only: a server object
dropped without :meth:`~._server.LocalTritonServer.close` is still collected, and its
finalizer stops the process.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from subprocess import Popen

from .._exceptions import LocalServerError
from ._config import Served, ServerConfig, shown
from ._crashes import RestartPolicy, ServerCrash, ServerEvent, crash_reason
from ._log import ServerLog
from ._process import ServerProcess, terminate

__all__ = ["Supervisor"]

#: How the Python backend aborts the whole server, now and then, while it loads models or
#: under concurrent requests (triton-inference-server/server issue 8882).
_PYTHON_BACKEND_ABORT = "boost::interprocess::lock_exception"
#: The starts tried before a taken port or the Python backend's abort is an error.
_START_ATTEMPTS = 3


class _BindFailure(LocalServerError):
    """The server exited because a port was taken (retried with new ports)."""


class _StartupAbort(LocalServerError):
    """The server aborted while loading its models (the Python backend's known fault: retried)."""


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


def _watch(supervisor: weakref.ref[Supervisor], proc: Popen[bytes]) -> None:
    """A watcher thread's body: waits for ``proc`` to end, then lets the supervisor (if it
    is still alive) tell a crash from a stop."""
    proc.wait()
    owner = supervisor()
    if owner is not None:
        owner._exited(proc)


class Supervisor:
    """Starts, watches and restarts the server process of ``config``.

    Args:
        config: What to serve and how.
        process: The server's process (shared with its finalizer).
        log: The server's log.
        restart_on_crash: Start the server again after a crash.
        policy: When to restart, and when to give up.
        on_event: Told of each crash, restart and surrender (from the watcher thread).
    """

    def __init__(
        self,
        *,
        config: ServerConfig,
        process: ServerProcess,
        log: ServerLog,
        restart_on_crash: bool,
        policy: RestartPolicy,
        on_event: Callable[[ServerEvent], None] | None,
    ) -> None:
        self._config = config
        self._process = process
        self._log = log
        self._restart_on_crash = bool(restart_on_crash)
        self._policy = policy
        self._on_event = on_event
        self._served: Served | None = None
        self._started_once = False
        self.crashes: list[ServerCrash] = []
        self.failure: str | None = None
        self.restarting = False

    def clear(self) -> None:
        """Readies a start: no stop asked for, no failure."""
        self._process.stopping = False
        self._process.wake.clear()
        self.failure = None

    def launch(self, served: Served) -> Popen[bytes]:
        """Spawns the server and waits until it is ready (a taken port, or the Python
        backend's known abort while loading models, retried); call :meth:`watch` next.

        Raises:
            LocalServerError: it exited, or was not ready in time (with its log's reason).
        """
        self._served = served
        for attempt in range(_START_ATTEMPTS):
            self._config.ensure_ports_free(keep=self._started_once)
            proc = self._spawn()
            try:
                self._wait_ready(proc)
            except (_BindFailure, _StartupAbort) as exc:
                self._discard(proc)
                if attempt == _START_ATTEMPTS - 1:
                    raise LocalServerError(str(exc)) from None
                if isinstance(exc, _BindFailure) and not self._started_once:
                    self._config.forget_picked_ports()
                time.sleep(0.5 * (attempt + 1))
                continue
            except BaseException:
                self._discard(proc)
                raise
            self._started_once = True
            return proc
        raise AssertionError("unreachable")

    def watch(self, proc: Popen[bytes]) -> None:
        """Watches ``proc`` from a thread of its own, which holds only a weak reference."""
        threading.Thread(
            target=_watch,
            args=(weakref.ref(self), proc),
            name=f"tritonserver-{proc.pid}-watch",
            daemon=True,
        ).start()

    # ---- starting -------------------------------------------------------------------------

    def _spawn(self) -> Popen[bytes]:
        assert self._served is not None
        command = self._config.command(self._served)
        with self._log.begin_run(shown(command)) as log:
            return self._process.spawn(command, log=log, env=self._served.environ)

    def _discard(self, proc: Popen[bytes]) -> None:
        terminate(proc, 2.0, self._config.shm_prefix)
        with self._process.lock:
            if self._process.proc is proc:
                self._process.proc = None

    def _wait_ready(self, proc: Popen[bytes]) -> None:
        deadline = time.monotonic() + self._config.startup_timeout_s
        while True:
            code = proc.poll()
            if code is not None:
                text = self._log.run_text()
                bind_failure = _is_bind_failure(text)
                if not bind_failure:
                    self._log.keep()
                message = (
                    f"tritonserver exited with code {code} during startup "
                    f"(log: {self._log.path}); {self._log.why(text)}"
                )
                if bind_failure:
                    raise _BindFailure(message)
                if _PYTHON_BACKEND_ABORT in text:
                    raise _StartupAbort(message)
                raise LocalServerError(message)
            if self._http_ok("/v2/health/ready") and self._all_models_ready():
                return
            if time.monotonic() > deadline:
                self._log.keep()
                raise LocalServerError(
                    "tritonserver did not become ready within "
                    f"{self._config.startup_timeout_s:.0f} s (log: {self._log.path}); "
                    f"{self._log.why(self._log.run_text())}"
                )
            time.sleep(0.2)

    def _http_request(self, method: str, path: str) -> urllib.request.Request:
        """A request to the HTTP endpoint, carrying every key of its restricted APIs."""
        return urllib.request.Request(
            f"http://{self._config.host}:{self._config.http_port}{path}",
            method=method,
            data=b"" if method == "POST" else None,
            headers=self._config.http_headers(),
        )

    def _http_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self._http_request("GET", path), timeout=2.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _all_models_ready(self) -> bool:
        request = self._http_request("POST", "/v2/repository/index")
        try:
            with urllib.request.urlopen(request, timeout=2.0) as answer:
                body = answer.read()
            index = json.loads(body) if body else None
        except (urllib.error.URLError, OSError, ValueError):
            return False
        if not isinstance(index, list):
            return False
        return all(isinstance(m, dict) and m.get("state") == "READY" for m in index)

    # ---- crashes --------------------------------------------------------------------------

    def _exited(self, proc: Popen[bytes]) -> None:
        """``proc`` ended: nothing to do after a stop; after a crash, record it and start
        the server again (backing off), or give up."""
        with self._process.lock:
            if self._process.stopping or self._process.proc is not proc:
                return
            self.restarting = self._restart_on_crash
        try:
            self._recover(proc)
        finally:
            self.restarting = False

    def _recover(self, proc: Popen[bytes]) -> None:
        prefix = self._config.shm_prefix
        while True:
            crash = self._record_crash(proc)
            terminate(proc, 0.0, prefix)  # its stubs and their regions
            delay = self._policy.crashed() if self._restart_on_crash else None
            if delay is None:
                return self._give_up(proc, crash)
            self._emit(ServerEvent("crashed", crash, pid=proc.pid))
            if self._process.wake.wait(delay):
                return  # stopped meanwhile
            with self._process.lock:
                if self._process.stopping:
                    return
                try:
                    self._config.ensure_ports_free(keep=True)
                    proc = self._spawn()
                except (LocalServerError, OSError) as exc:
                    self.failure = f"Triton could not be started again after a crash: {exc}"
                    self._process.proc = None
                    self._emit(ServerEvent("gave_up", crash, error=self.failure))
                    return
            try:
                self._wait_ready(proc)
            except LocalServerError:
                with self._process.lock:
                    if self._process.stopping:
                        return
                if proc.poll() is None:  # never became ready: ended like a crash
                    terminate(proc, 0.0, prefix)
                continue  # crashed again while starting: counted as another crash
            back = time.time()
            self.crashes = [
                c if c.restarted_at is not None else dataclasses.replace(c, restarted_at=back)
                for c in self.crashes
            ]
            self._emit(ServerEvent("restarted", self.crashes[-1], pid=proc.pid))
            self.watch(proc)
            return

    def _record_crash(self, proc: Popen[bytes]) -> ServerCrash:
        self._log.keep()
        returncode = proc.wait()
        crash = ServerCrash(
            number=len(self.crashes) + 1,
            at=time.time(),
            pid=proc.pid,
            returncode=returncode,
            reason=crash_reason(returncode, self._log.run_text()[-64 * 1024 :]),
            log_tail=self._log.tail(),
            log_path=self._log.path,
        )
        self.crashes.append(crash)
        return crash

    def _give_up(self, proc: Popen[bytes], crash: ServerCrash) -> None:
        with self._process.lock:
            if self._process.proc is proc:
                self._process.proc = None
        why = (
            f"tritonserver crashed {self._policy.recent} times within "
            f"{self._policy.window_s:g} s; the supervisor gave up"
            if self._restart_on_crash
            else "tritonserver crashed (restarts are off)"
        )
        self.failure = f"{why}. Last: {crash.reason}. Log: {self._log.path}"
        self._emit(ServerEvent("gave_up", crash, error=self.failure))

    def _emit(self, event: ServerEvent) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # a listener's bug must not stop the supervisor
                pass
