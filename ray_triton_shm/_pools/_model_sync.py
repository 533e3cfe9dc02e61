"""How a pool follows its model on Triton: Triton's config compared with the pool's spec (after
a call ran into a change, or every ``config_check_interval_s`` in the background), the pool laid
out anew where it follows the model, and the error of hand-given specs that no longer match.

The per-pool part of it (when the config was read, what that found, the pool that replaced
this one) is the pool's :class:`~.._inference._model_pool.FollowState`, under the pool's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .._exceptions import TritonServerError
from .._inference._model_change import Registration, changed_error, differences
from .._inference._model_pool import ModelPool
from .._slots._sizing import SlotAutoscaling
from .._slots._specs import ModelSpec
from .._wire._channel import Channel

__all__ = ["Follower"]

logger = logging.getLogger(__name__)

#: An answer that does not fit its pool (or a fixed-size output refused as too large) proves
#: the model changed, yet while Triton reloads it its config may still read as before: it is
#: read again this often, for this long (or until the call's deadline, if sooner).
_CONFIG_POLL_S = 0.1
_CONFIG_CATCH_UP_S = 5.0


class Replace(Protocol):
    """Lays a pool out anew (the registry's): ``replace(old, spec, sizing, registration,
    cause)`` -> the new pool; ``cause`` says why, in the log."""

    def __call__(
        self,
        old: ModelPool,
        spec: ModelSpec,
        sizing: int | SlotAutoscaling,
        registration: Registration,
        cause: str = ...,
    ) -> ModelPool: ...


class Follower:
    """Follows the models of a client's pools on Triton.

    Args:
        triton: The way to Triton (its config of a model).
        replace: Lays a pool out anew for a model's new spec (the registry's).
        config_check_interval_s: How often a pool that follows its model compares it with
            Triton's config in the background (``None``: only when a call runs into a change).
        closed: Whether the client closed (a catch-up stops then).
        clock: Seconds, monotonic: what ``since``, deadlines and checks are read on
            (injected by tests).
        sleep: Waits between a catch-up's reads (injected by tests).
    """

    def __init__(
        self,
        triton: Channel,
        replace: Replace,
        *,
        config_check_interval_s: float | None,
        closed: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._triton = triton
        self._replace = replace
        self._interval_s = config_check_interval_s
        self._closed = closed
        self._clock = clock
        self._sleep = sleep

    def follow(
        self, pool: ModelPool, *, since: float, cause: BaseException | None = None
    ) -> ModelPool | None:
        """Compares Triton's config of the model with the pool's spec (unless that was done
        after ``since``, a reading of the clock), and lays the pool out anew if it follows the
        model and the model changed.

        Returns:
            The pool to use now, or ``None`` if the model did not change.

        Raises:
            ModelChangedError: specs given by hand that no longer match the model.
            ModelSpecError: the new config cannot be laid out (a ``-1`` dim without a maximum).
            ModelNotLoadedError: the model is not loaded on Triton.
        """
        registration = pool.registration
        if registration is None:
            return None
        name, state = pool.spec.name, pool.following
        with pool.lock:
            if state.successor is not None:
                return state.successor
            if state.checked_at >= since:
                if state.check_error is not None:
                    raise state.check_error
                return None
            state.checked_at = self._clock()
            config = self._triton.model_config(name, registration.model_version)
            if not registration.follows:
                current = registration.resolve_from_config(name, config)
                found = [] if current is None else differences(pool.spec, current)
                state.check_error = changed_error(pool.spec, found, cause) if found else None
                if state.check_error is not None:
                    raise state.check_error
                return None
            spec = registration.resolve(name, lambda: config)
            if spec == pool.spec:
                return None
        assert pool.sizing is not None  # a pool this client owns
        return self._replace(pool, spec, pool.sizing, registration)

    def follow_change(
        self,
        pool: ModelPool,
        *,
        since: float,
        cause: TritonServerError,
        proven: bool,
        deadline: float | None = None,
    ) -> ModelPool | None:
        """:meth:`follow` after a call failed in a way a change of the model explains; where
        it proves the change (``proven``), Triton's config is read again until it shows it,
        for a while Triton reloads a model its config may still read as before.

        Args:
            pool: The pool the call ran on.
            since: As for :meth:`follow`.
            cause: What the call ran into.
            proven: Whether ``cause`` proves the change (an answer that fits no spec).
            deadline: The call's deadline, a reading of the clock: the config is read again
                until then at the latest (``None``: for :data:`_CONFIG_CATCH_UP_S`).

        Returns:
            The pool to use now, or ``None`` if the model did not change.
        """
        newer = self.follow(pool, since=since, cause=cause)
        if newer is None and proven:
            newer = self._catch_up(pool, cause, deadline)
        return newer

    def _catch_up(
        self, pool: ModelPool, cause: TritonServerError, deadline: float | None
    ) -> ModelPool | None:
        """The pool of the model's new config, read again until it differs from ``pool``'s
        (``None``: it did not within :data:`_CONFIG_CATCH_UP_S`, or by ``deadline``)."""
        end = self._clock() + _CONFIG_CATCH_UP_S
        if deadline is not None:
            end = min(end, deadline)
        while not self._closed():
            left = end - self._clock()
            if left <= 0:
                break
            self._sleep(min(_CONFIG_POLL_S, left))
            newer = self.follow(pool, since=self._clock(), cause=cause)
            if newer is not None:
                return newer
        return None

    def maybe_check(self, pool: ModelPool) -> None:
        """Every ``config_check_interval_s``, compares the config of a model whose pool
        follows it with the pool, in the background."""
        if self._interval_s is None or not pool.follows:
            return
        now = self._clock()
        if now < pool.following.next_check:
            return
        pool.following.next_check = now + self._interval_s
        threading.Thread(
            target=self._check_quietly, args=(pool,), name="ray-triton-shm-config", daemon=True
        ).start()

    def _check_quietly(self, pool: ModelPool) -> None:
        try:
            self.follow(pool, since=self._clock())
        except Exception as exc:  # a request that meets the problem reports it
            logger.debug("ray-triton-shm: checking the config of %r: %s", pool.spec.name, exc)
