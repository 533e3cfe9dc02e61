"""Settling abandoned slots: proving Triton done with a request nobody waits for any more.

Triton keeps running a request whose client gave up (its deadline passed, it was cancelled,
or it died): the default scheduler does not drop it, a model that does not check for
cancellation runs to the end, and then Triton writes the outputs into the slot the request
named. Only Triton's answer says it is done, and an abandoned request's answer is never read.
So such a slot is **abandoned** (its header word ``abandoned_since`` is set, see
:mod:`.._slots._header`), and nobody takes it until its region's owner has proven Triton done with
it.

The proof is Triton's own reference count. Every slot is registered under a name of its own (a
hard link to the region's file, see :func:`.._slots._shm.slot_key`; a GPU slot by its own CUDA IPC
handle, see :mod:`.._slots._memory`), and Triton refuses to unregister
a registration that a request still uses ("currently in use", counted per registration). The
owner's :class:`Settler` therefore tries to unregister an abandoned slot's name: refused, the
request still runs, and it tries again a moment later; done (or the name was unknown, after
Triton restarted), no request of Triton's can touch the slot any more, so it registers the
name again and puts the slot back in use. A slot is back within :data:`POLL_S` of Triton
finishing its request, never before. Where nothing listens at Triton's address any more, no
Triton process runs the request either (Triton stops listening only once it exits: a graceful
shutdown first finishes the requests it runs), so the slot is back too.

The settler is a thread of the client that owns the region (a plain ``TritonSHMClient``, or
the Ray node actor's, which owns the regions every process of its node shares). It sleeps
until told of an abandoned slot of its own process, and for regions shared with other processes
it also looks every :data:`SWEEP_S` for slots of holders that died mid-request (found through
their file locks, see :mod:`.._slots._shared_slots`; the next caller to lock such a slot finds it
too).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Sequence

import grpc

from .._exceptions import ClientClosedError
from .._inference._model_pool import ModelPool
from .._slots._memory import SlotMemory
from .._wire._keys import Keys, Metadata
from .._wire._triton_errors import expected_header, is_in_use, never_reached

__all__ = ["POLL_S", "SWEEP_S", "Settler", "unregister_slots"]

logger = logging.getLogger(__name__)

#: How often abandoned slots are tried again.
POLL_S = 0.05
#: How often a region shared with other processes is swept for holders that died.
SWEEP_S = 0.25


def unregister_slots(
    stub: object,
    memory: SlotMemory,
    keys: Sequence[str],
    metadata: Metadata,
    *,
    in_use_wait_s: float = 0.0,
) -> list[int]:
    """Unregisters slots' names (``keys[slot]``), trying again for up to ``in_use_wait_s``
    those a request still uses; gives up quietly where Triton is gone or the channel is closed
    (nothing registered outlives a Triton), or past the wait (the watchdog, or the next
    client, takes them back; see :mod:`._reclaim`).

    Returns:
        The slots Triton still holds (a request used them past the wait).
    """
    deadline = time.monotonic() + in_use_wait_s
    pending = list(range(len(keys)))
    while pending:
        in_use = []
        for slot in pending:
            try:
                memory.unregister(stub, keys[slot], metadata)
            except grpc.RpcError as exc:
                if is_in_use(exc):
                    in_use.append(slot)
            except ValueError:
                return []  # the channel is closed
        pending = in_use
        if pending and time.monotonic() < deadline:
            time.sleep(POLL_S)
        else:
            return pending
    return []


class Settler:
    """Puts a client's abandoned slots back in use once Triton is proven done with them.

    It holds the client's stub and its own set of pools, never the client, so the client can
    still be collected.

    Args:
        stub: The client's gRPC stub.
        keys: The client's keys (the key of Triton's shared-memory protocol, if any).
    """

    def __init__(self, stub: object, keys: Keys) -> None:
        self._stub = stub
        self._keys = keys
        self._pools: weakref.WeakSet[ModelPool] = weakref.WeakSet()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        #: Held while a round settles pools: forget() waits for it.
        self._round = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._denied_logged = False

    def watch(self, pool: ModelPool) -> None:
        """Settles the abandoned slots of ``pool`` (a pool whose region the client owns)."""
        with self._lock:
            self._pools.add(pool)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._run, name="ray-triton-shm-settler", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def forget(self, pool: ModelPool) -> None:
        """Stops looking after ``pool`` (it is being released), waiting for a round that may
        be settling it: a slot it unregistered to prove Triton done is registered again, and
        must be before the release unregisters the pool for good."""
        with self._lock:
            self._pools.discard(pool)
        if threading.current_thread() is not self._thread:
            with self._round:
                pass

    def notify(self) -> None:
        """A slot of a watched pool was just abandoned, or its slots became shared: look
        now."""
        self._wake.set()

    def stop(self) -> None:
        """Ends the thread (idempotent)."""
        with self._lock:
            self._stopped = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                pools = list(self._pools)
            self._wake.clear()
            waits: list[float | None] = [None]
            with self._round:
                for pool in pools:
                    with self._lock:
                        if pool not in self._pools:
                            continue  # being released: forget() waits for this round
                    try:
                        waits.append(self.settle(pool))
                    except ClientClosedError:
                        continue  # released meanwhile
                    except Exception:  # never end the thread: the next round tries again
                        name = pool.spec.name
                        logger.exception("ray-triton-shm: settling slots of %r failed", name)
                        waits.append(POLL_S)
            self._wake.wait(min((w for w in waits if w is not None), default=None))

    def settle(self, pool: ModelPool) -> float | None:
        """One round over ``pool``: abandons the slots of holders that died, then puts back in
        use each abandoned slot Triton is done with. Returns when to look again: soon while
        slots wait for Triton, every :data:`SWEEP_S` for a pool shared with other processes,
        else when told (``None``)."""
        slots = pool.slots
        slots.sweep()
        waiting = False
        for slot in pool.header.abandoned_slots():
            if self._triton_done(pool, slot):
                pool.header.settle(slot, time.monotonic_ns())
                pool.slots.settled(slot)
            else:
                waiting = True
        if waiting:
            return POLL_S
        return SWEEP_S if slots.shared else None

    def _triton_done(self, pool: ModelPool, slot: int) -> bool:
        """Whether Triton is done with every request on ``slot``: it let go of the slot's
        registration (which is then made again for the slot's next request)."""
        key = pool.slot_keys[slot]
        used = self._keys.metadata()
        try:
            pool.memory.unregister(self._stub, key, used)
        except grpc.RpcError as exc:
            if never_reached(exc):
                return True  # no Triton runs here any more; the next one registers it anew
            if expected_header(exc) is not None and self._keys.refused(used):
                return False  # the keys turned: the next try uses the others
            if expected_header(exc) is not None and not self._denied_logged:
                self._denied_logged = True
                logger.warning(
                    "ray-triton-shm: abandoned slots of %r stay out of use: Triton restricts "
                    "shared memory and this client lacks the header %r",
                    pool.spec.name,
                    expected_header(exc),
                )
            return False  # still in use (or no answer): try again later
        try:
            pool.memory.register(self._stub, key, slot, self._keys.metadata())
        except grpc.RpcError:
            pass  # a request that finds it missing registers it again (see _engine)
        return True
