"""A client's pools, one per registered model: created and registered in Triton, attached,
laid out anew when the model changes on Triton, and released.

The registry owns what looks after the pools besides their callers: the settler (slots given
up while Triton still runs their request, :mod:`._abandoned`) and the scaler (pools that follow
their load, :mod:`._scaling`). It is the owner of its pools' layouts for the one rule of where
a call goes on when its pool stops it (:func:`._retry.follow_model`, through
:meth:`Registry.next_pool`). :class:`~.._client.TritonSHMClient` is a facade
over it; the Ray node actor and its callers use it through :func:`.._client.registry_of`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence

import grpc
from tritonclient.utils import InferenceServerException

from .._exceptions import (
    ClientClosedError,
    ModelNotRegisteredError,
    ModelSpecError,
    TritonServerError,
)
from .._inference._engine import SuspectedChange
from .._inference._model_change import Registration
from .._inference._model_pool import ModelPool, PoolRetired
from .._inference._node_batching import NodeBatching, batching_refusal
from .._inference._options import RequestOptions
from .._inference._transport import (
    INLINE,
    SHM,
    Transport,
    Unmappable,
    attempts,
    probe,
    refusal_reason,
    unopenable_cause,
    unreachable_error,
)
from .._slots._header import RegionHeader
from .._slots._memory import (
    BY_VALUE,
    CALL_TIMEOUT_S,
    CUDA,
    SYSTEM,
    ByValueMemory,
    SlotMemory,
    check_numeric,
    new_memory,
    open_memory,
    region_bytes,
)
from .._slots._shared_slots import SharedSlots
from .._slots._shm import SharedMemoryRegion, ensure_room, mib, new_region_name, slot_key
from .._slots._sizing import SlotAutoscaling
from .._slots._slot_pool import PoolStats, SlotPool, SlotSource
from .._slots._specs import ModelSpec, SlotLayout
from .._wire._channel import Channel
from .._wire._reconnect import Reconnect
from .._wire._triton_errors import is_unopenable, status_and_message, translate_error
from ._abandoned import Settler, unregister_slots
from ._model_sync import Follower
from ._reaper import watch
from ._retry import follow_model
from ._scaling import Scaler, default_shm_budget
from ._snapshot import PoolSnapshot
from ._transport_sync import Rerouter

__all__ = ["Registry", "SlotMaker"]

logger = logging.getLogger(__name__)

#: How long closing waits for in-flight requests before unmapping their memory anyway.
CLOSE_WAIT_S = 30.0

#: Makes a new pool's slots: ``(region name, header, model, size now, capacity)``.
SlotMaker = Callable[[str, RegionHeader, str, int, int], SlotSource]


def _own_slots(
    region: str, header: RegionHeader, model: str, size: int, capacity: int
) -> SlotSource:
    return SlotPool(size, name=model, capacity=capacity)


@dataclasses.dataclass(frozen=True)
class _Keepers:
    """What looks after the pools besides the registry: all its finalizer may hold."""

    triton: Channel
    settler: Settler
    scaler: Scaler
    #: Threads releasing pools replaced by a new layout: closing waits for them.
    retiring: list[threading.Thread] = dataclasses.field(default_factory=list)

    def stop(self) -> None:
        for thread in list(self.retiring):
            thread.join(CLOSE_WAIT_S)
        self.settler.stop()
        self.scaler.stop()


def _batching(spec: ModelSpec, registration: Registration) -> NodeBatching | None:
    """The node batching of a pool laid out for ``spec``: as registered, unless the model
    changed on Triton into one that cannot be batched (its calls then go alone)."""
    policy = registration.node_batching
    if policy is None or batching_refusal(spec, policy) is None:
        return policy
    logger.warning(
        "ray-triton-shm: model %r is no longer batched on the node: %s",
        spec.name,
        batching_refusal(spec, policy),
    )
    return None


def _release_pools(pools: dict[str, ModelPool], keepers: _Keepers) -> None:
    """Unregisters and unlinks every pool; the registry's finalizer, so it never sees it."""
    while pools:
        _, pool = pools.popitem()
        _release_pool(pool, keepers, CLOSE_WAIT_S)
    keepers.stop()


def _release_pool(pool: ModelPool, keepers: _Keepers, wait_s: float) -> None:
    """Waits for the pool's callers (up to ``wait_s``; not for arrays kept from a lease), then
    unregisters and unlinks it, once Triton is done with the requests given up on it (within
    the same wait). Memory a caller still holds stays mapped until the caller lets go."""
    deadline = time.monotonic() + wait_s
    keepers.scaler.forget(pool)
    all_free = pool.slots.close(wait_s=wait_s)
    keepers.settler.forget(pool)
    if pool.board is not None:
        pool.board.close()
    if not pool.owned:  # attached: the owner unregisters and unlinks it
        if all_free:
            pool.memory.release()
            pool.region.close()
        return
    held: list[int] = list(range(pool.memory.slot_count))
    try:
        left_s = max(0.0, deadline - time.monotonic())
        triton = keepers.triton
        held = unregister_slots(
            triton.stub, pool.memory, pool.slot_keys, triton.keys.metadata(), in_use_wait_s=left_s
        )
    finally:
        pool.region.unlink()
        if all_free:
            pool.memory.release(held)
            pool.region.close()


class Registry:
    """The pools of one client, by model.

    Args:
        triton: The way to Triton.
        crash_cleanup: Whether a watchdog process takes back this process's regions if it
            dies without closing (see :mod:`._reaper`).
        config_check_interval_s: How often the config of a model whose pool follows it is
            compared with the pool, in the background (``None``: only when a request runs
            into a change).
        shm_budget_bytes: The most bytes of ``/dev/shm`` the pools may hold (``None``: 90% of
            ``/dev/shm``).
    """

    def __init__(
        self,
        triton: Channel,
        *,
        crash_cleanup: bool,
        config_check_interval_s: float | None,
        shm_budget_bytes: int | None,
    ) -> None:
        self._triton = triton
        self._crash_cleanup = crash_cleanup
        self._config_check_interval_s = config_check_interval_s
        self._make_slots: SlotMaker = _own_slots  # or shared: share_slots()
        self._pools: dict[str, ModelPool] = {}
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self.closed = False
        self._swept = False
        self._settler = Settler(triton.stub, triton.keys)
        budget = default_shm_budget() if shm_budget_bytes is None else shm_budget_bytes
        self._scaler = Scaler(budget, self._pools)
        self._keepers = _Keepers(triton, self._settler, self._scaler)
        self._follower = Follower(
            triton,
            self._replace,
            config_check_interval_s=config_check_interval_s,
            closed=lambda: self.closed,
        )
        self._rerouter = Rerouter(
            triton, self._replace, self.register_slots, interval_s=config_check_interval_s
        )
        # Captures the pools and their keepers, never self: the registry can still be collected.
        self._finalizer = weakref.finalize(self, _release_pools, self._pools, self._keepers)

    # ------------------------------------------------------------------ the pools

    def get(self, model_name: str) -> ModelPool:
        """The model's pool now.

        Raises:
            ClientClosedError: the client is closed.
            ModelNotRegisteredError: the model has no pool.
        """
        pool = self._pools.get(model_name)
        if pool is None:
            self.check_open()
            raise ModelNotRegisteredError(
                f"model {model_name!r} has no shared-memory pool: call "
                f"register_shm_model({model_name!r}, ...) first (registered: "
                f"{sorted(self._pools)})",
                model=model_name,
            )
        return pool

    @property
    def specs(self) -> dict[str, ModelSpec]:
        """The models with a pool, and their specs."""
        return {name: pool.spec for name, pool in list(self._pools.items())}

    def stats(self, model_name: str) -> PoolStats:
        """The model's slots in use and callers waiting, its size now and its bounds."""
        pool = self.get(model_name)
        now = PoolSnapshot.of(pool)
        return PoolStats(
            size=now.size,
            in_use=now.in_use,
            waiting=now.waiting,
            abandoned=now.abandoned,
            min_size=now.min_size,
            max_size=now.max_size,
            limited_by=now.limited_by,
            shm_bytes=now.shm_bytes,
            protocol="http" if self._triton.http is not None and _over_http(pool) else "grpc",
            protocol_reason=_protocol_reason(pool, self._triton.protocol_reason),
            transport=pool.transport.kind,
            transport_reason=pool.transport.reason,
            node_batching=now.node_batching,
            rows_per_request=now.rows_per_request,
            rows_histogram=now.rows_by_bound,
            company_waits=now.company_waits,
            company_wait_mean_us=now.company_wait_mean_us,
        )

    def check_open(self) -> None:
        """Raises :class:`ClientClosedError` once the client is closed."""
        if self.closed:
            raise ClientClosedError("the TritonSHMClient is closed")

    def register(
        self,
        model_name: str,
        registration: Registration,
        sizing: int | SlotAutoscaling,
        *,
        replace: bool,
    ) -> ModelSpec:
        """Gives the model a pool as ``registration`` asks (its specs read from Triton's config
        where it leaves them out); a no-op for the same specs, size and memory.

        Raises:
            ModelSpecError: the model has a pool with other specs and ``replace`` is false.
        """
        self.check_open()
        spec = registration.resolve(
            model_name, lambda: self._triton.model_config(model_name, registration.model_version)
        )
        if registration.node_batching is not None:
            refusal = batching_refusal(spec, registration.node_batching)
            if refusal is not None:
                raise refusal
        with self._lock:
            existing = self._pools.get(model_name)
            if existing is None:
                self._pools[model_name] = self._create(spec, sizing, registration)
                return spec
            same_memory = existing.registration is None or (
                existing.registration.memory,
                existing.registration.device,
                existing.registration.transport,
                existing.registration.node_batching,
            ) == (
                registration.memory,
                registration.device,
                registration.transport,
                registration.node_batching,
            )
            if existing.spec == spec and existing.sizing == sizing and same_memory:
                return spec
            # The same request of a pool that follows the model: the model changed meanwhile.
            follows = existing.registration == registration and registration.follows
            if not (replace or (follows and existing.sizing == sizing)):
                raise ModelSpecError(
                    f"model {model_name!r} is already registered with other specs "
                    f"({_sizing_text(existing.sizing)}, memory {existing.memory.kind!r}, "
                    f"transport {existing.transport.asked!r}, {existing.spec}); pass "
                    "replace=True, "
                    "or call unregister_shm_model first",
                    model=model_name,
                )
        self._replace(existing, spec, sizing, registration)
        return spec

    def sweep_once(self, model_name: str, reclaim: Callable[[], object]) -> None:
        """Before the first pool: ``reclaim`` drops Triton's registrations of crashed processes,
        which pin its memory (best effort: a registration says what is wrong)."""
        if self._swept:
            return
        try:
            self._triton.reconnect(model_name).call(reclaim)
            self._swept = True
        except InferenceServerException:
            pass

    def attach_region(
        self,
        spec: ModelSpec,
        region_name: str,
        slot_count: int,
        reregister: Callable[[], None],
        generation: int = 0,
        transport: Transport | None = None,
        batching: NodeBatching | None = None,
    ) -> bool:
        """Internal API for the Ray layer: uses a region somebody else owns and registered
        (the node actor), on its slots shared by every process of the machine (see
        :class:`SharedSlots`); replaces an earlier attachment of the model.

        Args:
            spec: The model's spec, as the region is laid out for it.
            region_name: The region.
            slot_count: Slots the region has room for.
            reregister: Asks the owner to register the region in Triton again (after a
                restart of Triton).
            generation: The layout's generation (grows with each new layout of the model).
            transport: How the owner's pool reaches Triton, and why; one by value uses the
                region's slots as locks alone (a caller by value of a pool in shared memory
                too).
            batching: The owner's node batching of the model (``None``: none).

        Returns:
            ``False`` when this process cannot map the region (another ``/dev/shm``).

        Raises:
            CudaError: a region in GPU memory on a GPU this process does not see.
        """
        self.check_open()
        try:
            region = SharedMemoryRegion.attach(region_name)
        except OSError:
            return False
        layout = SlotLayout.for_model(spec)
        try:
            header = RegionHeader.open(
                region.buffer, slot_count, region=region_name, model=spec.name
            )
            if transport is not None and transport.by_value:
                memory: SlotMemory = ByValueMemory(region, layout, slot_count)
            else:
                memory = open_memory(region, layout, slot_count, model=spec.name)
        except BaseException:
            region.close()
            raise
        try:
            slots = SharedSlots(region.name, header, slot_count, model=spec.name)
        except OSError:
            memory.release()
            region.close()
            return False
        try:
            pool = ModelPool.over(
                spec,
                memory,
                slots,
                header,
                reregister,
                generation=generation,
                transport=transport,
                batching=batching,
            )
            if memory.kind == SYSTEM:
                self._triton.prove_http(pool.slot_keys[0])
        except BaseException:
            slots.close(wait_s=0)
            memory.release()
            region.close()
            raise
        self._install(pool)
        return True

    def own_by_value(self, spec: ModelSpec, slot_count: int, reason: str) -> None:
        """Internal API for the Ray layer: a pool of ``slot_count`` slots by value, of a
        process that cannot map its node actor's region of the model (``reason``)."""
        registration = Registration(
            inputs=spec.inputs,
            outputs=spec.outputs,
            max_batch_size=spec.max_batch_size,
            model_version=spec.version,
            transport=INLINE,
        )
        pool = self._create_in(BY_VALUE, spec, slot_count, registration, 0, None, [reason])
        logger.info("ray-triton-shm: model %r sends its tensors by value: %s", spec.name, reason)
        self._install(pool)

    def _install(self, pool: ModelPool) -> None:
        """Makes ``pool`` its model's, releasing the one it replaces (if any)."""
        with self._lock:
            stale = self._pools.get(pool.spec.name)
            self._pools[pool.spec.name] = pool
        if stale is not None:
            _release_pool(stale, self._keepers, CLOSE_WAIT_S)

    def region_removed(self, model_name: str) -> bool:
        """Internal API for the Ray layer: whether the region of an attached model is gone
        (its owner released it, or died)."""
        slots = self.get(model_name).slots
        return isinstance(slots, SharedSlots) and slots.region_removed()

    def share_slots(self, *, max_waiting: int) -> None:
        """Internal API for the Ray node actor: the pools made from now on hand their slots
        out through their region, to every process of the machine (:class:`SharedSlots`),
        with at most ``max_waiting`` callers waiting for one."""

        def shared(
            region: str, header: RegionHeader, model: str, size: int, capacity: int
        ) -> SlotSource:
            header.configure(max_waiting=max_waiting)
            return SharedSlots(region, header, capacity, model=model)

        self._make_slots = shared

    def unregister(self, model_name: str) -> None:
        """Releases the model's pool (after its requests in flight); idempotent."""
        with self._lock:
            pool = self._pools.pop(model_name, None)
        if pool is not None:
            _release_pool(pool, self._keepers, CLOSE_WAIT_S)

    def close(self) -> None:
        """Releases every pool; idempotent. A close called meanwhile waits for the first."""
        self.closed = True  # refuses new requests at once
        with self._close_lock:
            self._finalizer()

    # ------------------------------------------------------------------ creating a pool

    def _create(
        self,
        spec: ModelSpec,
        sizing: int | SlotAutoscaling,
        registration: Registration,
        generation: int = 0,
        initial: int | None = None,
        *,
        announce: bool = True,
    ) -> ModelPool:
        """A new pool for ``spec``, in the first memory of :func:`.._inference._transport.attempts`
        that Triton maps (registered in Triton, proven by a probe request), else by value (said in
        the log if ``announce``); one that follows its load starts with ``initial`` slots
        (default: its ``min_slots``), its region room for the most.

        Raises:
            SharedMemoryUnreachableError: ``transport="shm"``, and Triton maps no memory of
                this process.
        """
        failures: list[Unmappable] = []
        for kind in attempts(registration.transport, registration.memory):
            reasons = [str(failure) for failure in failures]
            try:
                pool = self._create_in(
                    kind, spec, sizing, registration, generation, initial, reasons
                )
            except Unmappable as exc:
                failures.append(exc)
                continue
            if failures and announce:
                logger.info(
                    "ray-triton-shm: model %r sends its tensors %s: %s",
                    spec.name,
                    "by value" if pool.by_value else f"through {kind} shared memory",
                    pool.transport.reason,
                )
            return pool
        raise unreachable_error(spec.name, self._triton.url, failures)

    def _create_in(
        self,
        kind: str,
        spec: ModelSpec,
        sizing: int | SlotAutoscaling,
        registration: Registration,
        generation: int,
        initial: int | None,
        reasons: Sequence[str],
    ) -> ModelPool:
        """A new pool in memory of ``kind``, registered in Triton and proven mapped there
        (one by value: registered nowhere, after ``reasons`` the others failed).

        Raises:
            Unmappable: Triton cannot map this memory (nothing was left behind).
        """
        layout = SlotLayout.for_model(spec)
        if kind == CUDA:
            check_numeric(spec)
        count, capacity = _slot_counts(sizing, initial)
        batching = _batching(spec, registration)
        rows = kind == BY_VALUE and batching is not None
        region = self._new_region(kind, spec, layout, count, capacity, rows=rows)
        try:
            memory = new_memory(
                kind,
                region,
                layout,
                capacity,
                gpu=registration.device,
                triton_device_id=registration.triton_device_id,
                model=spec.name,
            )
        except BaseException:
            region.unlink()
            region.close()
            raise
        keys = [slot_key(region.name, slot) for slot in range(capacity)]
        registered = False
        try:
            if kind != BY_VALUE:
                self.register_slots(memory, keys, model=spec.name)
                registered = True
            why = self._proof(kind, spec, memory, keys[0], registration, reasons)
            header = RegionHeader(region.buffer, capacity, region=region.name)
            header.set_size(count)
            header.set_bounds(count if isinstance(sizing, int) else sizing.min_slots)
            slots = self._make_slots(region.name, header, spec.name, count, capacity)
            pool = ModelPool.over(
                spec,
                memory,
                slots,
                header,
                registration=registration,
                generation=generation,
                sizing=sizing,
                transport=Transport(
                    INLINE if kind == BY_VALUE else SHM, why, registration.transport
                ),
                batching=batching,
            )
            pool.following.next_check = time.monotonic() + (self._config_check_interval_s or 0)
            pool.following.probed_at = time.monotonic()
        except BaseException as exc:
            # Registered, or interrupted (Ctrl-C) while Triton may have been registering it.
            held: list[int] = []
            if kind != BY_VALUE and (registered or not isinstance(exc, Exception)):
                held = unregister_slots(
                    self._triton.stub, memory, keys, self._triton.keys.metadata()
                )
            memory.release(held)
            region.unlink()
            region.close()
            raise
        pool.wake_settler = self._settler.notify
        self._settler.watch(pool)
        if isinstance(sizing, SlotAutoscaling):
            self._scaler.watch(pool, sizing)
        return pool

    def _new_region(
        self,
        kind: str,
        spec: ModelSpec,
        layout: SlotLayout,
        count: int,
        capacity: int,
        *,
        rows: bool = False,
    ) -> SharedMemoryRegion:
        """The region of a new pool in memory of ``kind``: room for ``capacity`` slots, backed
        for ``count`` of them (checked against ``/dev/shm``), watched if this process dies;
        ``rows``: by value, with slots where a node batch gathers its rows.

        Raises:
            SharedMemoryFullError: ``/dev/shm`` has no room for ``count`` slots.
        """
        if kind != BY_VALUE or rows:
            where = "" if kind != CUDA else " (their table; the slots are on the GPU)"
            ensure_room(
                region_bytes(kind, layout, count, rows=rows),
                what=f"model {spec.name!r}: a pool of {count} slot(s) of "
                f"{mib(layout.slot_bytes)}" + where,
                model=spec.name,
                fix="register the model with a smaller pool_size, min_slots or max_batch_size",
            )
        if self._crash_cleanup:  # by value too: its region's file is ours to unlink
            watch(None if kind == BY_VALUE else self._triton.url)
        return SharedMemoryRegion.create(
            new_region_name(spec.name),
            region_bytes(kind, layout, capacity, rows=rows),
            slots=capacity if kind == SYSTEM else 0,
            backed=region_bytes(kind, layout, count, rows=rows),
        )

    def _proof(
        self,
        kind: str,
        spec: ModelSpec,
        memory: SlotMemory,
        key: str,
        registration: Registration,
        reasons: Sequence[str],
    ) -> str:
        """Why a new pool in memory of ``kind`` reaches Triton as it does: Triton proves it
        maps system memory (a probe request lands in the slot registered as ``key``) and
        opened GPU memory (registered); a pool by value says why (``reasons`` the others
        failed).

        Raises:
            Unmappable: the probe request did not land in the slot.
        """
        if kind == BY_VALUE:
            return "; ".join(reasons) or f"transport={registration.transport!r} was asked for"
        if kind != SYSTEM:
            return f"Triton at {self._triton.url} opened the GPU memory of every slot"
        triton = self._triton
        why = probe(triton.stub, triton.metadata(), memory, spec, key, triton.url)
        triton.prove_http(key)
        return "; ".join([*reasons, why])  # after GPU memory it could not open

    def register_slots(
        self,
        memory: SlotMemory,
        keys: Sequence[str],
        reconnect: Reconnect | None = None,
        *,
        model: str,
    ) -> None:
        """Registers each slot of a region in Triton under its own name (a name already
        registered, by a concurrent caller that found it missing too, is fine); internal API
        for the Ray node actor too, after Triton forgot a region (it restarted).

        Raises:
            Unmappable: Triton cannot map the memory (it runs elsewhere now).
            TritonServerError: Triton refused.
            ServerUnreachableError: Triton stayed unreachable.
        """
        triton = self._triton
        # Sent again after a rotation, with a budget whose readiness questions carry new keys.
        budgets = [reconnect or triton.reconnect(model)]

        def register() -> None:
            budget = budgets.pop() if budgets else triton.reconnect(model)
            for slot, key in enumerate(keys):
                try:
                    budget.call(
                        lambda key=key, slot=slot: memory.register(  # type: ignore[misc]
                            triton.stub, key, slot, triton.metadata()
                        )
                    )
                except grpc.RpcError as exc:
                    if status_and_message(exc)[0] == str(grpc.StatusCode.ALREADY_EXISTS):
                        continue
                    error = translate_error(exc, model=model, action="registering shared memory")
                    if memory.kind == SYSTEM and is_unopenable(exc):
                        cause = unopenable_cause(triton.stub, triton.metadata(), CALL_TIMEOUT_S)
                        why = refusal_reason(triton.url, key, exc, cause)
                        raise Unmappable(why, error, cause) from exc
                    explained = memory.explain(error)
                    if explained is not error:  # GPU memory Triton cannot open
                        raise Unmappable(str(explained), error) from exc
                    raise explained from exc

        triton.rotating(register)

    def reregister(self, pool: ModelPool, epoch: int, reconnect: Reconnect) -> None:
        """Registers the pool's region again after Triton forgot it (e.g. it restarted), once
        per ``epoch`` of the pool's registrations.

        Raises:
            PoolRetired: the restarted Triton cannot map the region: the model was laid out
                anew (by value), where the call goes on.
            SharedMemoryUnreachableError: the same, with ``transport="shm"``.
        """
        with pool.lock:
            if pool.epoch != epoch:
                return  # another request already did it
            try:
                if pool.reregister is not None:
                    pool.reregister()
                else:
                    self.register_slots(
                        pool.memory, pool.slot_keys, reconnect, model=pool.spec.name
                    )
                pool.epoch += 1
                return
            except Unmappable as exc:
                unmappable = exc
        self._rerouter.moved_away(pool, unmappable)
        raise PoolRetired(pool)

    def register_again(self, pool: ModelPool) -> ModelPool:
        """:meth:`Rerouter.register_again`; internal API for the Ray node actor."""
        return self._rerouter.register_again(pool)

    def reprobe(self, pool: ModelPool, *, since: float) -> ModelPool | None:
        """:meth:`Rerouter.reprobe`; internal API for the Ray node actor."""
        return self._rerouter.reprobe(pool, since=since)

    # ------------------------------------------------------------------ model changes

    def _replace(
        self,
        old: ModelPool,
        spec: ModelSpec,
        sizing: int | SlotAutoscaling,
        registration: Registration,
        cause: str = "for its config on Triton",
    ) -> ModelPool:
        """Lays a model's pool out anew; the old one is retired: a caller that takes one of
        its slots moves to the new pool, and once Triton is done with every request on it,
        it is unregistered and unlinked (in the background)."""
        with old.lock:
            if old.following.successor is not None:
                return old.following.successor
            # As large as the old one is now: the load that made it so goes on.
            new = self._create(
                spec,
                sizing,
                registration,
                old.generation + 1,
                initial=old.slots.size,
                announce=False,  # said below
            )
            with self._lock:
                if self._pools.get(spec.name) is old:
                    self._pools[spec.name] = new
            old.following.successor = new
            old.header.retire()
        logger.info(
            "ray-triton-shm: model %r laid out anew %s (generation %d, transport %s: %s)",
            spec.name,
            cause,
            new.generation,
            new.transport.kind,
            new.transport.reason,
        )
        retiring = self._keepers.retiring
        retiring[:] = [thread for thread in retiring if thread.is_alive()]
        thread = threading.Thread(
            target=_release_pool,
            args=(old, self._keepers, CLOSE_WAIT_S),
            name="ray-triton-shm-retire",
            daemon=True,
        )
        retiring.append(thread)
        thread.start()
        return new

    def follow(
        self, pool: ModelPool, *, since: float, cause: BaseException | None = None
    ) -> ModelPool | None:
        """:meth:`Follower.follow`; internal API for the Ray node actor too."""
        return self._follower.follow(pool, since=since, cause=cause)

    def follow_change(
        self,
        pool: ModelPool,
        *,
        since: float,
        cause: TritonServerError,
        proven: bool,
        deadline: float | None = None,
    ) -> ModelPool | None:
        """:meth:`Follower.follow_change`; internal API for the Ray node actor too."""
        return self._follower.follow_change(
            pool, since=since, cause=cause, proven=proven, deadline=deadline
        )

    def next_pool(
        self,
        pool: ModelPool,
        exc: BaseException,
        options: RequestOptions | None,
        started: float,
        *,
        deadline: float | None = None,
    ) -> ModelPool:
        """The pool a call goes on with after ``exc`` (one of :data:`._retry.MOVED`) stopped it
        on ``pool`` (the call started at ``started``; ``deadline``, a ``time.monotonic()``, is
        when it waits no more for Triton's config), or raises what the caller should get:
        :func:`._retry.follow_model`, with this registry as the layout's owner."""
        if not pool.owned:
            raise exc  # attached: the region's owner follows the model (ShmModel asks it)
        sequence = options is not None and options.is_sequence
        return follow_model(
            pool,
            exc,
            self,
            follows=pool.follows,
            sequence=sequence,
            started=started,
            deadline=deadline,
        )

    def replacement(self, pool: ModelPool, exc: BaseException) -> ModelPool | None:
        """The pool that replaced ``pool`` (:class:`._retry.LayoutOwner`).

        Raises:
            ClientClosedError: the client was closed (whatever the pool's words say).
        """
        self.check_open()
        current = self._pools.get(pool.spec.name)
        if self.closed or current is None or current is pool:
            return None
        return current

    def newer(
        self, pool: ModelPool, exc: BaseException, since: float, *, deadline: float | None = None
    ) -> ModelPool | None:
        """The model's pool after ``exc`` suggested it changed (:class:`._retry.LayoutOwner`)."""
        if isinstance(exc, SuspectedChange):
            return self.follow_change(
                pool, since=since, cause=exc.error, proven=exc.proven, deadline=deadline
            )
        return self.follow(pool, since=since)

    def maybe_check(self, pool: ModelPool) -> None:
        """:meth:`Follower.maybe_check` and :meth:`Rerouter.maybe_reprobe`."""
        self._follower.maybe_check(pool)
        self._rerouter.maybe_reprobe(pool)


def _slot_counts(sizing: int | SlotAutoscaling, initial: int | None) -> tuple[int, int]:
    """A new pool's slots now (one that follows its load: ``initial``, within its bounds),
    and the most it may have (its region's room)."""
    if isinstance(sizing, SlotAutoscaling):
        most = sizing.max_slots
        return min(max(initial or sizing.min_slots, sizing.min_slots), most), most
    return sizing, sizing


def _sizing_text(sizing: int | SlotAutoscaling | None) -> str:
    if isinstance(sizing, SlotAutoscaling):
        return f"autoscaling {sizing.min_slots} to {sizing.max_slots} slots"
    return f"pool_size {sizing}"


def _over_http(pool: ModelPool) -> bool:
    return bool(pool.requests.path) and not pool.spec.decoupled


def _protocol_reason(pool: ModelPool, reason: str) -> str:
    if pool.spec.decoupled:
        return "a streaming model: Triton answers it over its gRPC stream alone"
    if not pool.requests.path:
        return f"model name {pool.spec.name!r} cannot be in an HTTP path"
    return reason
