"""Waiting for Triton to come back after it restarted or was briefly unreachable.

While a server is down, gRPC backs off between connection attempts, up to two minutes by
default, and fails every call made meanwhile with ``UNAVAILABLE``, even once the server is back.
So our channels retry connecting at least every second (:func:`channel_options`), and a request
that fails with ``UNAVAILABLE`` waits until Triton says it is ready again and is sent again, for
at most ``reconnect_timeout_s`` in all (:class:`Reconnect`). The wait is a ``ServerReady`` call
made with gRPC's ``wait_for_ready``: gRPC holds it until the channel connects. Past that it raises
:class:`ServerUnreachableError`, which says where Triton was tried and for how long.

Triton answers a request for a model it does not know with ``NOT_FOUND``, so ``UNAVAILABLE``
means the connection, not the request, with one exception: Triton also answers ``UNAVAILABLE``
to a call of a restricted protocol that lacks its key ("This protocol is restricted, expecting
header ..."). That answer is an :class:`AccessDeniedError` at once, never a wait, and so is a
refused readiness question. While Triton shuts down it still answers, but its models are gone:
"has no available versions". That answer is waited out like an unreachable server if Triton
says it is not ready; from a ready server it is a real error.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions, service_pb2, service_pb2_grpc

from .._drive import as_asyncio_future, drive, drive_async
from .._exceptions import ServerUnreachableError, TLSHandshakeError
from ._tls import may_be_tls
from ._triton_errors import (
    expected_header,
    is_restart_symptom,
    is_unknown_model,
    is_unreachable,
    status_and_message,
    translate_error,
)

__all__ = [
    "Reconnect",
    "channel_options",
]

#: The longest pause between two connection attempts while Triton is down.
_MAX_BACKOFF_MS = 1000
#: Pause between two readiness questions to a server that answers "not ready".
_READY_PAUSE_S = 0.1
#: Deadline of the readiness question asked when a model has vanished.
_READY_CHECK_S = 2.0
#: A server that starts shutting down still says it is live for a moment: a model that has
#: vanished from a live server is asked about once more after this pause.
_LIVE_RECHECK_S = 0.2
_READY_REQUEST = service_pb2.ServerReadyRequest()
_LIVE_REQUEST = service_pb2.ServerLiveRequest()
#: How often a waiting request asks whether TLS is why Triton cannot be reached.
_TLS_CHECK_INTERVAL_S = 1.0

T = TypeVar("T")


def channel_options(
    channel_args: Sequence[tuple[str, Any]] | None, keepalive_options: KeepAliveOptions | None
) -> list[tuple[str, Any]]:
    """tritonclient's channel options (or the caller's own), with a reconnect backoff of at
    most a second unless the caller set one."""
    if channel_args is not None:
        options = list(channel_args)
    else:
        keepalive = keepalive_options or KeepAliveOptions()
        options = [
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ]
    if not any(name == "grpc.max_reconnect_backoff_ms" for name, _ in options):
        options.append(("grpc.max_reconnect_backoff_ms", _MAX_BACKOFF_MS))
    return options


class _Wait(enum.Enum):
    """What waiting for Triton needs done (see :meth:`Reconnect._waiting`)."""

    #: A check that may block (asks Triton, reads TLS files): a callable -> ``None``.
    CHECK = enum.auto()
    #: A readiness question (a gRPC future) -> whether Triton is ready.
    READY = enum.auto()
    #: Seconds to pause -> ``None``.
    PAUSE = enum.auto()


def _do(step: _Wait, argument: Any) -> Any:
    """Does a step of waiting, blocking."""
    match step:
        case _Wait.CHECK:
            return argument()
        case _Wait.READY:
            return argument.result().ready
        case _Wait.PAUSE:
            return time.sleep(argument)


class Reconnect:
    """The reconnect budget of one request: waits for the channel, at most ``timeout_s`` in
    all, counted from the request's first failure.

    Args:
        channel: The client's channel.
        url: Triton's address, for the error.
        timeout_s: The budget; ``0`` raises at the first failure.
        model: The model concerned, for the error.
        metadata: The gRPC metadata (headers) of the readiness questions: the client's.
        tls_problem: Says whether TLS is why Triton cannot be reached (see
            :func:`ray_triton_shm._wire._tls.diagnose`): asked, at most once a second, when a
            failure may come from TLS; a problem is raised at once as
            :class:`TLSHandshakeError`, since waiting does not fix it.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        url: str,
        timeout_s: float,
        model: str | None = None,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        tls_problem: Callable[[], tuple[str, str] | None] | None = None,
    ) -> None:
        self._channel = channel
        self._url = url
        self._timeout_s = timeout_s
        self._model = model
        self._metadata = metadata
        self._tls_problem = tls_problem
        self._tls_next_check = 0.0
        self._first_failure: float | None = None

    @functools.cached_property
    def _stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        # Made only when needed: every request makes a Reconnect, few ever wait.
        return service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def wait(self, exc: BaseException) -> None:
        """Blocks until the channel is ready again, after ``exc`` (a restart symptom).

        Raises:
            ServerUnreachableError: the budget ran out (from ``exc``).
            AccessDeniedError: Triton refused the readiness question (health is restricted).
            TritonServerError: ``exc`` was the answer of a ready Triton, not a restart.
        """
        drive(self._waiting(exc), _do)

    async def wait_async(self, exc: BaseException, loop: asyncio.AbstractEventLoop) -> None:
        """:meth:`wait` for coroutines: the checks that block run in a thread."""

        async def do(step: _Wait, argument: Any) -> Any:
            match step:
                case _Wait.CHECK:
                    return await asyncio.to_thread(argument)
                case _Wait.READY:
                    try:
                        return (await as_asyncio_future(argument, loop)).ready
                    finally:
                        argument.cancel()  # cancelled while waiting: stop the call too
                case _Wait.PAUSE:
                    return await asyncio.sleep(argument)

        await drive_async(self._waiting(exc), do)

    def _waiting(self, exc: BaseException) -> Generator[tuple[_Wait, Any], Any, None]:
        """The one rule of waiting for Triton, sans I/O (see :mod:`.._drive`)."""
        if not is_unreachable(exc):
            yield _Wait.CHECK, functools.partial(self._check_restarting, exc)
        yield _Wait.CHECK, functools.partial(self._check_tls, exc)
        while True:
            ready = self._stub.ServerReady.future(
                _READY_REQUEST,
                timeout=self._remaining(exc),
                metadata=self._metadata,
                wait_for_ready=True,
            )
            try:
                if (yield _Wait.READY, ready):
                    return
            except grpc.RpcError as error:
                exc = self._last_cause(exc, error)
                yield _Wait.CHECK, functools.partial(self._check_tls, error)
            yield _Wait.PAUSE, min(_READY_PAUSE_S, self._remaining(exc))

    def call(self, action: Callable[[], T]) -> T:
        """Runs ``action`` (a tritonclient call), waiting and trying again while Triton is
        restarting; any other error is raised as it is."""
        while True:
            try:
                return action()
            except Exception as exc:
                if not is_restart_symptom(exc):
                    raise
                self.wait(exc)

    def _check_restarting(self, exc: BaseException) -> None:
        """Raises ``exc`` as ours unless Triton is unreachable or restarting.

        A model with no version loaded on a server that is live and not exiting was unloaded
        (or never loaded): :class:`ModelNotLoadedError` at once. A server that is shutting
        down answers its liveness question "Server exiting".
        """
        if is_unreachable(exc):
            return
        if is_unknown_model(exc):
            for pause_s in (0.0, _LIVE_RECHECK_S):
                time.sleep(pause_s)
                try:
                    live = self._stub.ServerLive(
                        _LIVE_REQUEST, timeout=_READY_CHECK_S, metadata=self._metadata
                    ).live
                except grpc.RpcError as error:
                    self._raise_if_refused(error)
                    return  # exiting, or gone meanwhile: a restart
                if not live:
                    return
            raise translate_error(exc, model=self._model, action="inference") from exc
        try:
            ready = self._stub.ServerReady(
                _READY_REQUEST, timeout=_READY_CHECK_S, metadata=self._metadata
            )
        except grpc.RpcError as error:
            self._raise_if_refused(error)
            return  # gone meanwhile: a restart
        if ready.ready:
            raise translate_error(exc, model=self._model, action="inference") from exc

    def _check_tls(self, exc: BaseException) -> None:
        """Raises :class:`TLSHandshakeError` if TLS is why ``exc`` happened.

        Raises:
            TLSHandshakeError: what is missing or refused, and how to fix it.
        """
        now = time.monotonic()
        if self._tls_problem is None or now < self._tls_next_check or not may_be_tls(exc):
            return
        self._tls_next_check = now + _TLS_CHECK_INTERVAL_S
        problem = self._tls_problem()
        if problem is None:
            return
        reason, fix = problem
        status, message = status_and_message(exc)
        about = f" for model {self._model!r}" if self._model else ""
        raise TLSHandshakeError(
            f"cannot talk to Triton at {self._url}{about}: {fix}",
            url=self._url,
            reason=reason,
            status=status,
            server_message=message,
            model=self._model,
        ) from exc

    def _last_cause(self, exc: BaseException, error: grpc.RpcError) -> BaseException:
        """The error worth reporting: a readiness call that ran out of time tells nothing new.

        Raises:
            AccessDeniedError: Triton refused the readiness question.
        """
        self._raise_if_refused(error)
        return exc if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED else error

    def _raise_if_refused(self, error: grpc.RpcError) -> None:
        if expected_header(error) is not None:
            raise translate_error(
                error, model=self._model, action="asking whether Triton is ready"
            ) from error

    def _remaining(self, exc: BaseException) -> float:
        now = time.monotonic()
        if self._first_failure is None:
            self._first_failure = now
        remaining = self._first_failure + self._timeout_s - now
        if remaining <= 0:
            raise self._unreachable(exc) from exc
        return remaining

    def _unreachable(self, exc: BaseException) -> ServerUnreachableError:
        status, message = status_and_message(exc)
        waited = 0.0 if self._first_failure is None else time.monotonic() - self._first_failure
        tried = (
            f"waited {waited:.1f} s for it (reconnect_timeout_s={self._timeout_s:g})"
            if self._timeout_s > 0
            else "not waited for (reconnect_timeout_s=0)"
        )
        about = f" for model {self._model!r}" if self._model else ""
        return ServerUnreachableError(
            f"Triton is unreachable at {self._url}{about}: {tried}; last error: {message}",
            url=self._url,
            waited_s=waited,
            status=status,
            server_message=message,
            model=self._model,
        )
