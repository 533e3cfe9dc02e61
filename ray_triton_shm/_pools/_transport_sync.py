"""How a pool follows where Triton runs: laid out anew by value when a restarted Triton can no
longer map its memory, and back in shared memory once Triton maps this process's memory again.

The choice of a pool's transport itself, and its proofs, are :mod:`.._inference._transport`'s; this
is what makes it again when Triton moves (the model's changes on Triton are :mod:`._model_sync`'s).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .._inference._model_pool import ModelPool
from .._inference._transport import (
    AUTO_TRANSPORT,
    SHM,
    Unmappable,
    region_refusal,
    unreachable_error,
)
from .._slots._memory import CALL_TIMEOUT_S
from .._wire._channel import Channel
from ._model_sync import Replace

__all__ = ["Rerouter"]

logger = logging.getLogger(__name__)

#: Registers each slot of a memory in Triton (the registry's ``register_slots``).
RegisterSlots = Callable[..., None]


class Rerouter:
    """Follows where a client's Triton runs, for its pools.

    Args:
        triton: The way to Triton.
        replace: Lays a pool out anew (the registry's): its new pool tries shared memory
            first, as a new registration does.
        register_slots: Registers a memory's slots in Triton (the registry's); raises
            :class:`Unmappable` where Triton cannot map them.
        interval_s: How often a pool by value of its own choice asks whether Triton maps
            this process's shared memory now (``None``: never on its own).
    """

    def __init__(
        self,
        triton: Channel,
        replace: Replace,
        register_slots: RegisterSlots,
        *,
        interval_s: float | None,
    ) -> None:
        self._triton = triton
        self._replace = replace
        self._register_slots = register_slots
        self._interval_s = interval_s

    def moved_away(self, pool: ModelPool, unmappable: Unmappable) -> ModelPool:
        """The pool of a model whose Triton can no longer map ``pool`` (it restarted
        elsewhere): laid out anew, by value.

        Raises:
            SharedMemoryUnreachableError: the pool was registered with ``transport="shm"``.
        """
        assert pool.registration is not None and pool.sizing is not None  # owned
        if pool.transport.asked == SHM:
            raise unreachable_error(pool.spec.name, self._triton.url, [unmappable])
        return self._replace(pool, pool.spec, pool.sizing, pool.registration, "as Triton moved")

    def register_again(self, pool: ModelPool) -> ModelPool:
        """Registers a pool's region again after Triton forgot it (it restarted); where the
        restarted Triton cannot map it, the pool of :meth:`moved_away`."""
        if pool.by_value:
            return pool
        try:
            self._register_slots(pool.memory, pool.slot_keys, model=pool.spec.name)
        except Unmappable as exc:
            return self.moved_away(pool, exc)
        return pool

    def reprobe(self, pool: ModelPool, *, since: float) -> ModelPool | None:
        """For a pool that went by value on its own (``transport="auto"``): whether Triton
        maps this process's shared memory now (it restarted, or moved back), unless that was
        asked after ``since`` (a ``time.monotonic()``).

        Returns:
            The pool laid out anew in shared memory, or ``None`` if nothing changed.
        """
        if not self._may_move(pool):
            return None
        state = pool.following
        with pool.lock:
            if state.successor is not None or state.probed_at >= since:
                return None
            state.probed_at = time.monotonic()
        return self._reprobe_now(pool)

    def maybe_reprobe(self, pool: ModelPool) -> None:
        """Every ``interval_s``, :meth:`reprobe` in the background (a call's cost: a
        comparison)."""
        interval = self._interval_s
        if interval is None or not self._may_move(pool):
            return
        now = time.monotonic()
        if now - pool.following.probed_at < interval:
            return
        with pool.lock:
            if now - pool.following.probed_at < interval or pool.following.successor:
                return
            pool.following.probed_at = now
        threading.Thread(
            target=self._reprobe_quietly, args=(pool,), name="ray-triton-shm-probe", daemon=True
        ).start()

    @staticmethod
    def _may_move(pool: ModelPool) -> bool:
        return pool.by_value and pool.transport.asked == AUTO_TRANSPORT and pool.owned

    def _reprobe_quietly(self, pool: ModelPool) -> None:
        try:
            self._reprobe_now(pool)
        except Exception as exc:  # by value goes on working; the next look tries again
            logger.debug("ray-triton-shm: probing Triton for %r: %s", pool.spec.name, exc)

    def _reprobe_now(self, pool: ModelPool) -> ModelPool | None:
        if not self._maps_shared_memory():
            return None
        assert pool.registration is not None and pool.sizing is not None
        new = self._replace(
            pool, pool.spec, pool.sizing, pool.registration, "as Triton maps shared memory now"
        )
        return None if new.by_value else new

    def _maps_shared_memory(self) -> bool:
        """Whether Triton opens a region of this process now (see :func:`region_refusal`)."""
        triton = self._triton
        try:
            refusal = region_refusal(triton.stub, triton.metadata(), CALL_TIMEOUT_S, label="probe")
        except Exception:  # Triton away, or /dev/shm full: the next look tells
            return False
        return refusal is None
