"""Node batching: small requests of any process on the machine merged into one Triton request,
in one slot (opt-in per model: :class:`NodeBatching`).

Triton pays its own cost for every request (parse, schedule, respond: a few hundred
microseconds), whoever sends it, and its dynamic batcher merges requests only after each paid
it. The processes of a node already share a model's region, so a call of a few rows can join a
batch another caller opened in a slot (see :mod:`.._slots._board`): it writes its rows there
and waits; the batch's leader sends one request for all of them, and each caller reads back its
own rows.

When a batch goes out is written here once, as a sans-I/O rule (driven like
:func:`._engine.run`):

- **no waiting for company**: a caller that finds no open batch to join goes at once, the
  engine's way (:func:`._engine.run`), while fewer than :attr:`NodeBatching.max_in_triton`
  requests of the model are in Triton (at low load there are none, so a caller alone never
  waits, and pays for node batching a look at a few words);
- else it opens a batch, which stays open for others to join, and goes out as soon as the
  model's requests in Triton fall below that, when it is full, or when it has waited
  :attr:`NodeBatching.max_delay_s` (Triton's ``max_queue_delay_microseconds``, on the node),
  whichever comes first;
- only calls that can share a request join each other: the same pool (model version and
  layout), the same per-row shapes and the same request options; a sequence step, a call of
  more rows than a batch takes, or one in a pool by value or in GPU memory goes alone.

Exact answers: each caller reads only its own rows, the slot is given back only once every
member has read its rows, a member that died has its rows dropped, and a batch whose leader
gave up or died is sent again by each member (its rows, in another batch).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Generator, Mapping
from typing import Any

import numpy as np

from .._exceptions import TritonServerError
from .._slots._board import BatchState, Seat
from .._slots._specs import ModelSpec
from ._engine import Chunk, Step, Steps, SuspectedChange, answer_steps, run
from ._inputs import Batch
from ._model_change import answer_mismatch
from ._model_pool import ModelPool
from ._options import RequestOptions
from ._outputs import OutputAssembler

__all__ = ["batch_key", "joins_batches", "run_batched"]

#: How often a member sends its rows again when their batch is lost before it gives up.
_MAX_LOST = 3
#: How often a batch waiting for company looks whether the model's requests in Triton fell
#: below ``max_in_triton`` (a look reads a word per slot; a leader is the one caller that
#: looks, however many members wait on it in the kernel).
_LOOK_AGAIN_S = 0.0002


def joins_batches(
    pool: ModelPool, batch: Batch, options: RequestOptions | None, outputs_as: str
) -> bool:
    """Whether a call of ``batch`` goes through the pool's batches: it may join one (its
    kind, its size), and there is one to join or company to wait for (else it goes alone, the
    engine's way, at once: a few words read)."""
    policy, board = pool.batching, pool.board
    if (
        policy is None
        or board is None
        or pool.memory.device is not None
        or outputs_as != "numpy"
        or not 0 < batch.size < policy.capacity(pool.spec)
        or (options is not None and options.is_sequence)
    ):
        return False
    size = pool.slots.size
    return pool.header.in_triton(size) >= policy.max_in_triton or board.any_open(size)


def batch_key(batch: Batch, options: RequestOptions | None) -> int:
    """What calls must share to join one batch, as a word every process computes alike."""
    text = repr((sorted(batch.sample_shapes.items()), options)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


class _Rows:
    """Rows ``start:start+rows`` of a slot, as the engine's slot views (a ``SlotIO``)."""

    __slots__ = ("inputs", "outputs")

    def __init__(
        self,
        views: Any,
        start: int,
        inputs: Mapping[str, tuple[int, ...]],
        outputs: Mapping[str, tuple[int, ...]],
    ) -> None:
        self.inputs = {
            name: views.inputs[name][start * math.prod(shape) :] for name, shape in inputs.items()
        }
        self.outputs = {
            name: views.outputs[name][start * math.prod(shape) :] for name, shape in outputs.items()
        }

    def write_device(self, name: str, value: Any, start: int, nbytes: int) -> None:
        raise TypeError(f"input {name!r}: a GPU tensor goes alone, never in a node batch")

    def commit(self, written: Any, staged: Any) -> None:
        """Nothing to do: Triton reads system memory where it is."""

    def output(self, name: str, nbytes: int) -> np.ndarray:
        return self.outputs[name]

    def close(self) -> None:
        """Nothing to free."""


def run_batched(
    pool: ModelPool,
    batch: Batch,
    *,
    slot_timeout_s: float | None,
    client_timeout_s: float | None,
    request_id: str,
    options: RequestOptions | None = None,
) -> Steps:
    """The steps of one call of ``batch`` through the pool's batches; returns the outputs."""
    assert pool.board is not None and pool.batching is not None
    key = batch_key(batch, options)
    names = None if options is None else options.outputs
    started = time.monotonic_ns()
    policy, size = pool.batching, pool.slots.size
    for _ in range(_MAX_LOST):
        seat = pool.board.join(key, batch.size, size)
        if seat is None:
            if pool.header.in_triton(size) < policy.max_in_triton:
                # nobody to wait for: the engine's way, at once
                return (
                    yield from run(
                        pool,
                        batch,
                        slot_timeout_s=slot_timeout_s,
                        request_id=request_id,
                        options=options,
                    )
                )
            seat = yield from _open(pool, batch, key, slot_timeout_s)
        if seat.leader:
            return (yield from _lead(pool, batch, seat, options, request_id, started))
        outputs = yield from _member(pool, batch, seat, names, client_timeout_s)
        if outputs is not None:
            return outputs
    raise TritonServerError(
        f"model {pool.spec.name!r}: the node batch of this call was lost {_MAX_LOST} times "
        "(its sender gave it up or died each time before Triton answered)",
        model=pool.spec.name,
    )


def _open(
    pool: ModelPool, batch: Batch, key: int, slot_timeout_s: float | None
) -> Generator[tuple[Step, Any], Any, Seat]:
    """A seat in a batch: one opened on a free slot, or, after waiting for a slot, one that
    opened meanwhile."""
    assert pool.board is not None and pool.batching is not None
    waiting = time.monotonic_ns()
    slot = pool.slots.try_acquire()
    if slot is None:
        slot = yield Step.SLOT, slot_timeout_s
        joined = pool.board.join(key, batch.size, pool.slots.size)
        if joined is not None:
            pool.slots.release(slot)
            return joined
    slot = pool.take(slot)
    pool.header.count_take(slot, time.monotonic_ns() - waiting)
    try:
        return pool.board.open(slot, key, batch.size, pool.batching.capacity(pool.spec))
    except BaseException:
        pool.slots.release(slot)
        raise


def _lead(
    pool: ModelPool,
    batch: Batch,
    seat: Seat,
    options: RequestOptions | None,
    request_id: str,
    started: int,
) -> Steps:
    """The leader's steps: its rows written, company waited for, the members' rows waited for,
    one request sent, the answer recorded for every member, and its own rows read."""
    board = pool.board
    assert board is not None
    chunk = None
    try:
        batch.write_chunk(_Rows(pool.views[seat.slot], 0, batch.sample_shapes, {}), 0, seat.rows)
        yield from _wait_for_company(pool, seat)
        count = board.seal(seat)
        for member in range(count):
            yield Step.LOCK, board.writer_wait(seat, member)
        board.sent(seat)
        total = board.rows(seat)
        chunk = _chunk(pool, batch, seat, total, options, request_id, started)
        answered = yield from answer_steps(chunk)
    except BaseException as exc:
        _give_up(pool, seat, chunk, exc)
        raise
    try:
        outputs, row_shapes = _collect(pool, chunk, answered, total, seat.rows, options)
    except BaseException as exc:
        _give_up(pool, seat, chunk, exc, answered=True)
        raise
    board.answered(seat, row_shapes)
    try:
        if count:  # a member that reads while the slot went on finds its batch's gone
            yield Step.LOCK, board.readers_wait(seat)
    finally:
        board.done(seat)
        pool.slots.release(seat.slot)
    return outputs


def _wait_for_company(pool: ModelPool, seat: Seat) -> Generator[tuple[Step, Any], Any, None]:
    """Waits while the model's earlier batches fill Triton, at most ``max_delay_s`` since the
    batch opened, and never once it is full."""
    board, policy = pool.board, pool.batching
    assert board is not None and policy is not None
    opened = board.opened_ns(seat)
    deadline = opened + int(policy.max_delay_s * 1e9)
    try:
        while not board.full(seat):
            left_s = (deadline - time.monotonic_ns()) / 1e9
            if pool.header.in_triton(pool.slots.size) < policy.max_in_triton or left_s <= 0:
                return
            yield Step.PAUSE, min(left_s, _LOOK_AGAIN_S)
    finally:
        pool.header.count_company_wait(seat.slot, time.monotonic_ns() - opened)


def _chunk(
    pool: ModelPool,
    batch: Batch,
    seat: Seat,
    total: int,
    options: RequestOptions | None,
    request_id: str,
    started: int,
) -> Chunk:
    """The request of the whole batch: ``total`` rows of the leader's per-row shapes, pointing
    at the slot, or by value, read out of it."""
    views, shapes = pool.views[seat.slot], batch.sample_shapes
    if pool.by_value:
        rows = {
            t.name: views.inputs[t.name][: total * math.prod(shapes[t.name])].reshape(
                total, *shapes[t.name]
            )
            for t in pool.spec.inputs
        }
        gathered = Batch(pool.spec, total, shapes, rows)
        request, sizes = pool.requests.write(
            seat.slot, views, gathered, 0, total, request_id, options
        )
        return Chunk(pool, seat.slot, 0, request, pool.epoch, total, sum(sizes), started)
    sizes = [total * math.prod(shapes[t.name]) * t.dtype.itemsize for t in pool.spec.inputs]
    request = pool.requests.prepare(seat.slot, total, shapes, sizes, request_id)  # type: ignore[union-attr]
    if options is not None:
        request = options.apply(request)
    return Chunk(pool, seat.slot, 0, request, pool.epoch, total, sum(sizes), started)


def _collect(
    pool: ModelPool,
    chunk: Chunk,
    answered: Any,
    total: int,
    rows: int,
    options: RequestOptions | None,
) -> tuple[dict[str, Any], list[tuple[int, ...] | None]]:
    """The leader's own rows, and each output's row shape for the members (counted)."""
    spec = pool.spec
    mismatch = answer_mismatch(spec, answered)
    if mismatch is not None:
        error = TritonServerError(
            f"model {spec.name!r} answered outputs that do not fit the specs it was "
            f"registered with: {mismatch}",
            model=spec.name,
        )
        raise SuspectedChange(error, executed=True)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, _, shape, contents in answered:
        if not shape or shape[0] != total:
            raise TritonServerError(
                f"model {spec.name!r}: output {name!r} came back as {shape} for a batch of "
                f"{total} rows",
                model=spec.name,
            )
        shapes[name] = tuple(shape[1:])
        if pool.by_value:  # into the slot, where every member reads its rows
            _place_answered(pool, chunk.slot, name, shape, contents)
    row_shapes = [shapes.get(t.name) for t in spec.outputs]
    names = None if options is None else options.outputs
    outputs = _read_rows(pool, chunk.slot, 0, rows, shapes, names)
    bytes_out = sum(
        total * math.prod(shape) * spec.outputs_by_name[name].dtype.itemsize
        for name, shape in shapes.items()
    )
    latency_ns = time.monotonic_ns() - chunk.started_ns
    pool.header.count(chunk.slot, total, chunk.bytes_in, bytes_out, latency_ns)
    return outputs, row_shapes


def _place_answered(
    pool: ModelPool, slot: int, name: str, shape: tuple[int, ...], contents: bytes
) -> None:
    """Copies an output Triton answered by value into the slot's place for it.

    Raises:
        TritonServerError: it does not fit there, or its bytes are not its shape's.
    """
    space = pool.views[slot].outputs[name]
    count = math.prod(shape)
    if count > space.size or len(contents) != count * space.itemsize:
        raise TritonServerError(
            f"model {pool.spec.name!r}: output {name!r} of shape {shape} came back as "
            f"{len(contents)} bytes, for room of {space.size} {space.dtype} values",
            model=pool.spec.name,
        )
    space[:count] = np.frombuffer(contents, space.dtype, count)


def _read_rows(
    pool: ModelPool,
    slot: int,
    start: int,
    rows: int,
    shapes: Mapping[str, tuple[int, ...]],
    names: tuple[str, ...] | None,
) -> dict[str, Any]:
    """Rows ``start:start+rows`` of each answered output, copied out of the slot."""
    outputs = OutputAssembler(pool.spec, rows, names)
    answered = [
        (name, pool.spec.outputs_by_name[name].datatype, (rows, *shape), b"")
        for name, shape in shapes.items()
    ]
    outputs.add(_Rows(pool.views[slot], start, {}, shapes), 0, answered)
    return outputs.result()


def _give_up(
    pool: ModelPool, seat: Seat, chunk: Chunk | None, exc: BaseException, answered: bool = False
) -> None:
    """Ends the leader's batch after ``exc``: Triton's error goes to every member; anything
    else (an interrupt, a deadline, Triton unreachable) makes them send their rows again."""
    board = pool.board
    assert board is not None
    triton_said = (
        chunk is not None
        and not chunk.in_triton
        and isinstance(exc, (TritonServerError, SuspectedChange))
    )
    if triton_said or answered:
        error = exc.error if isinstance(exc, SuspectedChange) else exc
        assert isinstance(error, TritonServerError)
        board.failed(seat, error.status or "", error.server_message or str(error))
    else:
        board.lost(seat)
    board.done(seat)
    if chunk is None:
        pool.slots.release(seat.slot)
    else:
        chunk.abandon()


def _member(
    pool: ModelPool,
    batch: Batch,
    seat: Seat,
    names: tuple[str, ...] | None,
    client_timeout_s: float | None,
) -> Generator[tuple[Step, Any], Any, dict[str, Any] | None]:
    """A member's steps: its rows written, the answer waited for, its rows read; ``None`` if
    the batch was lost (the caller sends its rows again)."""
    board = pool.board
    assert board is not None
    try:
        written = False
        try:
            rows = _Rows(pool.views[seat.slot], seat.start, batch.sample_shapes, {})
            batch.write_chunk(rows, 0, seat.rows)
            written = True
        finally:
            board.written(seat, written)
        if not (yield Step.LOCK, board.answer_wait(seat.slot, client_timeout_s)):
            raise _no_answer(pool.spec, client_timeout_s)
        return _outcome(pool, seat, names)
    finally:
        board.leave(seat)


def _outcome(pool: ModelPool, seat: Seat, names: tuple[str, ...] | None) -> dict[str, Any] | None:
    """What the member's batch ended with: its rows, Triton's error raised, or ``None``."""
    board, spec = pool.board, pool.spec
    assert board is not None
    state = board.outcome(seat)
    if state == BatchState.FAILED:
        status, message = board.error(seat)
        raise TritonServerError(
            f"inference for model {spec.name!r} failed (in a node batch): {message}",
            status=status or None,
            server_message=message,
            model=spec.name,
        )
    if state != BatchState.ANSWERED:
        return None
    row_shapes = board.row_shapes(seat, len(spec.outputs))
    if row_shapes is None:
        return None
    shapes = {t.name: s for t, s in zip(spec.outputs, row_shapes) if s is not None}
    outputs = _read_rows(pool, seat.slot, seat.start, seat.rows, shapes, names)
    if board.outcome(seat) != BatchState.ANSWERED:  # the slot went on meanwhile: stray words
        return None
    return outputs


def _no_answer(spec: ModelSpec, timeout_s: float | None) -> TritonServerError:
    return TritonServerError(
        f"inference for model {spec.name!r} got no answer within client_timeout_s="
        f"{timeout_s} s (its node batch goes on in Triton without this call's rows being read)",
        status="StatusCode.DEADLINE_EXCEEDED",
        server_message="Deadline Exceeded",
        model=spec.name,
    )
