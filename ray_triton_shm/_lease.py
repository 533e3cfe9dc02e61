"""Slot leases: a caller writes its inputs where Triton reads them, and reads the outputs where
Triton wrote them. No copy in, no copy out.

A lease takes one slot with the rules of any call: backpressure, the fair queue,
``max_waiting``, the slot deadline, a model that moved to a new layout. It then hands out NumPy
arrays that *are* the slot's memory. :attr:`SlotLease.inputs` are writable and shaped for the
batch asked for. :meth:`SlotLease.infer` sends the one request a lease makes, and returns the
outputs as read-only views. So a lease is one slot and one request: at most ``max_batch_size``
samples.

**Views never show another request's bytes.** A slot goes back to the pool only once the lease
ended *and* no array made from it is alive. Every array the lease gives out, and every view
of those, keeps one buffer object alive, and a finalizer on that buffer gives the slot back.
An output kept past the ``with`` block keeps its slot out of the pool until it is dropped.
Such a slot, which Triton is done with, is *kept* (see :mod:`._slots._slot_pool`): closing the
client does not wait for it (its memory stays mapped while the arrays live), and a caller left
waiting for a slot is told where the lease keeping it was made. If the lease ends while its request
is in Triton (an exception in the block, a deadline, a cancellation), the slot then follows the
rules of a request given up: it comes back once Triton is proven done with it (see
:mod:`._pools._abandoned`).

**BYTES tensors** are a length-prefixed serialization, not an array one can write in place,
so a lease refuses a model with BYTES inputs (``infer_shm`` encodes them into the slot, which
is the one copy there is anyway). BYTES outputs come back decoded, as copies. Leases need a
pool in system memory.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import math
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Generator, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from ._calls import Call
from ._drive import drive, drive_async
from ._exceptions import ClientClosedError, InvalidInputError, TritonServerError, TritonSHMError
from ._inference._engine import Chunk, Step, SuspectedChange, answer_steps
from ._inference._model_change import answer_mismatch
from ._inference._model_pool import ModelPool
from ._inference._options import RequestOptions
from ._inference._outputs import check_room, read_bytes
from ._inference._requests import SlotRequests
from ._pools._retry import RETIRED, Moves
from ._slots._specs import TensorSpec
from ._wire._http import Answer

__all__ = ["SlotLease"]

logger = logging.getLogger(__name__)

#: Frames in this folder are the library's: a lease's site is the first frame outside it.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class _Releaser:
    """Gives back the slots whose last array the garbage collector dropped, on a thread of
    its own: the collector may run in a thread that holds a pool's lock, where giving a slot
    back could deadlock."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Fate] = queue.SimpleQueue()  # safe in finalizers
        self._pid = 0
        self._lock = threading.Lock()

    def put(self, fate: _Fate) -> None:
        if self._pid != os.getpid():  # none yet, or one of the parent's before a fork
            with self._lock:
                if self._pid != os.getpid():
                    self._pid = os.getpid()
                    self._queue = queue.SimpleQueue()
                    threading.Thread(
                        target=self._run, args=(self._queue,), name="lease-releaser", daemon=True
                    ).start()
        self._queue.put(fate)

    @staticmethod
    def _run(fates: queue.SimpleQueue[_Fate]) -> None:
        while True:
            fates.get().end()


_RELEASER = _Releaser()
_collecting = False


def _gc_phase(phase: str, info: dict[str, int]) -> None:
    global _collecting
    _collecting = phase == "start"


gc.callbacks.append(_gc_phase)


def _finalize(fate: _Fate) -> None:
    """A leased slot's last array is gone: give the slot back here, where its last reference
    was dropped, unless the garbage collector dropped it (then on the releaser's thread)."""
    if _collecting:
        _RELEASER.put(fate)
    else:
        fate.end()


class _Fate:
    """What becomes of a leased slot once the lease ended and its last array is gone.

    Holds no reference to the slot's buffer: a finalizer of the buffer calls :meth:`end`.
    """

    def __init__(self, pool: ModelPool, slot: int, site: str) -> None:
        self.pool = pool
        self.slot = slot
        self.site = site
        self.chunk: Chunk | None = None
        self.answered = False

    def keep(self) -> None:
        """Triton is done with the slot (answered, or sent nothing): only arrays keep it."""
        self.pool.slots.keep(self.slot, self.site)

    def end(self) -> None:
        """Gives the slot back: at once if no request of it may still be in Triton, else
        by the rules of a request given up."""
        chunk = self.chunk
        try:
            if chunk is None or self.answered:
                self.pool.slots.release(self.slot)
            else:
                chunk.abandon()
        except ClientClosedError:
            pass  # the pool was closed meanwhile: its slots went with it
        except Exception:  # a finalizer must not raise
            logger.exception("ray-triton-shm: giving back the slot of a lease failed")


class SlotLease:
    """One slot of a model's pool, leased: its inputs written in place, its outputs read in
    place.

    Made by :meth:`TritonSHMClient.lease` (or :meth:`ShmModel.lease` in the Ray layer); use it
    in ``with`` (or ``async with``): the slot is taken on entry, and given back once the block
    ended and no array of it is alive any more.

    Example:
        ```python
        with client.lease("classifier", batch=8) as lease:
            preprocess(images, out=lease.inputs["INPUT0"])  # straight into the slot
            probs = lease.infer()["OUTPUT0"]  # a read-only view of Triton's answer
            top = probs.argmax(axis=1)
        ```
    """

    def __init__(
        self,
        call: Call,
        *,
        batch: int | None,
        shapes: Mapping[str, Sequence[int]] | None,
        options: RequestOptions | None,
        slot_timeout_s: float | None,
        request_id: str,
    ) -> None:
        pool = call.pool
        self._call = call
        self._rows = _check_batch(pool, batch)
        self._given = dict(shapes or {})
        self._sample_shapes = _sample_shapes(pool, self._rows, self._given)
        self._options = options
        self._slot_timeout_s = slot_timeout_s
        self._request_id = request_id
        self._site = _caller_site()
        self._lock = threading.Lock()
        self._fate: _Fate | None = None
        self._buffer: Any = None
        self._inputs: dict[str, np.ndarray] = {}
        self._started_ns = 0
        self._sent = False
        self._closed = False

    # ---------------------------------------------------------------- the lease

    @property
    def model_name(self) -> str:
        """The model leased."""
        return self._call.pool.spec.name

    @property
    def batch(self) -> int | None:
        """Samples in the lease's request (``None`` for a model that does not batch)."""
        return self._rows

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """Each input, a writable array that is the slot's memory, shaped ``(batch,
        *sample_shape)`` (``sample_shape`` alone for a model that does not batch). Write
        every element: the slot holds whatever the last request left there."""
        if self._fate is None or self._closed:
            raise RuntimeError("a lease's inputs exist inside its with block")
        return self._inputs

    def __enter__(self) -> SlotLease:
        try:
            slot = drive(self._taking(), self._call.do)
        except TritonSHMError as exc:  # no slot: counted as infer_shm counts it
            self._call.pool.count_failure(exc)
            raise
        self._take(slot)
        return self

    async def __aenter__(self) -> SlotLease:
        try:
            slot = await drive_async(self._taking(), self._call.do_async)
        except TritonSHMError as exc:
            self._call.pool.count_failure(exc)
            raise
        self._take(slot)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the lease: the slot goes back once no array of it is alive (idempotent)."""
        with self._lock:
            fate = self._fate
            if not self._closed and fate is not None and fate.chunk is None:
                fate.keep()  # no request sent: kept by the arrays alone, if any
            self._closed = True
            self._inputs = {}
            self._buffer = None  # with the last array, its finalizer gives the slot back

    # ---------------------------------------------------------------- inference

    def infer(self) -> dict[str, np.ndarray]:
        """Sends the lease's request and waits for Triton's answer.

        Returns:
            ``{output name: array}``: read-only views into the slot for numeric outputs (the
            slot stays out of the pool while any of them is alive), decoded copies for BYTES
            ones.

        Raises:
            TritonServerError: Triton answered with an error, or not within
                ``client_timeout_s`` (the slot comes back once Triton answered).
            ModelChangedError: the model changed on Triton since the lease began: lease again
                (the inputs are in the old layout's slot).
            ServerUnreachableError: Triton stayed unreachable for ``reconnect_timeout_s``.
        """
        chunk = self._request()
        try:
            response = drive(answer_steps(chunk), self._call.do)
        except BaseException as exc:
            self._failed(exc)
        return self._outputs(chunk, response)

    async def infer_async(self) -> dict[str, np.ndarray]:
        """:meth:`infer` for coroutines; cancelling it leaves the slot to Triton's answer."""
        chunk = self._request()
        try:
            response = await drive_async(answer_steps(chunk), self._call.do_async)
        except BaseException as exc:
            self._failed(exc)
        return self._outputs(chunk, response)

    # ---------------------------------------------------------------- internals

    def _taking(self) -> Generator[tuple[Step, Any], Any, int]:
        """The steps that take a slot, following the model to a new layout if it moved."""
        call = self._call
        call.started = time.monotonic()

        def recover(pool: ModelPool, exc: BaseException) -> ModelPool:
            moved = call.moved(exc, self._options)
            self._sample_shapes = _sample_shapes(moved, self._rows, self._given)
            return moved

        moves = Moves(call.pool, RETIRED, recover)
        while True:
            self._started_ns = time.monotonic_ns()
            try:
                slot = yield Step.SLOT, self._slot_timeout_s
                return moves.target.take(slot)
            except moves.handled as exc:
                moves = moves.increment(exc)

    def _take(self, slot: int) -> None:
        pool = self._call.pool
        pool.header.count_take(slot, time.monotonic_ns() - self._started_ns)
        layout = pool.layout
        fate = _Fate(pool, slot, self._site)
        try:
            buffer = (ctypes.c_char * layout.slot_bytes).from_buffer(
                pool.region.buffer, layout.slot_offset(slot)
            )
        except BaseException:
            fate.end()
            raise
        weakref.finalize(buffer, _finalize, fate)
        self._fate, self._buffer = fate, buffer
        self._inputs = {
            t.name: _view(buffer, t, layout.input_offsets[t.name], self._shape(t.name))
            for t in pool.spec.inputs
        }

    def _shape(self, name: str) -> tuple[int, ...]:
        sample = self._sample_shapes[name]
        return sample if self._rows is None else (self._rows, *sample)

    def _request(self) -> Chunk:
        with self._lock:
            if self._fate is None or self._closed:
                raise RuntimeError("infer() is for a lease inside its with block")
            if self._sent:
                raise RuntimeError("a lease makes one request: lease again for another")
            self._sent = True
            fate = self._fate
        pool, slot = fate.pool, fate.slot
        sizes = [self._inputs[t.name].nbytes for t in pool.spec.inputs]
        assert isinstance(pool.requests, SlotRequests)  # a pool by value leases nothing
        request = pool.requests.prepare(
            slot, self._rows, self._sample_shapes, sizes, self._request_id
        )
        if self._options is not None:
            request = self._options.apply(request)
        chunk = Chunk(
            pool, slot, 0, request, pool.epoch, self._rows or 1, sum(sizes), self._started_ns
        )
        fate.chunk = chunk
        return chunk

    def _failed(self, exc: BaseException) -> NoReturn:
        """Raises what the failed request ``exc`` stands for (counted by kind); its slot's fate
        is the lease's."""
        error = exc.error if isinstance(exc, SuspectedChange) else exc
        if isinstance(error, TritonSHMError):
            self._call.pool.count_failure(error)
        if error is exc:
            raise exc
        raise error from exc

    def _outputs(self, chunk: Chunk, answered: Answer) -> dict[str, Any]:
        assert self._fate is not None and self._buffer is not None
        pool, slot = chunk.pool, chunk.slot
        mismatch = answer_mismatch(pool.spec, answered)
        if mismatch is not None:
            pool.header.count_error(slot)
            self._fate.answered = True
            self._fate.keep()
            error = TritonServerError(
                f"model {pool.spec.name!r} answered outputs that do not fit the specs it was "
                f"leased with: {mismatch}; lease again",
                model=pool.spec.name,
            )
            pool.count_failure(error)
            raise error
        outputs: dict[str, Any] = {}
        used = 0
        by_name = {t.name: t for t in pool.spec.outputs}
        for name, _, shape, contents in answered:
            tensor = by_name[name]
            if tensor.is_bytes:
                values, nbytes = read_bytes(pool.spec, pool.views[slot], name, shape, contents)
            else:
                check_room(pool.spec, name, pool.views[slot].outputs[name], shape)
                values = _view(self._buffer, tensor, pool.layout.output_offsets[name], shape)
                values.flags.writeable = False
                nbytes = values.nbytes
            outputs[name] = values
            used += nbytes
        latency_ns = time.monotonic_ns() - chunk.started_ns
        pool.header.count(slot, chunk.rows, chunk.bytes_in, used, latency_ns)
        self._fate.answered = True
        self._fate.keep()
        return outputs


def _caller_site() -> str:
    """``file:line`` of the first caller outside this library: where a lease is made."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _view(buffer: Any, tensor: TensorSpec, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor's place in the leased slot's ``buffer``, as an array of ``shape``."""
    return np.frombuffer(buffer, tensor.dtype, math.prod(shape), offset).reshape(shape)


def _check_batch(pool: ModelPool, batch: int | None) -> int | None:
    """The lease's rows, checked against the model before any slot is taken."""
    spec = pool.spec
    name = spec.name
    if pool.memory.device is not None:
        raise InvalidInputError(
            f"model {name!r}: a lease needs a pool in system memory, and this one is in GPU "
            "memory; call infer_shm, which takes GPU tensors",
            model=name,
            expected="memory='system'",
            actual=pool.memory.kind,
        )
    strings = [t.name for t in spec.inputs if t.is_bytes]
    if strings:
        raise InvalidInputError(
            f"model {name!r}: input {strings[0]!r} is BYTES, which has no fixed place in a slot "
            "to write into: call infer_shm for this model (it encodes them into the slot)",
            model=name,
            tensor=strings[0],
            expected="numeric inputs",
            actual="BYTES",
        )
    if not spec.batched:
        if batch is not None:
            raise InvalidInputError(
                f"model {name!r} does not batch (max_batch_size 0): lease it without batch=",
                model=name,
                expected=None,
                actual=batch,
            )
        return None
    capacity = spec.batch_capacity
    if batch is None or not 1 <= batch <= capacity:
        raise InvalidInputError(
            f"model {name!r}: a lease is one slot and one request, of 1 to {capacity} samples "
            f"(max_batch_size); got batch={batch}",
            model=name,
            expected=f"1 <= batch <= {capacity}",
            actual=batch,
        )
    return batch


def _sample_shapes(
    pool: ModelPool, rows: int | None, shapes: Mapping[str, Sequence[int]] | None
) -> dict[str, tuple[int, ...]]:
    """Each input's per-sample shape: given in ``shapes``, or the model's where nothing
    varies; checked against the dims and against the room each input has in a slot."""
    spec, given = pool.spec, dict(shapes or {})
    names = {t.name for t in spec.inputs}
    unknown = sorted(set(given) - names)
    if unknown:
        raise InvalidInputError(
            f"model {spec.name!r} has no input {unknown[0]!r} (inputs: {sorted(names)})",
            model=spec.name,
            tensor=unknown[0],
            expected=sorted(names),
            actual=unknown[0],
        )
    result = {}
    for tensor in spec.inputs:
        name = tensor.name
        if name not in given:
            if tensor.is_variable:
                raise InvalidInputError(
                    f"model {spec.name!r}: input {name!r} has variable dims {tensor.shape}: "
                    f"give its per-sample shape, shapes={{{name!r}: (...)}}",
                    model=spec.name,
                    tensor=name,
                    expected=tensor.shape,
                    actual=None,
                )
            result[name] = tensor.shape
            continue
        shape = tuple(int(d) for d in given[name])
        most = tensor.max_shape or tensor.shape
        fits = len(shape) == len(tensor.shape) and all(
            d == want or (want == -1 and 0 <= d <= top)
            for d, want, top in zip(shape, tensor.shape, most, strict=True)
        )
        room = pool.layout.capacities[f"in:{name}"] // tensor.dtype.itemsize
        if not fits or math.prod(shape) * (rows or 1) > room:
            raise InvalidInputError(
                f"model {spec.name!r}: input {name!r} per-sample shape must match "
                f"{tensor.shape} within the slot's room ({tensor.max_shape} at most), got "
                f"{shape}",
                model=spec.name,
                tensor=name,
                expected=tensor.max_shape,
                actual=shape,
            )
        result[name] = shape
    return result
