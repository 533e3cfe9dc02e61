"""One call's transport side: how the steps of a call (see :mod:`._inference._engine`) are carried
out, blocking or on an event loop, with the call's keys, deadline and reconnect budget, and where
the call goes on when its pool stops it.

A one-chunk call goes over Triton's HTTP endpoint where the client has proven one (see
:meth:`._wire._channel.Channel.prove_http`): blocking when it has no deadline, as an asyncio task
(which lives on, and frees the slot, if its caller gives up) on an event loop. Everything
else (several chunks, a blocking call with a deadline, a request sent again) is a gRPC
future.

An inference call and a slot lease (see :mod:`._lease`) run the same steps, so they share one
:class:`Call`: it holds what the caller gave besides the inputs, checked once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import grpc

from ._drive import as_asyncio_future, drive, drive_async
from ._exceptions import AccessDeniedError, InvalidInputError, TritonSHMError
from ._inference._batching import joins_batches, run_batched
from ._inference._engine import Step, Steps, run
from ._inference._gpu_tensors import OUTPUT_KINDS
from ._inference._inputs import InputValue, prepare_batch
from ._inference._model_pool import ModelPool
from ._inference._options import RequestOptions, select_outputs
from ._pools._registry import Registry
from ._pools._retry import MOVED, Moves
from ._wire._channel import Channel
from ._wire._http import Answer, HttpResponse, grpc_answer, http_headers

__all__ = ["Call", "count_failure"]


class Call:
    """One call of a model's pool: what the caller gave (but the inputs), and its transport
    side.

    Args:
        triton: The way to Triton.
        pools: The client's pools, where the call goes on when its pool stops it.
        pool: The pool the call starts on (:attr:`pool` follows the model to a new layout).
        options: Triton's request options, checked (``None``: none).
        slot_timeout_s: How long to wait for a slot (``None``: no limit).
        client_timeout_s: How long each request waits for Triton's answer (``None``: no limit).
        headers: The call's own gRPC headers, merged over the client's.
        request_id: Triton's request id.
        reconnect_timeout_s: How long to wait for an unreachable Triton (``None``: the
            client's).
        outputs_as: What the outputs come back as (see ``infer_shm``).
        owner: The client, kept alive while the call (or a lease) lives: collecting it would
            close the channel.
    """

    def __init__(
        self,
        triton: Channel,
        pools: Registry,
        pool: ModelPool,
        options: RequestOptions | None,
        slot_timeout_s: float | None,
        client_timeout_s: float | None,
        headers: Mapping[str, str] | None,
        request_id: str,
        reconnect_timeout_s: float | None,
        outputs_as: str,
        owner: object,
    ) -> None:
        self.triton = triton
        self.pools = pools
        self.pool = pool
        self.options = options
        self.slot_timeout_s = slot_timeout_s
        self._client_timeout_s = client_timeout_s
        self._headers = headers
        self.request_id = request_id
        self._reconnect_timeout_s = reconnect_timeout_s
        self._outputs_as = outputs_as
        self._owner = owner
        self._rotated = False
        self.started = time.monotonic()
        self._use(triton.keys.metadata())

    def _use(self, keys: Any) -> None:
        self._keys = keys
        self._metadata = self.triton.metadata(self._headers, keys)
        self._http_headers = http_headers(self._metadata)
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
        """The pool the call goes on with after ``exc`` (one of :data:`._pools._retry.MOVED`)
        stopped it, or raises what the caller should get (see :meth:`Registry.next_pool`)."""
        timeout_s = self._client_timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.pool = self.pools.next_pool(self.pool, exc, options, self.started, deadline=deadline)
        return self.pool

    def infer(self, inputs: Mapping[str, InputValue]) -> dict[str, Any]:
        """Runs the call on ``inputs``, blocking (see ``infer_shm``)."""
        return self._moves().run(
            lambda pool: drive(self._steps(pool, inputs), self.do), failed=count_failure
        )

    async def infer_async(self, inputs: Mapping[str, InputValue]) -> dict[str, Any]:
        """Runs the call on ``inputs`` on the running event loop."""
        return await self._moves().run_async(
            lambda pool: drive_async(self._steps(pool, inputs), self.do_async),
            failed=count_failure,
        )

    def _moves(self) -> Moves[ModelPool]:
        """Where the call goes on when its keys are refused (read them again, once) or its
        pool stops it (the model's newer pool)."""

        def recover(pool: ModelPool, exc: BaseException) -> ModelPool:
            if isinstance(exc, AccessDeniedError):
                if not self.rotate():
                    raise exc
                return pool
            return self.moved(exc, self.options)

        return Moves(self.pool, (AccessDeniedError, *MOVED), recover)

    def _steps(self, pool: ModelPool, inputs: Mapping[str, InputValue]) -> Steps:
        """The steps of the call on ``pool``, its inputs and options checked against it.

        Raises:
            InvalidInputError: naming what does not match (nothing was written).
        """
        options, outputs_as = self.options, self._outputs_as
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
        if joins_batches(pool, batch, chosen, outputs_as):
            return run_batched(
                pool,
                batch,
                slot_timeout_s=self.slot_timeout_s,
                client_timeout_s=self._client_timeout_s,
                request_id=self.request_id,
                options=chosen,
            )
        return run(
            pool,
            batch,
            slot_timeout_s=self.slot_timeout_s,
            request_id=self.request_id,
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
                        http, requests = self.triton.http, arg.pool.requests
                        body = None if http is None else requests.body(arg.slot, arg.request)
                        if body is not None:
                            assert http is not None
                            return http.exchange(requests.path, body, self._http_headers).answer(
                                self.request_id
                            )
                        if requests.by_value:
                            return self._by_value(arg)
                        return grpc_answer(
                            self.triton.stub.ModelInfer(arg.request, metadata=self._metadata),
                            self.request_id,
                        )
                    self._send(arg)
                try:
                    return grpc_answer(arg.call.result(arg.time_left(timeout_s)), self.request_id)
                except grpc.FutureTimeoutError:
                    raise arg.deadline_exceeded(timeout_s) from None
            case Step.SLOT:
                return self.pool.slots.acquire(arg)
            case Step.LOCK:
                return arg.wait()
            case Step.PAUSE:
                time.sleep(arg)
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
                    http, requests = self.triton.http, arg.pool.requests
                    body = None if http is None else requests.body(arg.slot, arg.request)
                    if body is not None:
                        assert http is not None
                        exchange = http.exchange_async(requests.path, body, self._http_headers)
                        arg.call = _keep(loop.create_task(_answer_of(exchange, self.request_id)))
                    else:
                        self._send(arg)
                if isinstance(arg.call, asyncio.Future):  # over HTTP: lives on if given up
                    try:
                        answer = asyncio.shield(arg.call)
                        return await asyncio.wait_for(answer, arg.time_left(timeout_s))
                    except asyncio.TimeoutError:
                        raise arg.deadline_exceeded(timeout_s) from None
                try:
                    response = as_asyncio_future(arg.call, loop)
                    answered = await asyncio.wait_for(response, arg.time_left(timeout_s))
                except asyncio.TimeoutError:
                    raise arg.deadline_exceeded(timeout_s) from None
                if arg.pool.by_value and not self.triton.by_value_proof_tried:
                    spec = arg.pool.spec
                    await asyncio.to_thread(
                        self.triton.prove_http_by_value, spec.name, spec.version
                    )
                return grpc_answer(answered, self.request_id)
            case Step.SLOT:
                return await self.pool.slots.acquire_async(arg)
            case Step.LOCK:
                return await arg.wait_async()
            case Step.PAUSE:
                await asyncio.sleep(arg)
            case Step.SEND:
                self._send(arg)
            case Step.RECONNECT:
                await self._reconnect.wait_async(arg, loop)
            case Step.REREGISTER:
                await asyncio.to_thread(self.pools.reregister, arg.pool, arg.epoch, self._reconnect)
            case Step.SETTLE:
                if arg.call is not None:
                    call = arg.call
                    done = (
                        call if isinstance(call, asyncio.Future) else as_asyncio_future(call, loop)
                    )
                    await asyncio.wait([done], timeout=arg.time_left(timeout_s))
        return None

    def _by_value(self, chunk: Any) -> Answer:
        """A request by value over gRPC, blocking; once a request of the channel's has run,
        Triton's HTTP endpoint is tried for the next (see
        :meth:`._wire._channel.Channel.prove_http_by_value`)."""
        triton = self.triton
        answer = grpc_answer(
            triton.infer_bytes(chunk.request, metadata=self._metadata), self.request_id
        )
        if not triton.by_value_proof_tried:
            spec = chunk.pool.spec
            triton.prove_http_by_value(spec.name, spec.version)
        return answer

    def _send(self, chunk: Any) -> None:
        """Sends a chunk's request as a gRPC future (the way of multi-chunk calls, requests
        with a deadline, and requests sent again)."""
        chunk.call = self._infer(chunk).future(chunk.request, metadata=self._metadata)

    def _infer(self, chunk: Any) -> Any:
        """The gRPC method of a chunk's request: a message, or a pool by value's bytes."""
        return self.triton.infer_bytes if chunk.pool.by_value else self.triton.stub.ModelInfer


def count_failure(pool: ModelPool, exc: BaseException) -> None:
    """Counts a failed call on the pool it ended on (the library's own errors, by kind)."""
    if isinstance(exc, TritonSHMError):
        pool.count_failure(exc)


#: The requests over HTTP in flight. The event loop holds its tasks weakly, and a request
#: given up (a deadline, a cancelled caller) is held by nobody else while it waits for
#: Triton's answer, which frees its slot: without this, it could be collected unanswered.
_IN_FLIGHT: set[asyncio.Task[Answer]] = set()


def _keep(task: asyncio.Task[Answer]) -> asyncio.Task[Answer]:
    _IN_FLIGHT.add(task)
    task.add_done_callback(_IN_FLIGHT.discard)
    return task


async def _answer_of(exchange: Coroutine[Any, Any, HttpResponse], request_id: str) -> Answer:
    """The answer of an exchange over HTTP to request ``request_id``, or its error (as a
    task's result, which the slot's release awaits even after its caller gave up)."""
    return (await exchange).answer(request_id)
