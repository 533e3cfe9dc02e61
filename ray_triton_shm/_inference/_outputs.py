"""Copies outputs out of slots into arrays that belong to the caller.

A call's outputs may come back in several chunks (one per slot used); each chunk's outputs are
copied out of shared memory as soon as it is answered, so the slot can be reused, and put in
place in the caller's arrays. BYTES outputs become object arrays of ``bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from .._exceptions import TritonServerError
from .._slots._memory import SlotIO
from .._slots._specs import ModelSpec, TensorSpec
from .._wire._triton_errors import output_overflow
from ._bytes import decode

__all__ = [
    "OutputAssembler",
    "check_room",
    "empty_outputs",
    "overflow_message",
    "overflowed_output",
    "read_bytes",
]


class OutputAssembler:
    """Assembles the outputs of one call of ``total`` samples.

    Args:
        spec: The model.
        total: Samples in the whole call.
        names: The outputs asked for, in the model's order (``None``: all of them).
        by_value: Whether Triton answers every output in its response (a pool by value),
            not in the slot.
    """

    def __init__(
        self,
        spec: ModelSpec,
        total: int,
        names: tuple[str, ...] | None = None,
        *,
        by_value: bool = False,
    ) -> None:
        self._spec = spec
        self._total = total
        self._names = names
        self._by_value = by_value
        self._arrays: dict[str, np.ndarray] = {}

    def add(
        self,
        slot: SlotIO,
        start: int,
        answered: Iterable[tuple[str, str, tuple[int, ...], bytes]],
    ) -> int:
        """Copies one chunk's outputs out of a slot; returns the bytes copied.

        Args:
            slot: The slot the chunk used.
            start: Index of the chunk's first sample in the call.
            answered: Name, datatype, shape and inline contents of each output, as Triton
                answered
                (contents only for the model's ``inline_outputs``).

        Raises:
            TritonServerError: an output larger than its place in the slot, or chunks whose
                per-sample output shapes differ.
        """
        copied = 0
        for name, _, shape, contents in answered:
            strings = name in self._spec.bytes_outputs
            if strings:
                values, used = read_bytes(
                    self._spec, slot, name, shape, contents, by_value=self._by_value
                )
            elif self._by_value:
                values, used = self._answered_numbers(name, shape, contents)
            else:
                values, used = self._read_numbers(name, slot, shape)
            copied += used
            self._place(name, values, start, fresh=strings)
        return copied

    def _read_numbers(
        self, name: str, slot: SlotIO, shape: tuple[int, ...]
    ) -> tuple[np.ndarray, int]:
        """A view of an output in its slot, and its size in bytes."""
        space = slot.outputs[name]
        count = check_room(self._spec, name, space, shape)
        view = slot.output(name, count * space.itemsize)[:count].reshape(shape)
        return view, view.nbytes

    def _answered_numbers(
        self, name: str, shape: tuple[int, ...], contents: bytes
    ) -> tuple[np.ndarray, int]:
        """An output Triton answered in its response, as a read-only view of it."""
        dtype = self._spec.outputs_by_name[name].dtype
        count = math.prod(shape)
        if len(contents) != count * dtype.itemsize:
            raise TritonServerError(
                f"model {self._spec.name!r}: output {name!r} of shape {shape} came back as "
                f"{len(contents)} bytes, not the {count * dtype.itemsize} of {count} {dtype}",
                model=self._spec.name,
            )
        return np.frombuffer(contents, dtype, count).reshape(shape), len(contents)

    def _place(self, name: str, values: np.ndarray, start: int, *, fresh: bool) -> None:
        """Puts one chunk's ``values`` at ``start`` in the caller's array (copied out of the
        slot unless ``fresh``, i.e. already the caller's own)."""
        shape = values.shape
        if not self._spec.batched or (start == 0 and shape[0] == self._total):
            self._arrays[name] = values if fresh else values.copy()  # the whole result
            return
        array = self._arrays.get(name)
        if array is None:
            array = np.empty((self._total, *shape[1:]), values.dtype)
            self._arrays[name] = array
        elif array.shape[1:] != shape[1:]:
            raise TritonServerError(
                f"model {self._spec.name!r}: output {name!r} came back as "
                f"{shape[1:]} per sample in one chunk and {array.shape[1:]} in another; "
                "call with at most max_batch_size samples for such outputs",
                model=self._spec.name,
            )
        array[start : start + shape[0]] = values

    def result(self) -> dict[str, np.ndarray]:
        """The outputs asked for, by name, in the model's order."""
        if self._names is not None:
            return {name: self._arrays[name] for name in self._names}
        return {t.name: self._arrays[t.name] for t in self._spec.outputs}


def check_room(spec: ModelSpec, name: str, space: np.ndarray, shape: tuple[int, ...]) -> int:
    """The elements of numeric output ``name`` of ``shape``, checked against its ``space`` in a
    slot.

    Raises:
        TritonServerError: Triton answered a larger output than its place holds.
    """
    count = math.prod(shape)
    if count > space.size:
        raise TritonServerError(
            f"model {spec.name!r}: output {name!r} has shape {shape}, larger than the "
            f"{space.nbytes} bytes its slot holds; register a larger max_shapes entry",
            model=spec.name,
        )
    return count


def read_bytes(
    spec: ModelSpec,
    slot: SlotIO,
    name: str,
    shape: tuple[int, ...],
    contents: bytes,
    *,
    by_value: bool = False,
) -> tuple[np.ndarray, int]:
    """A BYTES output as a new object array of ``shape``, and the serialized bytes it took:
    from Triton's response (``contents``) for one of the model's ``inline_outputs`` or a pool
    ``by_value``, else from its place in ``slot``.

    Raises:
        TritonServerError: the elements run past the place the slot has for them.
    """
    inline = by_value or name in spec.inline_outputs
    space = np.frombuffer(contents, np.uint8) if inline else slot.outputs[name]
    decoded = decode(space, math.prod(shape))
    if decoded is None:
        raise TritonServerError(
            f"model {spec.name!r}: output {name!r} of shape {shape} runs past the "
            f"{space.nbytes} bytes its slot holds; register a larger max_element_bytes "
            f"entry for {name!r}",
            model=spec.name,
        )
    elements, used = decoded
    return elements.reshape(shape), used


def empty_outputs(spec: ModelSpec, names: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """Outputs of an empty batch: zero samples, each variable dim 0."""
    return {
        t.name: np.empty((0, *(max(d, 0) for d in t.shape)), t.dtype)
        for t in spec.outputs
        if names is None or t.name in names
    }


def overflowed_output(spec: ModelSpec, server_message: str) -> TensorSpec | None:
    """The output Triton answered did not fit its place in the slot, if that is what
    ``server_message`` says and the pool knows the output."""
    match = output_overflow(server_message)
    return None if match is None else spec.outputs_by_name.get(match.group(1))


def overflow_message(spec: ModelSpec, server_message: str) -> str | None:
    """A message that says which maximum to raise, when Triton answered that an output did not
    fit its place in the slot; ``None`` for any other answer."""
    match = output_overflow(server_message)
    if match is None:
        return None
    name, given, needed = match.group(1), int(match.group(2)), int(match.group(3))
    tensor = next((t for t in spec.outputs if t.name == name), None)
    if tensor is not None and tensor.is_bytes:
        raise_this = (
            f"max_element_bytes={{{name!r}: ...}} (now {tensor.max_element_bytes} per element)"
        )
    else:
        raise_this = f"max_shapes={{{name!r}: ...}}"
    return (
        f"model {spec.name!r}: output {name!r} did not fit its slot: Triton needed {needed} "
        f"bytes, the slot holds {given}; register the model with a larger {raise_this}"
    )
