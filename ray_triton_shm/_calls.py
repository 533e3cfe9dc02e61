"""How the steps of one call (see :mod:`._engine`) are carried out: over gRPC, blocking or on
an event loop, with the call's keys, deadline and reconnect budget.

An inference call and a slot lease (see :mod:`._lease`) run the same steps, so they share one
:class:`Calls`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, Protocol

import grpc

from ._engine import ModelPool, Step
from ._headers import Keys, Metadata
from ._options import RequestOptions
from ._reconnect import Reconnect
from ._transport import as_asyncio_future

__all__ = ["CallHost", "Calls"]


class CallHost(Protocol):
    """What a call needs of the client it runs on: the client's internal API for
    :class:`Calls` and :mod:`._lease` (:class:`~._client.TritonSHMClient` is the one host)."""

    _keys: Keys
    _client_stub: Any

    def _get_metadata(
        self, headers: Mapping[str, str] | None, keys: Metadata | None = None
    ) -> Metadata:
        """The metadata of one gRPC call: the client's keys with ``headers`` over them."""

    def _reconnect(
        self, model: str | None, timeout_s: float | None = None, metadata: Metadata | None = None
    ) -> Reconnect:
        """A reconnect budget for one request."""

    def _reregister(self, pool: ModelPool, epoch: int, reconnect: Reconnect) -> None:
        """Registers ``pool`` again after Triton lost it (once per ``epoch``)."""

    def _next_pool(
        self, pool: ModelPool, exc: BaseException, options: RequestOptions | None, started: float
    ) -> ModelPool:
        """The pool a call that failed on ``pool`` with ``exc`` goes on with, or raises."""


class Calls:
    """The gRPC side of one call of ``model_name``'s pool.

    Args:
        client: The client whose channel, keys and regions the call uses.
        model_name: The model.
        pool: The pool the call starts on (:attr:`pool` follows the model to a new layout).
        headers: The call's own gRPC headers, merged over the client's.
        client_timeout_s: How long each request waits for Triton's answer (``None``: no limit).
        reconnect_timeout_s: How long to wait for an unreachable Triton (``None``: the
            client's).
    """

    def __init__(
        self,
        client: CallHost,
        model_name: str,
        pool: ModelPool,
        *,
        headers: Mapping[str, str] | None,
        client_timeout_s: float | None,
        reconnect_timeout_s: float | None,
    ) -> None:
        self.client = client
        self.pool = pool
        self._model_name = model_name
        self._headers = headers
        self._client_timeout_s = client_timeout_s
        self._reconnect_timeout_s = reconnect_timeout_s
        self._rotated = False
        self._use(client._keys.metadata())

    def _use(self, keys: Any) -> None:
        self._keys = keys
        self._metadata = self.client._get_metadata(self._headers, keys)
        self._reconnect = self.client._reconnect(
            self._model_name, self._reconnect_timeout_s, self._metadata
        )

    def rotate(self) -> bool:
        """After Triton refused the keys: takes the keys there are now, once, if they changed
        (a rotation); ``False`` if there is nothing new to try."""
        if self._rotated or not self.client._keys.refused(self._keys):
            return False
        self._rotated = True
        self._use(self.client._keys.metadata())
        return True

    def do(self, step: Step, arg: Any) -> Any:
        """Carries out one step, blocking."""
        timeout_s = self._client_timeout_s
        match step:
            case Step.ANSWER:
                if arg.call is None:
                    if timeout_s is None:
                        return self.client._client_stub.ModelInfer(
                            arg.request, metadata=self._metadata
                        )
                    self._send(arg)
                try:
                    return arg.call.result(arg.time_left(timeout_s))
                except grpc.FutureTimeoutError:
                    raise arg.deadline_exceeded(timeout_s) from None
            case Step.SLOT:
                return self.pool.slots.acquire(arg)
            case Step.SEND:
                self._send(arg)
            case Step.RECONNECT:
                self._reconnect.wait(arg)
            case Step.REREGISTER:
                self.client._reregister(arg.pool, arg.epoch, self._reconnect)
            case Step.SETTLE:
                if arg.call is not None:
                    ended = (grpc.FutureCancelledError, grpc.FutureTimeoutError)
                    with contextlib.suppress(*ended):
                        arg.call.exception(arg.time_left(timeout_s))
        return None

    async def do_async(self, step: Step, arg: Any) -> Any:
        """Carries out one step on the running event loop."""
        loop = asyncio.get_running_loop()
        timeout_s = self._client_timeout_s
        match step:
            case Step.ANSWER:
                if arg.call is None:
                    self._send(arg)
                answer = as_asyncio_future(arg.call, loop)
                try:
                    return await asyncio.wait_for(answer, arg.time_left(timeout_s))
                except asyncio.TimeoutError:
                    raise arg.deadline_exceeded(timeout_s) from None
            case Step.SLOT:
                return await self.pool.slots.acquire_async(arg)
            case Step.SEND:
                self._send(arg)
            case Step.RECONNECT:
                await self._reconnect.wait_async(arg, loop)
            case Step.REREGISTER:
                await asyncio.to_thread(
                    self.client._reregister, arg.pool, arg.epoch, self._reconnect
                )
            case Step.SETTLE:
                if arg.call is not None:
                    answer = as_asyncio_future(arg.call, loop)
                    await asyncio.wait([answer], timeout=arg.time_left(timeout_s))
        return None

    def _send(self, chunk: Any) -> None:
        chunk.call = self.client._client_stub.ModelInfer.future(
            chunk.request, metadata=self._metadata
        )
