"""``ShmModel``: a small picklable handle to a model whose slots the node actor owns.

Pass it to Serve deployments and Ray Data workers. In the process that uses it, it binds lazily:
it registers the model with its node's actor (a no-op if already done), attaches the model's
region, and from then on takes the region's slots **through the region itself**, shared with
every other process of the node (see :mod:`ray_triton_shm._slots._shared_slots`), and sends requests
**straight to the node's Triton**. A request writes the inputs into a slot, makes one small
call that names the region, and reads the outputs back; it makes no Ray call, at any load.
A stream of a streaming model (:meth:`ShmModel.stream`) holds its slot until Triton's final
response, and its outputs come back by value, in the responses.
Where Triton cannot map the node's shared memory (it runs on another node, or in a container
with its own ``/dev/shm``), the node actor's probe says so and the tensors go by value, in the
requests, still straight from the caller and still on the node's slots (``transport``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

from ray.exceptions import RayActorError

from .._client import lease_with
from .._defaults import DEFAULT_RECONNECT_TIMEOUT_S
from .._exceptions import (
    RegionReplacedError,
)
from .._inference._inputs import InputValue
from .._inference._node_batching import NodeBatching, node_batching_of
from .._inference._options import (
    NOT_GIVEN,
    NotGiven,
    ParameterValue,
    RequestOptions,
    options_without_sequence,
    over_defaults,
    renamed_outputs,
    request_options,
)
from .._inference._stream import StreamResponse
from .._inference._transport import INLINE, SHM, check_transport
from .._lease import SlotLease
from .._pools._retry import MOVED, RETIRED, Moves, follow_model
from .._slots import _cuda
from .._slots._memory import CUDA, SYSTEM, check_memory_options
from .._slots._sizing import SlotAutoscaling
from .._slots._slot_pool import PoolStats
from .._slots._specs import ModelSpec, SpecLike
from .._wire._keys import Keys, normalize
from ._actor import ModelRegistration, get_node_actor
from ._binding import (
    ActorLayouts,
    Binding,
    CallSettings,
    InProcess,
    refuse_on_event_loop,
)
from ._control import control_call, get

__all__ = ["ShmModel"]

#: What makes a call bind again and retry: the node actor restarted.
_REBIND_ON = (RegionReplacedError, RayActorError)
T = TypeVar("T")

#: Pause before asking for the node actor again after finding it going away.
_REBIND_PAUSE_S = 1.0


class ShmModel:
    """A model behind the node actor, callable from any process on the node.

    Only configuration is pickled; the actor handle, the shm mapping and the gRPC channel are
    made in the process that calls :meth:`infer`.

    Args:
        model_name: The model on the node's Triton.
        inputs: As for :meth:`TritonSHMClient.register_shm_model` (``None``: the model
            config's).
        outputs: As for :meth:`TritonSHMClient.register_shm_model`.
        max_batch_size: As for :meth:`TritonSHMClient.register_shm_model`.
        pool_size: A fixed number of slots of the model on the node (requests in flight
            there, over every process); ``None`` (the default): the pool follows the model's
            load on the node, as ``autoscaling`` says (see
            :meth:`TritonSHMClient.register_shm_model`).
        autoscaling: How the pool follows its load without ``pool_size`` (see
            :meth:`TritonSHMClient.register_shm_model`); the fields left out take the node
            actor's (2 slots up to its ``slots``). The first handle to register the model on
            a node sets them.
        max_shapes: As for :meth:`TritonSHMClient.register_shm_model`.
        max_element_bytes: As for :meth:`TritonSHMClient.register_shm_model`.
        model_version: As for :meth:`TritonSHMClient.register_shm_model`.
        url: Triton's gRPC address on the node (see :func:`get_node_actor`): a Triton on
            another node gets the tensors by value.
        transport: How this handle's calls reach Triton (see
            :meth:`TritonSHMClient.register_shm_model`): ``"auto"`` (the default: as the
            node actor's probe found, shared memory where Triton maps the node's, else by
            value), ``"shm"`` (shared memory, or :class:`SharedMemoryUnreachableError` naming
            the node and why) or ``"inline"`` (by value). Either way straight from the caller,
            on the node's slots, with no Ray call per request. :meth:`shm_stats` says which,
            and why.
        zero_copy: ``False`` is ``transport="inline"`` (the earlier name).
        slot_timeout_s: As for :meth:`TritonSHMClient.infer_shm`, for this handle's calls.
        client_timeout_s: As for :meth:`TritonSHMClient.infer_shm`, for this handle's calls.
        reconnect_timeout_s: How long a call waits for the node's Triton while it is
            unreachable (restarting) before :class:`ServerUnreachableError`; ``0`` fails at
            once.
        headers: gRPC headers of this caller's requests (as for
            :meth:`TritonSHMClient.infer_shm`): Triton's inference key, over those of the
            node, read where the handle binds so that they travel in no argument: its
            key files (``RAY_TRITON_SHM_KEYS_DIR``, a mounted Secret, read again when they
            change) and its ``RAY_TRITON_SHM_HEADER_*`` variables. Never shown; but these
            travel with the handle, so prefer the node's key files.
        client_options: Keyword arguments of this caller's :class:`TritonSHMClient` (TLS:
            ``ssl=True``, ``root_certificates=``, ...).
        actor_options: Extra keyword arguments for :func:`get_node_actor` (``slots``,
            ``max_waiting``, ``reconnect_timeout_s``, ``headers`` and
            ``client_options`` of the control plane), used if this call creates the actor.
        priority: The default of this handle's calls (see
            :meth:`TritonSHMClient.infer_shm`); a call's own wins.
        queue_timeout_s: The default of this handle's calls (see
            :meth:`TritonSHMClient.infer_shm`); a call's own wins.
        parameters: The default of this handle's calls (see
            :meth:`TritonSHMClient.infer_shm`); a call's own are merged over them.
        requested_outputs: The default of this handle's calls (see
            :meth:`TritonSHMClient.infer_shm`); a call's own wins.
        memory: Where the model's slots live on the node: ``"system"`` or ``"cuda"`` (GPU
            memory; see :meth:`TritonSHMClient.register_shm_model`). The node actor allocates
            them on the GPU ``device`` names, as the process that binds first sees it.
        device: For ``memory="cuda"`` (see :meth:`TritonSHMClient.register_shm_model`): an
            index in the binding process (``0``, ``"cuda:0"``), a UUID (``"GPU-..."``), or
            ``None`` for its current CUDA device (in a replica or task with ``num_gpus=1``:
            its GPU).
        triton_device_id: For ``memory="cuda"``, the index Triton knows the GPU by (``None``:
            the node actor's guess, right when Triton sees every GPU of the node; see
            :meth:`TritonSHMClient.register_shm_model`).
        outputs_as: The default of this handle's calls (see
            :meth:`TritonSHMClient.infer_shm`); a call's own wins.
        node_batching: Merge the calls of a few rows of every process on the node into one
            Triton request (see :meth:`TritonSHMClient.register_shm_model` and the guide's
            *Node batching*): a :class:`NodeBatching`, ``True`` for its defaults, or ``None``.
            It is the model's on the node: every handle of the model there must ask the same
            (another raises :class:`ModelSpecError`, as other specs do).

    When the model changes on Triton and its specs came from Triton's config (``inputs``,
    ``outputs`` and ``max_batch_size`` left out), the node actor lays its pool out anew, once
    per node, and every handle in every process moves to the new layout at its next call.
    With specs given by hand, calls raise :class:`ModelChangedError`; :meth:`reregister`
    registers the model again with new specs.

    Example:
        >>> model = ShmModel("classifier")
        >>> top = model.infer({"INPUT0": images})["OUTPUT0"].argmax(axis=1)
    """

    def __init__(
        self,
        model_name: str,
        *,
        inputs: Sequence[Any] | None = None,
        outputs: Sequence[Any] | None = None,
        max_batch_size: int | None = None,
        pool_size: int | None = None,
        autoscaling: SlotAutoscaling | Mapping[str, Any] | None = None,
        max_shapes: Mapping[str, Sequence[int]] | None = None,
        max_element_bytes: Mapping[str, int] | None = None,
        model_version: str = "",
        url: str | None = None,
        transport: str = "auto",
        zero_copy: bool = True,
        slot_timeout_s: float | None = None,
        client_timeout_s: float | None = None,
        reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
        client_options: Mapping[str, Any] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        priority: int = 0,
        queue_timeout_s: float | None = None,
        parameters: Mapping[str, ParameterValue] | None = None,
        requested_outputs: Sequence[str] | None = None,
        memory: str = SYSTEM,
        device: int | str | None = None,
        triton_device_id: int | None = None,
        outputs_as: str = "numpy",
        node_batching: NodeBatching | bool | None = None,
    ) -> None:
        # Checked here, where the handle is made, not at its first call in a worker.
        check_memory_options(model_name, memory, device, triton_device_id)
        check_transport(model_name, transport)
        self._defaults = options_without_sequence(
            model_name,
            priority=priority,
            queue_timeout_s=queue_timeout_s,
            parameters=parameters,
            requested_outputs=requested_outputs,
        )
        self._call = CallSettings(slot_timeout_s, client_timeout_s, outputs_as)
        self.model_name = model_name
        self._register_args: dict[str, Any] = {
            "inputs": list(inputs) if inputs is not None else None,
            "outputs": list(outputs) if outputs is not None else None,
            "max_batch_size": max_batch_size,
            "pool_size": pool_size,
            "autoscaling": _autoscaling_fields(autoscaling),
            "model_version": model_version,
            "max_shapes": dict(max_shapes) if max_shapes is not None else None,
            "max_element_bytes": dict(max_element_bytes) if max_element_bytes else None,
            "memory": memory,
            "triton_device_id": triton_device_id,
            "node_batching": node_batching_of(model_name, node_batching),
        }
        self._device = device
        self._url = url
        self._transport = transport if zero_copy else INLINE
        self._reconnect_timeout_s = reconnect_timeout_s
        self._headers = normalize(headers)
        self._client_options = dict(client_options or {})
        self._actor_options = dict(actor_options or {})
        self._here = InProcess()

    # ---------------------------------------------------------------- pickling: config only

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_here"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._here = InProcess()

    def __repr__(self) -> str:
        return f"ShmModel({self.model_name!r}, transport={self._transport!r})"

    # ---------------------------------------------------------------- binding

    def _bind(self) -> Binding:
        return self._here.get(lambda: self._new_binding(*self._register()))

    def _new_binding(self, actor: Any, registration: ModelRegistration) -> Binding:
        return Binding(
            actor,
            registration,
            transport=self._transport,
            reconnect_timeout_s=self._reconnect_timeout_s,
            keys=Keys(self._headers, environ=True),
            client_options=self._client_options,
        )

    def _register(self, *, replace: bool = False) -> tuple[Any, ModelRegistration]:
        """Registers the model with the node actor; once more with the actor's next
        incarnation if the one found was going away (killed, or its node restarting)."""
        name, args = self.model_name, {**self._register_args, "replace": replace}
        if args["memory"] == CUDA:  # the GPU as this process sees it, named by its UUID
            args["device"] = _cuda.find_device(self._device).uuid
        for attempt in range(2):
            actor = get_node_actor(url=self._url, **self._actor_options)
            try:
                return actor, control_call(functools.partial(_register, actor, name, args))
            except RayActorError:
                if attempt:
                    raise
                time.sleep(_REBIND_PAUSE_S)
        raise AssertionError("unreachable")

    async def _bind_async(self) -> Binding:
        binding = self._here.current()
        if binding is not None:
            return binding
        # Binding is rare (once per process) and made of short control calls.
        return await asyncio.to_thread(self._bind)

    def _moves(
        self,
        binding: Binding,
        moved: tuple[type[BaseException], ...],
        options: RequestOptions | None,
    ) -> Moves[Binding]:
        """Where a call on ``binding`` goes on: a new binding after its node actor restarted,
        else where :func:`follow_model` says after one of ``moved``, the node actor being the
        owner of the model's layouts."""
        sequence = options is not None and options.is_sequence

        def recover(binding: Binding, exc: BaseException) -> Binding:
            if isinstance(exc, _REBIND_ON):
                self._here.replace(binding, None)  # the node actor restarted: a new region
                return self._bind()
            owner = ActorLayouts(self.model_name, self._here, self._bind, self._new_binding)
            timeout_s = self._call.client_timeout_s
            return follow_model(
                binding,
                exc,
                owner,
                follows=self._follows,
                sequence=sequence,
                started=0.0,
                deadline=None if timeout_s is None else time.monotonic() + timeout_s,
            )

        return Moves(binding, (*_REBIND_ON, *moved), recover)

    @property
    def _follows(self) -> bool:
        args = self._register_args
        return args["inputs"] is None and args["outputs"] is None and args["max_batch_size"] is None

    def reregister(
        self,
        *,
        inputs: Sequence[SpecLike] | None = None,
        outputs: Sequence[SpecLike] | None = None,
        max_batch_size: int | None = None,
        max_shapes: Mapping[str, Sequence[int]] | None = None,
        max_element_bytes: Mapping[str, int] | None = None,
    ) -> ModelSpec:
        """Registers the model again with new specs (after :class:`ModelChangedError`), without
        restarting the node actor: its pool on the node is laid out anew, and every handle on
        the node moves to it at its next call. Leave the specs out to follow Triton's config
        from now on.

        Returns:
            The model's spec now.
        """
        self._register_args.update(
            inputs=None if inputs is None else list(inputs),
            outputs=None if outputs is None else list(outputs),
            max_batch_size=max_batch_size,
            max_shapes=None if max_shapes is None else dict(max_shapes),
            max_element_bytes=dict(max_element_bytes) if max_element_bytes else None,
        )
        actor, registration = self._register(replace=True)
        self._here.replace(None, lambda: self._new_binding(actor, registration))
        return registration.spec

    @property
    def spec(self) -> ModelSpec:
        """The model's spec as registered with the node actor (binds if needed)."""
        return self._bind().spec

    @property
    def zero_copy(self) -> bool:
        """Whether calls in this process reach Triton through shared memory, not by value
        (binds if needed)."""
        return self.shm_stats().transport == SHM

    def shm_stats(self) -> PoolStats:
        """The model's pool as this process sees it (binds if needed): slots in use, callers
        waiting, and its ``transport`` (``"shm"`` or ``"inline"``) with ``transport_reason``
        (the node's totals: the node actor's ``stats()``)."""
        return self._bind().stats

    def close(self) -> None:
        """Detaches this process from the model's region (also done at exit).

        Waits for this process's calls in flight (up to 30 s) to give their slots back.
        """
        here = self._here
        with here.lock:
            binding, here.binding = here.binding, None
        if binding is not None:
            binding.close()

    # ---------------------------------------------------------------- inference

    def infer(
        self,
        inputs: Mapping[str, InputValue],
        *,
        priority: int | None = None,
        queue_timeout_s: float | None = None,
        parameters: Mapping[str, ParameterValue] | None = None,
        requested_outputs: Sequence[str] | None = None,
        outputs_as: str | None = None,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Runs the model on a batch; blocks until the outputs are back.

        The options are those of :meth:`TritonSHMClient.infer_shm` (``outputs=``: the
        deprecated name of ``requested_outputs=``); those left at ``None`` take this handle's
        defaults (``priority=0`` is the model's own level, over the handle's).

        Raises:
            InvalidInputError: bad inputs (checked here, before any shared memory is touched).
            SlotTimeoutError: no slot came free within ``slot_timeout_s``.
            OverloadedError: too many callers already wait for a slot on this node.
            StreamingModelError: the model is a streaming one (decoupled): call
                :meth:`stream` (raised before any slot is taken).
            TritonServerError: Triton answered with an error.
            ModelChangedError: the model changed on Triton and its specs were given by hand.
            ModelNotLoadedError: the model is not loaded on Triton.
            ServerUnreachableError: Triton stayed unreachable for ``reconnect_timeout_s``.
            BlockingCallError: called on a thread that runs an event loop (an ``async def``
                Serve method): await :meth:`infer_async` there.
        """
        refuse_on_event_loop(self.model_name, "infer()", "await infer_async()")
        options, call = self._prepare(
            priority,
            queue_timeout_s,
            parameters,
            requested_outputs,
            outputs_as,
            sequence_id,
            sequence_start,
            sequence_end,
            outputs,
        )
        moves = self._moves(self._bind(), MOVED, options)
        return moves.run(lambda binding: binding.infer(inputs, options, call))

    async def infer_async(
        self,
        inputs: Mapping[str, InputValue],
        *,
        priority: int | None = None,
        queue_timeout_s: float | None = None,
        parameters: Mapping[str, ParameterValue] | None = None,
        requested_outputs: Sequence[str] | None = None,
        outputs_as: str | None = None,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """:meth:`infer` for coroutines (e.g. Ray Serve replicas): blocks no thread.

        Cancelling is safe: a slot is reused only once Triton has answered.
        """
        options, call = self._prepare(
            priority,
            queue_timeout_s,
            parameters,
            requested_outputs,
            outputs_as,
            sequence_id,
            sequence_start,
            sequence_end,
            outputs,
        )
        moves = self._moves(await self._bind_async(), MOVED, options)
        return await moves.run_async(lambda binding: binding.infer_async(inputs, options, call))

    def stream(
        self,
        inputs: Mapping[str, InputValue],
        *,
        priority: int | None = None,
        queue_timeout_s: float | None = None,
        parameters: Mapping[str, ParameterValue] | None = None,
        requested_outputs: Sequence[str] | None = None,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
    ) -> Generator[StreamResponse, None, None]:
        """Runs one request of a streaming (decoupled) model on the node's slots, and yields
        its responses as they come (see :meth:`TritonSHMClient.stream`).

        ```python
        for response in model.stream({"IMAGE": image, "COUNT": count, "DELAY_US": delay}):
            print(response.index, response["TOKEN"])
        ```

        The inputs go into one slot of the node's region, held until Triton's final response:
        a stream in flight holds one of the node's slots, as a request does, and waits for one
        as a request does (``slot_timeout_s``, ``max_waiting``). The outputs come back by value
        (NumPy arrays, whatever ``outputs_as`` says). No Ray call per stream. Stopping early
        (``break``, ``close()``, the process ending) cancels the request in Triton; its slot is
        used again once Triton is done with it.

        The options are those of :meth:`infer`, over this handle's defaults; the handle's
        ``client_timeout_s`` bounds the wait for each response.

        Yields:
            Each response with outputs, a :class:`~ray_triton_shm.StreamResponse`
            (``{output name: array}`` with its ``index`` and whether it is ``final``).

        Raises:
            StreamingModelError: the model answers each request once: call :meth:`infer`.
            StreamInterruptedError: the stream ended before Triton's final response, after a
                response (it is never sent again: it would deliver responses twice).
            TritonServerError: the model answered with an error.
            InvalidInputError: bad inputs (checked before any shared memory is touched).
            SlotTimeoutError: no slot came free within ``slot_timeout_s``.
            OverloadedError: too many callers already wait for a slot on this node.
            ModelNotLoadedError: the model is not loaded on Triton.
            ServerUnreachableError: Triton stayed unreachable for ``reconnect_timeout_s``
                before the first response.
            BlockingCallError: called on a thread that runs an event loop: use
                :meth:`stream_async` there.
        """
        refuse_on_event_loop(self.model_name, "stream()", "async for ... in stream_async()")
        options, call = self._prepare(
            priority,
            queue_timeout_s,
            parameters,
            requested_outputs,
            None,
            sequence_id,
            sequence_start,
            sequence_end,
            None,
        )
        moves = self._moves(self._bind(), MOVED, options)
        return moves.stream(lambda binding: binding.stream(inputs, options, call))

    def stream_async(
        self,
        inputs: Mapping[str, InputValue],
        *,
        priority: int | None = None,
        queue_timeout_s: float | None = None,
        parameters: Mapping[str, ParameterValue] | None = None,
        requested_outputs: Sequence[str] | None = None,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
    ) -> AsyncGenerator[StreamResponse, None]:
        """:meth:`stream` for coroutines (Serve replicas, async actors): an async iterator
        that blocks no thread (``async for response in model.stream_async(...)``). Its options
        are checked here; ``aclose()``, or cancelling the task that iterates, cancels the
        request in Triton.
        """
        options, call = self._prepare(
            priority,
            queue_timeout_s,
            parameters,
            requested_outputs,
            None,
            sequence_id,
            sequence_start,
            sequence_end,
            None,
        )

        async def responses() -> AsyncGenerator[StreamResponse, None]:
            moves = self._moves(await self._bind_async(), MOVED, options)
            streamed = moves.stream_async(lambda b: b.stream_async(inputs, options, call))
            async with contextlib.aclosing(streamed):  # closed now: cancels the request
                async for response in streamed:
                    yield response

        return responses()

    def lease(
        self,
        *,
        batch: int | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        priority: int | None = None,
        queue_timeout_s: float | None = None,
        parameters: Mapping[str, ParameterValue] | None = None,
        requested_outputs: Sequence[str] | None = None,
        outputs: Sequence[str] | None = None,
    ) -> _ModelLease:
        """Leases a slot of the model on this node: the inputs are written where Triton reads
        them, the outputs read where Triton wrote them (see :class:`~ray_triton_shm.SlotLease`).

        ```python
        with model.lease(batch=8) as lease:
            np.divide(images, 255, out=lease.inputs["INPUT0"])
            probs = lease.infer()["OUTPUT0"]  # or: await lease.infer_async()
        ```

        Use it in ``with`` or ``async with``: the slot is taken on entry with the handle's
        ``slot_timeout_s``, and the request has its ``client_timeout_s`` and keys.

        Args:
            batch: Samples in the request, 1 to ``max_batch_size`` (``None`` for a model that
                does not batch).
            shapes: Per-sample shape of each input with variable dims.
            priority: As for :meth:`infer`.
            queue_timeout_s: As for :meth:`infer`.
            parameters: As for :meth:`infer`.
            requested_outputs: As for :meth:`infer`.
            outputs: As for :meth:`infer` (deprecated).

        Raises:
            LeaseByValueError: on entry, when the model's calls here go by value
                (``transport="inline"``, or a Triton that cannot map the node's memory: call
                :meth:`infer`); an :class:`InvalidInputError` too.
            InvalidInputError: on entry, when ``batch`` or ``shapes`` do not fit the model.
            BlockingCallError: ``with`` on a thread that runs an event loop: use
                ``async with`` there.
        """
        if outputs is not None:
            requested_outputs = renamed_outputs(requested_outputs, outputs, stacklevel=2)
        name, settings = self.model_name, self._call
        own = options_without_sequence(
            name,
            priority=priority or 0,
            queue_timeout_s=queue_timeout_s,
            parameters=parameters,
            requested_outputs=requested_outputs,
        )
        options = over_defaults(self._defaults, own, priority_given=priority is not None)

        def new_lease(binding: Binding) -> SlotLease:
            return lease_with(settings.of(binding.client, name, options), batch, shapes)

        async def moves_async() -> Moves[Binding]:
            return self._moves(await self._bind_async(), RETIRED, options)

        return _ModelLease(
            name, new_lease, lambda: self._moves(self._bind(), RETIRED, options), moves_async
        )

    def _prepare(
        self,
        priority: int | None,
        queue_timeout_s: float | None,
        parameters: Mapping[str, ParameterValue] | None,
        requested_outputs: Sequence[str] | None,
        outputs_as: str | None,
        sequence_id: int | str,
        sequence_start: bool,
        sequence_end: bool,
        outputs: Sequence[str] | None,
    ) -> tuple[RequestOptions | None, CallSettings]:
        """A call's request options over the handle's defaults, and its settings."""
        if outputs is not None:
            requested_outputs = renamed_outputs(requested_outputs, outputs, stacklevel=3)
        own = request_options(
            self.model_name,
            priority=priority or 0,
            queue_timeout_s=queue_timeout_s,
            parameters=parameters,
            requested_outputs=requested_outputs,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
        )
        call = self._call
        if outputs_as is not None and outputs_as != call.outputs_as:
            call = dataclasses.replace(call, outputs_as=outputs_as)
        return over_defaults(self._defaults, own, priority_given=priority is not None), call

    def options(
        self,
        *,
        priority: int | NotGiven = NOT_GIVEN,
        queue_timeout_s: float | None | NotGiven = NOT_GIVEN,
        parameters: Mapping[str, ParameterValue] | None | NotGiven = NOT_GIVEN,
        requested_outputs: Sequence[str] | None | NotGiven = NOT_GIVEN,
        outputs_as: str | NotGiven = NOT_GIVEN,
        slot_timeout_s: float | None | NotGiven = NOT_GIVEN,
        client_timeout_s: float | None | NotGiven = NOT_GIVEN,
    ) -> ShmModel:
        """A handle like this one with other defaults for its calls, as Ray Serve's
        ``DeploymentHandle.options()``: those given replace this handle's (``parameters``
        too: they are not merged), the others stay. Both handles share this process's binding
        to the model; each pickles on its own.

        ```python
        urgent = model.options(priority=1, client_timeout_s=0.5)
        ```

        Raises:
            InvalidInputError: an option of the wrong type or range (see :meth:`infer`).
        """
        old, call = self._defaults or RequestOptions(), self._call
        handle = object.__new__(ShmModel)
        handle.__dict__.update(self.__dict__)  # not copy.copy(): that drops the binding
        handle._defaults = options_without_sequence(
            self.model_name,
            priority=_pick(priority, old.priority),
            queue_timeout_s=_pick(
                queue_timeout_s, old.queue_timeout_us / 1e6 if old.queue_timeout_us else None
            ),
            parameters=_pick(parameters, dict(old.parameters)),
            requested_outputs=_pick(requested_outputs, old.outputs),
        )
        handle._call = CallSettings(
            _pick(slot_timeout_s, call.slot_timeout_s),
            _pick(client_timeout_s, call.client_timeout_s),
            _pick(outputs_as, call.outputs_as),
        )
        return handle


def _pick(value: T | NotGiven, kept: T) -> T:
    return kept if isinstance(value, NotGiven) else value


def _autoscaling_fields(
    autoscaling: SlotAutoscaling | Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """The fields given (checked here, where the handle is made); the node actor's fill in the
    others."""
    if autoscaling is None:
        return None
    SlotAutoscaling.of(autoscaling)
    if isinstance(autoscaling, SlotAutoscaling):
        return asdict(autoscaling)
    return dict(autoscaling)


def _register(actor: Any, name: str, args: Mapping[str, Any]) -> ModelRegistration:
    return get(actor.register.remote(name, **args))  # type: ignore[no-any-return]


class _ModelLease:
    """A lease of :meth:`ShmModel.lease`: enters a lease of the model's current binding,
    binding again when the node actor restarted or the model moved to a new layout.

    Args:
        model: The model's name.
        new_lease: A lease of the model on a binding, with the call's options and settings.
        moves: Where the lease starts, and where it goes on after its layout was retired.
        moves_async: :obj:`moves` for coroutines (binds in a thread).
    """

    def __init__(
        self,
        model: str,
        new_lease: Callable[[Binding], SlotLease],
        moves: Callable[[], Moves[Binding]],
        moves_async: Callable[[], Awaitable[Moves[Binding]]],
    ) -> None:
        self._model = model
        self._new_lease = new_lease
        self._moves = moves
        self._moves_async = moves_async
        self._lease: SlotLease | None = None

    def __enter__(self) -> SlotLease:
        refuse_on_event_loop(self._model, "with lease()", "async with lease()")
        moves = self._moves()
        self._lease = moves.run(lambda binding: self._new_lease(binding).__enter__())
        return self._lease

    async def __aenter__(self) -> SlotLease:
        moves = await self._moves_async()
        self._lease = await moves.run_async(lambda binding: self._new_lease(binding).__aenter__())
        return self._lease

    def __exit__(self, *exc_info: object) -> None:
        if self._lease is not None:
            self._lease.close()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__(*exc_info)
