"""A registered model as the engine sees it: its spec, its slots and a request per slot
(:class:`ModelPool`), how it follows its model on Triton (:class:`FollowState`), and the
signal that it moved to a new layout (:class:`PoolRetired`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .._exceptions import ClientClosedError, TritonSHMError, error_kind
from .._slots._board import BatchBoard
from .._slots._header import RegionHeader
from .._slots._memory import BY_VALUE, SlotIO, SlotMemory
from .._slots._shm import SharedMemoryRegion, slot_key
from .._slots._sizing import SlotAutoscaling
from .._slots._slot_pool import SlotSource
from .._slots._specs import ModelSpec, SlotLayout
from ._model_change import Registration
from ._node_batching import NodeBatching
from ._requests import SlotRequests, ValueRequests
from ._transport import INLINE, SHM, Transport

__all__ = ["FollowState", "ModelPool", "PoolRetired"]


class PoolRetired(Exception):
    """A slot was taken from a pool whose model moved to a new layout (it is given back
    unused): the call goes to the model's current pool."""

    def __init__(self, pool: ModelPool) -> None:
        super().__init__(f"the pool of model {pool.spec.name!r} was replaced by a new layout")
        self.pool = pool


@dataclass
class FollowState:
    """A pool's part in following its model on Triton (see :class:`.._pools._model_sync.Follower`).

    Attributes:
        successor: The pool that replaced it, once the model changed on Triton.
        checked_at: When Triton's config was last compared with the spec
            (``time.monotonic``).
        check_error: What that found: the error of hand-given specs that no longer match,
            or ``None``.
        next_check: When the config of a pool that follows the model is next compared with
            it.
        probed_at: When a pool by value of its own choice last asked whether Triton maps
            this process's shared memory now (see :meth:`.._pools._registry.Registry.reprobe`).
    """

    successor: ModelPool | None = None
    checked_at: float = float("-inf")
    check_error: BaseException | None = None
    next_check: float = 0.0
    probed_at: float = float("-inf")


@dataclass(eq=False)
class ModelPool:
    """A registered model: its spec, its region cut into slots, and a request per slot.

    Where the slots' bytes live (the region's pages, a GPU, or the requests themselves for a
    pool by value) is its ``memory``'s concern alone (see :mod:`.._slots._memory`), and how a chunk
    becomes a request its ``requests``' (see :mod:`._requests`).

    The client either owns the region (it created and registered it, and unregisters and
    unlinks it) or attached a region somebody else owns (the Ray node actor), in which case
    ``reregister`` asks the owner to register it again after Triton forgot it.
    """

    spec: ModelSpec
    layout: SlotLayout
    region: SharedMemoryRegion
    memory: SlotMemory
    slots: SlotSource
    requests: SlotRequests | ValueRequests
    #: Every slot's tensors, as the engine writes and reads them.
    views: list[SlotIO]
    header: RegionHeader
    #: Each slot's name in Triton (see :func:`.._slots._shm.slot_key`).
    slot_keys: list[str]
    #: For an attached region: makes its owner register it again (may raise to give up).
    reregister: Callable[[], None] | None = None
    #: Wakes the owner's :class:`.._pools._abandoned.Settler`: a slot was abandoned, or the pool's
    #: slots became shared with other processes (whose dead holders it then looks for).
    wake_settler: Callable[[], None] | None = None
    #: Bumped on every re-registration; a failed request knows which registration it used.
    epoch: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: What the pool was registered with (``None`` for an attached region: its owner knows).
    registration: Registration | None = None
    #: Its size: fixed, or following its load (``None`` for an attached region).
    sizing: int | SlotAutoscaling | None = None
    #: Bumped on every new layout of the model (the model changed on Triton).
    generation: int = 0
    #: How it follows its model on Triton (see :mod:`.._pools._model_sync`), under :attr:`lock`.
    following: FollowState = field(default_factory=FollowState)
    #: How its tensors reach Triton, and why (see :mod:`._transport`).
    transport: Transport = Transport(SHM, "")
    #: Its node batching (see :mod:`._batching`), and the boards of its slots' batches.
    batching: NodeBatching | None = None
    board: BatchBoard | None = None

    @property
    def by_value(self) -> bool:
        """Whether its tensors travel in the requests (Triton maps none of its memory)."""
        return self.memory.kind == BY_VALUE

    @property
    def owned(self) -> bool:
        """Whether its client created and registered the region (and unregisters and unlinks
        it), rather than attached a region somebody else owns."""
        return self.registration is not None

    @property
    def follows(self) -> bool:
        """Whether the pool is laid out again when the model changes on Triton (its client
        owns it, and its specs came from Triton's config)."""
        return self.registration is not None and self.registration.follows

    @classmethod
    def over(
        cls,
        spec: ModelSpec,
        memory: SlotMemory,
        slots: SlotSource,
        header: RegionHeader,
        reregister: Callable[[], None] | None = None,
        registration: Registration | None = None,
        generation: int = 0,
        sizing: int | SlotAutoscaling | None = None,
        transport: Transport | None = None,
        batching: NodeBatching | None = None,
    ) -> ModelPool:
        """A pool over the slots of ``memory``, laid out for ``spec`` (its calls batched on
        the node by ``batching`` where its slots are in system memory)."""
        region, count = memory.region, memory.slot_count
        keys = [slot_key(region.name, slot) for slot in range(count)]
        bases = [memory.offset(slot) for slot in range(count)]
        requests: SlotRequests | ValueRequests
        if memory.kind == BY_VALUE:
            requests = ValueRequests(spec, count)
        else:
            requests = SlotRequests(spec, memory.layout, keys, bases)
        if transport is None:
            transport = Transport(INLINE if memory.kind == BY_VALUE else SHM, "")
        return cls(
            spec=spec,
            layout=memory.layout,
            region=region,
            memory=memory,
            slots=slots,
            requests=requests,
            views=memory.views(spec),
            header=header,
            slot_keys=keys,
            reregister=reregister,
            registration=registration,
            generation=generation,
            sizing=sizing,
            transport=transport,
            batching=batching,
            board=(
                BatchBoard(header, region.name, model=spec.name)
                if batching is not None and memory.holds_rows
                else None
            ),
        )

    def take(self, slot: int) -> int:
        """Checks a slot just taken: one of a retired pool, or of a region whose header is no
        longer ours, goes back unused.

        Raises:
            PoolRetired: the model moved to a new layout.
            ForeignRegionError: the header lost this layout's stamp (something wrote over it):
                none of its words, ``retired`` included, is believed.
        """
        if self.header.stopped:
            self.slots.release(slot)
            self.header.check(model=self.spec.name)
            raise PoolRetired(self)
        return slot

    def finish(self, slot: int, answered: bool, sent_ns: int) -> None:
        """Frees a slot whose request ended: at once if Triton answered it (or could never
        write into it: a pool by value), else abandoned."""
        if answered or self.by_value:
            self.slots.release(slot)
        else:
            self.abandon(slot, sent_ns)

    def count_failure(self, exc: TritonSHMError) -> None:
        """Counts a failed call on this pool by its kind (see :func:`error_kind`)."""
        kind = error_kind(exc)
        if kind == "overloaded":
            return  # counted where refused, under the same mutex
        with contextlib.suppress(ClientClosedError), self.slots.exclusive():
            self.header.count_failure(kind)

    def abandon(self, slot: int, sent_ns: int) -> None:
        """Takes a held slot out of use until Triton is proven done with the request sent on
        it at ``sent_ns``, whose answer will never be read."""
        self.header.abandon(slot, sent_ns)
        self.slots.abandon(slot)
        if self.wake_settler is not None:
            self.wake_settler()
