"""``ShmModel``: a small picklable handle to a model served by the node actor.

Pass it to Serve deployments and Ray Data workers. In the process that uses it, it binds lazily
to the node actor of that process's node and registers the model (a no-op if already done).
Calls then take the zero-copy path: the process holds a few slots of its own (claimed from the
actor on first need, each attached once), writes inputs straight into one, makes one small Ray
call, and reads the outputs straight back. Only shapes travel through Ray. Where a region cannot
be attached (another ``/dev/shm``), arrays are passed by value through the actor instead.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import PendingCallsLimitExceeded, RayActorError

from .._exceptions import OverloadedError
from .._inputs import Batch, InputValue, prepare_batch
from .._outputs import OutputAssembler, empty_outputs
from .._pool import SlotPool
from .._shm import SharedMemoryRegion
from .._specs import ModelSpec, SlotViews
from ._actor import ModelRegistration, SlotClaim, StaleClaimError, get_node_actor

__all__ = ["ShmModel"]


class _Binding:
    """Per-process state: the actor handle, the registration, this process's claimed slots.

    Local slot ``i`` is claimed from the actor the first time it is needed; the local pool
    (LIFO) keeps the number claimed down to the concurrency actually used.
    """

    def __init__(
        self, actor: Any, registration: ModelRegistration, local_slots: int, zero_copy: bool
    ) -> None:
        self.actor = actor
        self.registration = registration
        self.spec: ModelSpec = registration.spec
        self.zero_copy = zero_copy
        self.local = SlotPool(local_slots, name=registration.spec.name)
        self.claims: list[SlotClaim | None] = [None] * local_slots
        self.regions: list[SharedMemoryRegion | None] = [None] * local_slots
        self.views: list[SlotViews | None] = [None] * local_slots
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _release_claims, actor, self.claims)

    def slot(self, index: int) -> tuple[SlotClaim, SlotViews] | None:
        """The claim and slot views behind local slot ``index``; ``None``: go by value."""
        claim, views = self.claims[index], self.views[index]
        if claim is not None and views is not None:
            return claim, views
        with self._lock:
            if self.claims[index] is None:
                claim = _call(_submit(self.actor.claim, self.spec.name, os.getpid()))
                if claim is None:
                    return None  # the node's claim budget is spent
                try:
                    region = SharedMemoryRegion.attach(claim.region_name)
                except OSError:
                    self.actor.release_claim.remote(claim.claim_id, claim.incarnation)
                    self.zero_copy = False  # no shared /dev/shm with the actor
                    return None
                self.regions[index] = region
                self.views[index] = SlotViews(self.spec, claim.layout, region.buffer, 0)
                self.claims[index] = claim
            claim, views = self.claims[index], self.views[index]
            assert claim is not None and views is not None
            return claim, views

    def close(self) -> None:
        self.views = [None] * len(self.views)
        refs = self._finalizer() or []
        if not _on_event_loop():  # an event loop (a Serve replica) is never blocked
            try:
                ray.get(refs, timeout=30)
            except Exception:
                pass  # the actor is gone or restarting: its sweeper or reclaim takes them back
        for region in self.regions:
            if region is not None:
                region.close()


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _release_claims(actor: Any, claims: list[SlotClaim | None]) -> list[Any]:
    refs = []
    for claim in claims:
        if claim is not None:
            try:
                refs.append(actor.release_claim.remote(claim.claim_id, claim.incarnation))
            except Exception:
                pass  # Ray is shutting down; the actor's sweeper takes them back
    return refs


class ShmModel:
    """A model behind the node actor, callable from any process on the node.

    Only configuration is pickled; the actor handle and the shm mappings are made in the process
    that calls :meth:`infer`.

    Args:
        model_name: The model on the node's Triton.
        inputs: Input specs (``(name, shape, dtype)``), or ``None`` for the model config.
        outputs: Output specs, or ``None`` for the model config.
        max_batch_size: Samples per slot, or ``None`` for the model config.
        pool_size: Slots of the actor's by-value pool for this model; ``None`` for the node
            actor's ``slots``.
        max_shapes: Maxima for ``-1`` dims, e.g. ``{"INPUT0": (16,)}``.
        model_version: Model version (``""`` lets Triton choose).
        url: Triton's gRPC address on the node (see :func:`get_node_actor`).
        zero_copy: Write and read shared memory directly when possible; ``False`` always passes
            arrays by value through the actor.
        local_slots: Zero-copy calls this process runs at once; each uses a slot of its own
            (one batch of memory) claimed from the actor when first needed.
        slot_timeout_s: How long a call waits for a free local slot (``None``: no limit).
        actor_options: Extra keyword arguments for :func:`get_node_actor` (``slots``,
            ``max_waiting``, ``max_claims``), used if this call creates the actor.

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
        max_shapes: Mapping[str, Sequence[int]] | None = None,
        model_version: str = "",
        url: str | None = None,
        zero_copy: bool = True,
        local_slots: int = 4,
        slot_timeout_s: float | None = None,
        actor_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self._register_args: dict[str, Any] = {
            "inputs": list(inputs) if inputs is not None else None,
            "outputs": list(outputs) if outputs is not None else None,
            "max_batch_size": max_batch_size,
            "pool_size": pool_size,
            "model_version": model_version,
            "max_shapes": dict(max_shapes) if max_shapes is not None else None,
        }
        self._url = url
        self._zero_copy = zero_copy
        self._local_slots = local_slots
        self._slot_timeout_s = slot_timeout_s
        self._actor_options = dict(actor_options or {})
        self._binding: _Binding | None = None
        self._bind_lock = threading.Lock()

    # ---------------------------------------------------------------- pickling: config only

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_binding"] = None
        del state["_bind_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ShmModel({self.model_name!r}, zero_copy={self._zero_copy})"

    # ---------------------------------------------------------------- binding

    def _bind(self) -> _Binding:
        binding = self._binding
        if binding is not None:
            return binding
        with self._bind_lock:
            if self._binding is None:
                actor = get_node_actor(url=self._url, **self._actor_options)
                registration = _call(
                    _submit(actor.register, self.model_name, **self._register_args)
                )
                same_node = registration.node_id == ray.get_runtime_context().get_node_id()
                self._binding = _Binding(
                    actor, registration, self._local_slots, self._zero_copy and same_node
                )
            return self._binding

    async def _bind_async(self) -> _Binding:
        binding = self._binding
        if binding is not None:
            return binding
        # Binding is rare (once per process) and made of short control calls.
        return await asyncio.to_thread(self._bind)

    def _rebind(self, stale: _Binding) -> None:
        with self._bind_lock:
            if self._binding is stale:
                self._binding = None
                stale.close()

    @property
    def spec(self) -> ModelSpec:
        """The model's spec as registered with the node actor (binds if needed)."""
        return self._bind().spec

    @property
    def zero_copy(self) -> bool:
        """Whether calls in this process write shared memory directly (binds if needed)."""
        binding = self._bind()
        return binding.zero_copy and binding.slot(0) is not None

    def close(self) -> None:
        """Gives this process's slots back to the node actor (also done at exit).

        Waits (up to 30 s) for the actor to take them back, except on an event loop's thread,
        where the releases are sent and not waited for.
        """
        with self._bind_lock:
            binding, self._binding = self._binding, None
        if binding is not None:
            binding.close()

    # ---------------------------------------------------------------- inference

    def infer(self, inputs: Mapping[str, InputValue]) -> dict[str, np.ndarray]:
        """Runs the model on a batch; blocks until the outputs are back.

        Raises:
            InvalidInputError: bad inputs (checked here, before any shared memory is touched).
            OverloadedError: too many of this caller's calls are already queued.
            TritonServerError: Triton answered with an error.
        """
        for attempt in (0, 1):
            binding = self._bind()
            try:
                if not binding.zero_copy:
                    return _call(_submit(binding.actor.infer, self.model_name, inputs))
                batch = prepare_batch(binding.spec, inputs)
                if batch.size == 0:
                    return empty_outputs(binding.spec)
                index = binding.local.acquire(self._slot_timeout_s)
                try:
                    slot = binding.slot(index)
                    if slot is None:
                        return _call(_submit(binding.actor.infer, self.model_name, inputs))
                    claim, views = slot
                    exchange = _Exchange(binding, claim, views, batch)
                    for start, stop in batch.chunks():
                        exchange.receive(start, _call(exchange.submit(start, stop)))
                    return exchange.result()
                finally:
                    binding.local.release(index)
            except (StaleClaimError, RayActorError):
                if attempt:
                    raise
                self._rebind(binding)  # the actor restarted: new regions, new claims
        raise AssertionError("unreachable")

    async def infer_async(self, inputs: Mapping[str, InputValue]) -> dict[str, np.ndarray]:
        """:meth:`infer` for coroutines (e.g. Ray Serve replicas): blocks no thread.

        Cancelling is safe: a local slot is reused only once the actor has answered.
        """
        for attempt in (0, 1):
            binding = await self._bind_async()
            try:
                if not binding.zero_copy:
                    return await _acall(_submit(binding.actor.infer, self.model_name, inputs))
                batch = prepare_batch(binding.spec, inputs)
                if batch.size == 0:
                    return empty_outputs(binding.spec)
                index = await binding.local.acquire_async(self._slot_timeout_s)
                ref = None
                try:
                    slot = binding.slot(index) if binding.claims[index] else None
                    if slot is None:
                        slot = await asyncio.to_thread(binding.slot, index)
                    if slot is None:
                        return await _acall(_submit(binding.actor.infer, self.model_name, inputs))
                    claim, views = slot
                    exchange = _Exchange(binding, claim, views, batch)
                    for start, stop in batch.chunks():
                        ref = exchange.submit(start, stop)
                        exchange.receive(start, await _acall(ref))
                        ref = None
                    return exchange.result()
                finally:
                    if ref is None:
                        binding.local.release(index)
                    else:  # cancelled mid-call: Triton may still write into the slot
                        _release_when_done(binding.local, index, ref)
            except (StaleClaimError, RayActorError):
                if attempt:
                    raise
                self._rebind(binding)
        raise AssertionError("unreachable")


def _release_when_done(pool: SlotPool, index: int, ref: Any) -> None:
    def wait_then_release() -> None:
        try:
            ray.wait([ref], timeout=None)
        finally:
            pool.release(index)

    threading.Thread(target=wait_then_release, daemon=True).start()


class _Exchange:
    """One zero-copy call: writes each chunk into the claimed slot, submits it, reads it back."""

    def __init__(self, binding: _Binding, claim: SlotClaim, views: SlotViews, batch: Batch) -> None:
        self._actor = binding.actor
        self._claim = claim
        self._views = views
        self._batch = batch
        self._outputs = OutputAssembler(batch.spec, batch.size)

    def submit(self, start: int, stop: int) -> Any:
        """Writes samples ``start:stop`` into the slot and asks the actor to run them."""
        written = self._batch.write_chunk(self._views, start, stop)
        rows = stop - start if self._batch.batched else None
        claim = self._claim
        return _submit(
            self._actor.infer_claimed,
            claim.claim_id,
            claim.incarnation,
            rows,
            self._batch.sample_shapes,
            written,
        )

    def receive(self, start: int, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Copies a chunk's outputs out of the slot."""
        self._outputs.add(self._views, start, shapes.items())

    def result(self) -> dict[str, np.ndarray]:
        return self._outputs.result()


def _submit(method: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return method.remote(*args, **kwargs)
    except PendingCallsLimitExceeded as exc:
        raise OverloadedError(
            f"the node actor already has too many queued calls from this process ({exc}); "
            "slow down, or create the node actor with a larger max_waiting",
        ) from exc


def _call(ref: Any) -> Any:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        raise _unwrap(exc) from None


async def _acall(ref: Any) -> Any:
    try:
        return await ref
    except ray.exceptions.RayTaskError as exc:
        raise _unwrap(exc) from None


def _unwrap(exc: ray.exceptions.RayTaskError) -> BaseException:
    """Our own errors raised inside the actor come back as themselves."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
