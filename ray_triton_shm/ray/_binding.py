"""A :class:`~ray_triton_shm.ray.ShmModel`'s life in one process: its binding to the node
actor's region of the model (through shared memory, or by value: straight to Triton either
way), the settings of its calls, and the node actor as the owner of the model's layouts, which
a call asks where to go on (see :func:`~ray_triton_shm._pools._retry.follow_model`).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

import ray

from .._client import Call, TritonSHMClient, call_with, registry_of, stream_with
from .._exceptions import (
    BlockingCallError,
    ClientClosedError,
    InvalidInputError,
    RegionReplacedError,
)
from .._inference._engine import SuspectedChange
from .._inference._inputs import InputValue
from .._inference._options import RequestOptions
from .._inference._stream import StreamResponse
from .._inference._transport import INLINE, SHM, Transport, unreachable_error
from .._pools._registry import Registry
from .._slots._slot_pool import PoolStats
from .._slots._specs import ModelSpec
from .._wire._keys import Keys
from ._actor import ModelRegistration
from ._control import control_call, get

__all__ = ["ActorLayouts", "Binding", "CallSettings", "InProcess", "refuse_on_event_loop"]


class Binding:
    """Per-process state: the actor handle, the registration, and a client on the model's
    attached region, whose slots it takes (shared with every process of the node) and whose
    requests go straight to Triton, through the region or by value.

    Args:
        actor: The node actor.
        registration: The model's registration with it.
        transport: This handle's ``transport=``: ``"auto"`` (the node pool's), ``"shm"`` (it
            must be shared memory) or ``"inline"`` (by value, on the node's slots).
        reconnect_timeout_s: How long a call waits for an unreachable Triton.
        keys: The caller's keys.
        client_options: Keyword arguments of the caller's client.

    Raises:
        SharedMemoryUnreachableError: ``transport="shm"``, and Triton cannot map the node's
            region (or this process cannot).
    """

    def __init__(
        self,
        actor: Any,
        registration: ModelRegistration,
        *,
        transport: str,
        reconnect_timeout_s: float,
        keys: Keys,
        client_options: Mapping[str, Any],
    ) -> None:
        self.actor = actor
        self.registration = registration
        self.pid = os.getpid()
        self.spec: ModelSpec = registration.spec
        client = TritonSHMClient(
            url=registration.url,
            crash_cleanup=False,
            reconnect_timeout_s=reconnect_timeout_s,
            headers=keys,
            **client_options,
        )
        pools = registry_of(client)
        try:
            #: Calls by value on the node's region: Triton never tells them it is gone.
            self._by_value = self._attach(pools, transport)
        except BaseException:
            client.close()
            raise
        self.client = client
        self._pools = pools

    def _attach(self, pools: Registry, transport: str) -> bool:
        """Attaches the node's region of the model, as ``transport`` asks; a process that
        cannot map it (another ``/dev/shm`` than the node actor's) gets a pool by value of its
        own, as large.

        Returns:
            Whether the calls go by value on the node's region.
        """
        registration, name = self.registration, self.spec.name
        if transport == SHM and registration.transport == INLINE:
            reason = registration.transport_reason
            raise unreachable_error(name, registration.url, [f"the node actor found: {reason}"])
        chosen = Transport(registration.transport, registration.transport_reason)
        if transport == INLINE and not chosen.by_value:
            chosen = Transport(INLINE, "transport='inline' was asked for (this handle)", INLINE)
        attached = pools.attach_region(
            self.spec,
            registration.region_name,
            registration.slot_count,
            self._ensure_registered,
            registration.generation,
            chosen,
            batching=registration.batching,
        )
        if attached:
            return chosen.by_value
        reason = (
            f"this process cannot map the node actor's region /dev/shm/"
            f"{registration.region_name} (another /dev/shm than the actor's): by value, on "
            "slots of this process alone"
        )
        if transport == SHM:
            raise unreachable_error(name, registration.url, [reason])
        pools.own_by_value(self.spec, registration.slot_count, reason)
        return False

    def _ensure_registered(self) -> None:
        actor, name = self.actor, self.spec.name
        incarnation, generation = self.registration.incarnation, self.registration.generation
        control_call(lambda: get(actor.ensure_registered.remote(name, incarnation, generation)))

    def infer(
        self, inputs: Mapping[str, InputValue], options: RequestOptions | None, call: CallSettings
    ) -> Any:
        self._check_region()
        return call.of(self.client, self.spec.name, options).infer(inputs)

    async def infer_async(
        self, inputs: Mapping[str, InputValue], options: RequestOptions | None, call: CallSettings
    ) -> Any:
        self._check_region()
        return await call.of(self.client, self.spec.name, options).infer_async(inputs)

    def stream(
        self, inputs: Mapping[str, InputValue], options: RequestOptions | None, call: CallSettings
    ) -> Generator[StreamResponse, None, None]:
        """The responses of one request of a streaming model, on the node's slots (see
        :meth:`TritonSHMClient.stream`)."""
        self._check_region()
        return call.stream(self.client, self.spec.name, options, inputs)

    def stream_async(
        self, inputs: Mapping[str, InputValue], options: RequestOptions | None, call: CallSettings
    ) -> AsyncGenerator[StreamResponse, None]:
        """:meth:`stream` on the running event loop."""
        self._check_region()
        return call.stream_async(self.client, self.spec.name, options, inputs)

    def _check_region(self) -> None:
        """Calls by value never hear from Triton that the node's region is gone (the node
        actor restarted, or stopped): they ask the region.

        Raises:
            RegionReplacedError: it is gone: bind again.
        """
        if self._by_value and self._pools.region_removed(self.spec.name):
            raise RegionReplacedError(
                f"model {self.spec.name!r}: the node actor's region "
                f"{self.registration.region_name} is gone (the actor restarted or stopped); "
                "bind again",
                model=self.spec.name,
                incarnation=self.registration.incarnation,
            )

    @property
    def stats(self) -> PoolStats:
        """This process's share of the node's pool of the model, and its transport."""
        return self.client.shm_stats(self.spec.name)

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class CallSettings:
    """What a handle's call takes besides Triton's request options."""

    slot_timeout_s: float | None
    client_timeout_s: float | None
    outputs_as: str

    def of(self, client: TritonSHMClient, model: str, options: RequestOptions | None) -> Call:
        """A call of ``model`` with these settings and ``options`` (checked), on ``client``."""
        return call_with(
            client,
            model,
            options,
            slot_timeout_s=self.slot_timeout_s,
            client_timeout_s=self.client_timeout_s,
            outputs_as=self.outputs_as,
        )

    def stream(
        self,
        client: TritonSHMClient,
        model: str,
        options: RequestOptions | None,
        inputs: Mapping[str, InputValue],
    ) -> Generator[StreamResponse, None, None]:
        """The responses of a streaming call of ``model`` with these settings and ``options``
        (checked), on ``client``: NumPy arrays by value, whatever :attr:`outputs_as` says."""
        return stream_with(
            client,
            model,
            options,
            slot_timeout_s=self.slot_timeout_s,
            client_timeout_s=self.client_timeout_s,
        ).stream(inputs)

    def stream_async(
        self,
        client: TritonSHMClient,
        model: str,
        options: RequestOptions | None,
        inputs: Mapping[str, InputValue],
    ) -> AsyncGenerator[StreamResponse, None]:
        """:meth:`stream` on the running event loop."""
        return stream_with(
            client,
            model,
            options,
            slot_timeout_s=self.slot_timeout_s,
            client_timeout_s=self.client_timeout_s,
        ).stream_async(inputs)


class InProcess:
    """A handle's binding in this process, shared with the handles :meth:`ShmModel.options`
    makes of it (never pickled)."""

    def __init__(self) -> None:
        self.binding: Binding | None = None
        self.lock = threading.Lock()
        self.input_checked_at = float("-inf")

    def current(self) -> Binding | None:
        """The binding, if it is this process's (a forked child's is its parent's)."""
        binding = self.binding
        return binding if binding is not None and binding.pid == os.getpid() else None

    def get(self, make: Callable[[], Binding]) -> Binding:
        """This process's binding, made by ``make`` if there is none yet."""
        binding = self.current()
        if binding is not None:
            return binding
        with self.lock:
            binding = self.current()  # None too for a forked child: its parent's is not its own
            if binding is None:
                binding = self.binding = make()
            return binding

    def replace(self, stale: Binding | None, make: Callable[[], Binding] | None) -> None:
        """Forgets ``stale`` (the node actor restarted, or the model moved to a new layout)
        for what ``make`` makes, or for none: the next call binds again. Unless another call
        replaced it first (``stale`` then is not current; ``None``: whatever is)."""
        with self.lock:
            old = self.binding
            if stale is not None and old is not stale:
                return  # another call replaced it first, and closes it
            self.binding = None if make is None else make()
        if old is not None:  # other calls may still finish on it: closed without waiting
            threading.Thread(target=old.close, daemon=True).start()


class ActorLayouts:
    """The node actor as the owner of a model's layouts (:class:`LayoutOwner`): it reads
    Triton's config once per node and change; a handle asks it and binds to what it says.


    Args:
        model: The model's name.
        here: The process's binding.
        bind: The binding now (made if there is none).
        bind_to: A binding to a registration of the model (on the same actor).
    """

    def __init__(
        self,
        model: str,
        here: InProcess,
        bind: Callable[[], Binding],
        bind_to: Callable[[Any, ModelRegistration], Binding],
    ) -> None:
        self._model = model
        self._here = here
        self._bind = bind
        self._bind_to = bind_to

    def replacement(self, binding: Binding, exc: BaseException) -> Binding | None:
        if isinstance(exc, ClientClosedError):
            # Another call of this process bound anew meanwhile, and closed this binding.
            return None if self._here.binding is binding else self._bind()
        return self._ask(binding, None)

    def newer(
        self, binding: Binding, exc: BaseException, since: float, *, deadline: float | None = None
    ) -> Binding | None:
        here = self._here
        if isinstance(exc, InvalidInputError):
            if here.input_checked_at > since:
                return None  # asked lately: refused inputs are the caller's
            here.input_checked_at = time.monotonic()
        proof = exc.error if isinstance(exc, SuspectedChange) and exc.proven else None
        return self._ask(binding, proof, deadline)

    def _ask(
        self, binding: Binding, proof: BaseException | None, deadline: float | None = None
    ) -> Binding | None:
        """The binding of the model's current layout, as the node actor says (reading a
        change ``proof`` proves until ``deadline`` at the latest, a ``time.monotonic()``);
        ``None`` if it is ``binding``'s."""
        actor, name = binding.actor, self._model
        incarnation, generation = binding.registration.incarnation, binding.registration.generation
        catch_up_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        registration: ModelRegistration = control_call(
            lambda: get(actor.follow.remote(name, incarnation, generation, proof, catch_up_s))
        )
        if registration.generation == generation:
            return None
        self._here.replace(binding, lambda: self._bind_to(actor, registration))
        return self._bind()


def refuse_on_event_loop(model: str, call: str, instead: str) -> None:
    """Raises :class:`BlockingCallError` on a thread that runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise BlockingCallError(
        f"model {model!r}: {call} blocks, and this thread runs an asyncio event loop (an "
        f"async def method of a Serve deployment?): it would stop every other request of the "
        f"loop until it returned; use {instead} there",
        model=model,
    )


async def awaited(ref: Any) -> Any:
    try:
        return await ref
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        raise (cause if isinstance(cause, BaseException) else exc) from None
