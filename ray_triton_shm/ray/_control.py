"""Calls from a caller's process to its node actor, made so that no Ray cancellation reaches them.

The node actor executes calls in order (see :mod:`._actor`), so a control call that Ray
cancelled (Serve cancelling a request, ``ray.cancel(..., recursive=True)``) would hold up the
caller's later calls. Callers therefore make their few control calls (registering a model,
registering its region again after Triton restarted) from a thread of this module, never from
the caller's Ray task.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import ray

__all__ = ["control_call", "get"]

_T = TypeVar("_T")
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _control() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="ray-triton-shm-control"
            )
        return _executor


def control_call(fn: Callable[[], _T]) -> _T:
    """Runs ``fn`` (which calls the node actor) on a control thread and returns its result."""
    try:
        future = _control().submit(fn)
    except RuntimeError:  # the interpreter is shutting down: no new threads
        return fn()
    return future.result()


def get(ref: Any, timeout_s: float | None = None) -> Any:
    """``ray.get`` that raises our own errors raised inside the actor as themselves."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        raise (cause if isinstance(cause, BaseException) else exc) from None
