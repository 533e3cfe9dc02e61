"""Pools that follow their load: more slots once callers have waited ``upscale_delay_s`` on end,
fewer after a quiet spell.

A pool's region has room for ``max_slots`` slots, but ``/dev/shm`` only holds the pages of the
slots in use: the rest of the file is a hole (see :meth:`.._slots._shm.SharedMemoryRegion.back`).
Every slot, in use or not, is registered in Triton when the region is. So resizing costs no request,
no new region and no move of any caller:

* **growing** reserves the new slots' pages (``fallocate``: a full ``/dev/shm`` is an error now,
  never a ``SIGBUS`` later), then raises the size in the region's header; callers in every
  process take the new slots at their next call;
* **shrinking** lowers the size first (nobody takes a slot beyond it any more), then gives each
  slot beyond it back to ``/dev/shm`` once it is idle: held by nobody (its lock taken by the
  owner meanwhile) and not abandoned (Triton is proven done with it, see :mod:`._abandoned`). So
  no request can be using a slot whose memory is given back.

The policy (:class:`Policy`) is Ray Serve's autoscaling applied to slots, with a target of zero
waiting callers: it samples every :data:`TICK_S` the slots held and the callers waiting; after
callers have waited for ``upscale_delay_s`` it grows to what they all need at once (held plus
waiting), and after ``downscale_delay_s`` with fewer needed than it has it shrinks to the most
needed at once over that time. Growing is quick because a caller that waits loses time at once
and a slot is cheap; shrinking is slow, against flapping, because a slot kept costs only memory.
Waits that each end before ``upscale_delay_s`` (a caller queued at one sample, none at the
next) never grow the pool, however many there are: the policy then says so
(``limited_by == "upscale_delay_s"``), as it says ``"max_slots"`` at its bound, for
:data:`REASON_KEPT_S` after the last caller it saw waiting.

The :class:`Scaler` is a thread of the client that owns the regions (a plain
``TritonSHMClient``, or the Ray node actor's, whose pools every process of its node shares). It
also keeps the owner's pools within a budget of ``/dev/shm``: growth stops there, and the pool's
header says why (``limited_by``), as its stats and metrics do.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._exceptions import ClientClosedError, SharedMemoryFullError
from .._slots._shm import shm_space
from .._slots._sizing import SlotAutoscaling

if TYPE_CHECKING:
    from .._inference._model_pool import ModelPool

__all__ = [
    "REASON_KEPT_S",
    "TICK_S",
    "Policy",
    "Scaler",
    "default_shm_budget",
    "limit_text",
]

logger = logging.getLogger(__name__)

#: How often the scaler samples its pools.
TICK_S = 0.1
#: How long the policy keeps saying why the pool did not grow after the last caller it saw
#: waiting: short waits come and go between samples, and a snapshot (``status``) falls between.
REASON_KEPT_S = 5.0
#: What stops growth for want of room (the scaler tells the policy, see Policy.short_of).
_ROOM = ("shm_budget", "shm_full")
#: The share of ``/dev/shm`` an owner's pools may hold by default (what Ray's object store
#: reserves there is taken off first).
SHM_SHARE = 0.9


def default_shm_budget(reserved: int = 0) -> int | None:
    """Bytes of ``/dev/shm`` an owner's pools may hold: :data:`SHM_SHARE` of its size, less
    ``reserved`` (Ray's object store, where it lives there); ``None`` where it cannot be read."""
    space = shm_space()
    if space is None:
        return None
    return max(0, int(space[1] * SHM_SHARE) - reserved)


class Policy:
    """When and how far one pool grows or shrinks, from samples of its load.

    Args:
        config: The pool's bounds and delays.
        now: When the pool got its size (``time.monotonic()``).
    """

    def __init__(self, config: SlotAutoscaling, now: float) -> None:
        self.config = config
        #: Why the pool did not grow although callers waited lately (``""``: nothing held it
        #: back): ``"upscale_delay_s"`` (their waits ended before the delay did),
        #: ``"max_slots"`` (the pool is at its bound), or the room it ran short of
        #: (:meth:`short_of`).
        self.limited_by = ""
        self._resized_at = now
        self._waiting_since: float | None = None
        self._waited_at = float("-inf")
        # (when, demand), demands decreasing: the first is the most needed in the window.
        self._peaks: deque[tuple[float, int]] = deque()

    def want(self, now: float, size: int, in_use: int, waiting: int) -> int:
        """The size the pool should have, given ``in_use`` slots held and ``waiting`` callers
        now."""
        config = self.config
        demand = in_use + waiting
        while self._peaks and self._peaks[-1][1] <= demand:
            self._peaks.pop()
        self._peaks.append((now, demand))
        while self._peaks[0][0] < now - config.downscale_delay_s:
            self._peaks.popleft()
        if waiting:
            self._waited_at = now
            if self._waiting_since is None:
                self._waiting_since = now
            if size >= config.max_slots:
                self.limited_by = "max_slots"
                return size
            if now - self._waiting_since >= config.upscale_delay_s:
                self.limited_by = ""
                return min(config.max_slots, max(size + 1, demand))
            return size  # waiting out the delay: the reason stays what it was
        if self._waiting_since is not None and size < config.max_slots and not self._short:
            self.limited_by = "upscale_delay_s"  # the waits ended before the delay did
        elif now - self._waited_at >= REASON_KEPT_S:
            self.limited_by = ""
        self._waiting_since = None
        if size > config.min_slots and now - self._resized_at >= config.downscale_delay_s:
            peak = self._peaks[0][1]
            if peak < size:
                return max(config.min_slots, peak)
        return size

    def resized(self, now: float) -> None:
        """The pool got a new size at ``now``."""
        self._resized_at = now
        self._waiting_since = None

    def short_of(self, room: str) -> None:
        """The pool's growth stopped short of what :meth:`want` said, for want of ``room``
        (``"shm_budget"`` or ``"shm_full"``): that is why it did not grow, from now on."""
        self.limited_by = room

    @property
    def _short(self) -> bool:
        return self.limited_by in _ROOM


class _Elastic:
    """What the scaler knows of one pool: its policy, and which slots hold memory."""

    def __init__(self, config: SlotAutoscaling, size: int, now: float) -> None:
        self.policy = Policy(config, now)
        self.backed = set(range(size))


class Scaler:
    """Resizes the pools of one client that follow their load, within its ``/dev/shm`` budget.

    It holds its pools weakly and never the client, so the client can still be collected.

    Args:
        budget_bytes: The most bytes of ``/dev/shm`` the client's pools may hold (``None``: as
            much as ``/dev/shm`` has room for).
        pools: The client's pools by model, kept up to date by the client (all of them count
            against the budget).
    """

    def __init__(self, budget_bytes: int | None, pools: Mapping[str, ModelPool]) -> None:
        self.budget_bytes = budget_bytes
        self._all_pools = pools
        self._pools: weakref.WeakKeyDictionary[ModelPool, _Elastic] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        #: Held while a round resizes pools: forget() waits for it.
        self._round = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pool: ModelPool, config: SlotAutoscaling) -> None:
        """Resizes ``pool`` (one its client owns, whose first ``pool.slots.size`` slots hold
        memory) from now on."""
        with self._lock:
            self._pools[pool] = _Elastic(config, pool.slots.size, time.monotonic())
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="ray-triton-shm-scaler", daemon=True
                )
                self._thread.start()

    def forget(self, pool: ModelPool) -> None:
        """Stops resizing ``pool`` (it is being released), waiting for a round in progress."""
        with self._lock:
            self._pools.pop(pool, None)
        if threading.current_thread() is not self._thread:
            with self._round:
                pass

    def stop(self) -> None:
        """Ends the thread (idempotent)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._round:
                with self._lock:
                    pools = list(self._pools.items())
                for pool, state in pools:
                    with self._lock:
                        if pool not in self._pools:
                            continue  # being released: forget() waits for this round
                    try:
                        self.tick(pool, state, time.monotonic())
                    except ClientClosedError:
                        continue  # released meanwhile
                    except Exception:  # never end the thread: the next round tries again
                        logger.exception(
                            "ray-triton-shm: resizing the pool of %r failed", pool.spec.name
                        )

    def tick(self, pool: ModelPool, state: _Elastic, now: float) -> None:
        """One look at ``pool``: grows or shrinks it as its policy says, and gives back the
        memory of idle slots beyond its size."""
        slots, header = pool.slots, pool.header
        size = slots.size
        in_use, waiting = slots.demand()
        want = state.policy.want(now, size, in_use, waiting)
        if want > size:
            grown, short = self._grow(pool, state, size, want)
            if short:
                state.policy.short_of(short)
            if grown > size:
                header.set_size(grown)
                slots.resize(grown)
                state.policy.resized(now)
                logger.debug("ray-triton-shm: pool of %r grew to %d slots", pool.spec.name, grown)
        elif want < size:
            header.set_size(want)
            slots.resize(want)
            state.policy.resized(now)
            logger.debug("ray-triton-shm: pool of %r shrank to %d slots", pool.spec.name, want)
        limit = state.policy.limited_by
        if limit != header.limited_by:
            if limit:
                # Short waits are the common case of a busy pool: not worth an info line.
                log = logger.debug if limit == "upscale_delay_s" else logger.info
                log(
                    "ray-triton-shm: the pool of %r stays at %d slots while callers wait: %s",
                    pool.spec.name,
                    slots.size,
                    limit_text(limit, state.policy.config),
                )
            header.set_limited_by(limit)
        beyond = [slot for slot in state.backed if slot >= slots.size]
        if beyond:
            slots.each_idle(sorted(beyond), lambda slot: _unback(pool, state, slot))

    def _grow(self, pool: ModelPool, state: _Elastic, size: int, want: int) -> tuple[int, str]:
        """Reserves the memory of slots ``size .. want-1`` as the budget and ``/dev/shm``
        allow; the size reached, and what stopped it short (``""``: nothing)."""
        slot_bytes = 0 if pool.by_value else pool.layout.slot_bytes  # by value: locks only
        room = None
        if self.budget_bytes is not None:
            owned = [p for p in list(self._all_pools.values()) if p.owned]
            room = self.budget_bytes - sum(p.region.allocated for p in owned)
        for slot in range(size, want):
            if slot in state.backed:
                continue
            if slot_bytes and room is not None and room < slot_bytes:
                return slot, "shm_budget"
            try:
                pool.memory.back(slot)
            except SharedMemoryFullError:
                return slot, "shm_full"
            state.backed.add(slot)
            if room is not None:
                room -= slot_bytes
        return want, ""


def limit_text(limit: str, config: SlotAutoscaling | None = None) -> str:
    """Why a pool with waiting callers did not grow, in words, for ``limited_by`` (the
    policy's own reasons, or the room it ran out of); ``""`` for nothing."""
    delay = f" ({config.upscale_delay_s:g} s)" if config is not None else ""
    return {
        "": "",
        "upscale_delay_s": f"callers waited, but none for upscale_delay_s{delay} on end: "
        "short waits do not grow a pool (lower upscale_delay_s, or raise min_slots)",
        "max_slots": "it is at its max_slots",
        "shm_budget": "the /dev/shm budget of its owner is spent (shm_budget_bytes)",
        "shm_full": "/dev/shm is full",
    }[limit]


def _unback(pool: ModelPool, state: _Elastic, slot: int) -> None:
    pool.memory.unback(slot)
    state.backed.discard(slot)
