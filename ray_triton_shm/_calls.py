"""One call's gRPC side: how the steps of a call (see :mod:`._engine`) are carried out, blocking
or on an event loop, with the call's keys, deadline and reconnect budget, and where the call
goes on when its pool stops it.

An inference call and a slot lease (see :mod:`._lease`) run the same steps, so they share one
:class:`Call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

import grpc

from ._channel import Channel
from ._engine import ModelPool, Step, Steps, run
from ._exceptions import AccessDeniedError, InvalidInputError
from ._gpu_tensors import OUTPUT_KINDS
from ._inputs import InputValue, prepare_batch
from ._moves import Moves
from ._options import RequestOptions, select_outputs
from ._registry import MOVED, Registry
from ._transport import as_asyncio_future

__all__ = ["Call"]


class Call:
    """The gRPC side of one call of a model's pool.

    Args:
        triton: The way to Triton.
        pools: The client's pools, where the call goes on when its pool stops it.
        pool: The pool the call starts on (:attr:`pool` follows the model to a new layout).
        headers: The call's own gRPC headers, merged over the client's.
        client_timeout_s: How long each request waits for Triton's answer (``None``: no limit).
        reconnect_timeout_s: How long to wait for an unreachable Triton (``None``: the
            client's).
        owner: The client, kept alive while the call (or a lease) lives: collecting it would
            close the channel.
    """

    def __init__(
        self,
        triton: Channel,
        pools: Registry,
        pool: ModelPool,
        *,
        headers: Mapping[str, str] | None,
        client_timeout_s: float | None,
        reconnect_timeout_s: float | None,
        owner: object = None,
    ) -> None:
        self.triton = triton
        self.pools = pools
        self.pool = pool
        self._owner = owner
        self._headers = headers
        self._client_timeout_s = client_timeout_s
        self._reconnect_timeout_s = reconnect_timeout_s
        self._rotated = False
        self.started = time.monotonic()
        self._use(triton.keys.metadata())

    def _use(self, keys: Any) -> None:
        self._keys = keys
        self._metadata = self.triton.metadata(self._headers, keys)
        self._reconnect = self.triton.reconnect(
            self.pool.spec.name, self._reconnect_timeout_s, self._metadata
        )

    def rotate(self) -> bool:
        """After Triton refused the keys: takes the keys there are now, once, if they changed
        (a rotation); ``False`` if there is nothing new to try."""
        if self._rotated or not self.triton.keys.refused(self._keys):
            return False
        self._rotated = True
        self._use(self.triton.keys.metadata())
        return True

    def moved(self, exc: BaseException, options: RequestOptions | None) -> ModelPool:
        """The pool the call goes on with after ``exc`` (one of :data:`._registry.MOVED`)
        stopped it, or raises what the caller should get (see :meth:`Registry.next_pool`)."""
        self.pool = self.pools.next_pool(self.pool, exc, options, self.started)
        return self.pool

    def moves(self, options: RequestOptions | None) -> Moves[ModelPool]:
        """Where the call goes on when its keys are refused (read them again, once) or its
        pool stops it (the model's newer pool)."""

        def recover(pool: ModelPool, exc: BaseException) -> ModelPool:
            if isinstance(exc, AccessDeniedError):
                if not self.rotate():
                    raise exc
                return pool
            return self.moved(exc, options)

        return Moves(self.pool, (AccessDeniedError, *MOVED), recover)

    def steps(
        self,
        pool: ModelPool,
        inputs: Mapping[str, InputValue],
        options: RequestOptions | None,
        slot_timeout_s: float | None,
        request_id: str,
        outputs_as: str = "numpy",
    ) -> Steps:
        """The steps of the call on ``pool``, its inputs and options checked against it.

        Raises:
            InvalidInputError: naming what does not match (nothing was written).
        """
        spec = pool.spec
        device = pool.memory.device
        if outputs_as not in OUTPUT_KINDS or (outputs_as != "numpy" and device is None):
            raise InvalidInputError(
                f"model {spec.name!r}: outputs_as must be one of {OUTPUT_KINDS} ('torch' "
                f"and 'cupy' for a pool in GPU memory, memory='cuda'), got {outputs_as!r} for "
                f"a pool in {pool.memory.kind} memory",
                model=spec.name,
                expected=OUTPUT_KINDS if device is not None else ("numpy",),
                actual=outputs_as,
            )
        batch = prepare_batch(spec, inputs, device)
        chosen = None if options is None else select_outputs(spec, options)
        if chosen is not None and chosen.is_sequence and batch.size > spec.batch_capacity:
            raise InvalidInputError(
                f"model {spec.name!r}: a step of sequence {chosen.sequence_id!r} holds "
                f"{batch.size} samples, more than one request takes (max_batch_size "
                f"{spec.batch_capacity}); the steps of a sequence are never split: send "
                "at most max_batch_size samples per step",
                model=spec.name,
                tensor=None,
                expected=f"<= {spec.batch_capacity} samples",
                actual=batch.size,
            )
        self.pools.maybe_check(pool)
        return run(
            pool,
            batch,
            slot_timeout_s=slot_timeout_s,
            request_id=request_id,
            options=chosen,
            outputs_as=outputs_as,
        )

    def do(self, step: Step, arg: Any) -> Any:
        """Carries out one step, blocking."""
        timeout_s = self._client_timeout_s
        match step:
            case Step.ANSWER:
                if arg.call is None:
                    if timeout_s is None:
                        return self.triton.stub.ModelInfer(arg.request, metadata=self._metadata)
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
                self.pools.reregister(arg.pool, arg.epoch, self._reconnect)
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
                await asyncio.to_thread(self.pools.reregister, arg.pool, arg.epoch, self._reconnect)
            case Step.SETTLE:
                if arg.call is not None:
                    answer = as_asyncio_future(arg.call, loop)
                    await asyncio.wait([answer], timeout=arg.time_left(timeout_s))
        return None

    def _send(self, chunk: Any) -> None:
        chunk.call = self.triton.stub.ModelInfer.future(chunk.request, metadata=self._metadata)
