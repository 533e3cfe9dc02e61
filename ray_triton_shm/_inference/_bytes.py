"""BYTES (string) tensors in Triton's serialized form.

Triton carries a BYTES tensor as its elements in row-major order, each a 4-byte little-endian
length followed by that many bytes: the format of ``tritonclient.utils.serialize_byte_tensor``.
Inputs are serialized once, up front (so an element that is too long is an error before any byte
is written), with the offset where each sample starts, so that chunks are plain byte ranges.
Outputs are read back from the slot, element by element, within the slot's space.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

import numpy as np

from .._exceptions import InvalidInputError

__all__ = ["EncodedBytes", "decode", "encode"]

_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class EncodedBytes:
    """One BYTES input, serialized.

    Attributes:
        data: Every element, length-prefixed, in row-major order.
        sample_offsets: Where each sample starts in ``data``, and its end as the last entry.
    """

    data: bytes
    sample_offsets: list[int]

    def chunk(self, start: int, stop: int) -> memoryview:
        """The bytes of samples ``start:stop``."""
        offsets = self.sample_offsets
        return memoryview(self.data)[offsets[start] : offsets[stop]]


def encode(
    array: np.ndarray, samples: int, *, model: str, tensor: str, max_element_bytes: int
) -> EncodedBytes:
    """Serializes an array of ``bytes``/``str`` elements (``str`` as UTF-8).

    Args:
        array: An object, ``S`` or ``U`` array; its elements in row-major order.
        samples: How many samples the array holds (its elements divide evenly among them).
        model: The model, for errors.
        tensor: The tensor, for errors.
        max_element_bytes: The longest element the tensor's slots hold.

    Raises:
        InvalidInputError: an element is neither bytes nor str, or is longer than allowed.
    """
    elements = [
        e if type(e) is bytes else _as_bytes(e, model=model, tensor=tensor)
        for e in array.reshape(-1).tolist()
    ]
    lengths = list(map(len, elements))
    longest = max(lengths, default=0)
    if longest > max_element_bytes:
        index = lengths.index(longest)
        raise InvalidInputError(
            f"model {model!r}: input {tensor!r} element {index} is {longest} bytes, more than "
            f"its max_element_bytes of {max_element_bytes}; register the model with "
            f"max_element_bytes={{{tensor!r}: {longest}}} or more",
            model=model,
            tensor=tensor,
            expected=max_element_bytes,
            actual=longest,
        )
    data = b"".join(itertools.chain.from_iterable(zip(map(_LENGTH.pack, lengths), elements)))
    sizes = [n + _LENGTH.size for n in lengths]
    per_sample = len(sizes) // samples if samples else 0
    if per_sample != 1:
        sizes = [sum(sizes[i : i + per_sample]) for i in range(0, len(sizes), per_sample or 1)]
    return EncodedBytes(data, [0, *itertools.accumulate(sizes)])


def _as_bytes(element: object, *, model: str, tensor: str) -> bytes:
    if isinstance(element, bytes):
        return element
    if isinstance(element, str):
        return element.encode()
    if isinstance(element, (bytearray, memoryview)):
        return bytes(element)
    raise InvalidInputError(
        f"model {model!r}: input {tensor!r} is a BYTES tensor; its elements must be bytes or "
        f"str, got {type(element).__name__}",
        model=model,
        tensor=tensor,
        expected="bytes or str",
        actual=type(element).__name__,
    )


def decode(space: np.ndarray, count: int) -> tuple[np.ndarray, int] | None:
    """Reads ``count`` serialized elements from the start of ``space`` (a ``uint8`` view).

    Returns:
        A flat object array of ``bytes`` and the bytes read, or ``None`` if the elements run
        past ``space``.
    """
    buffer = space.data
    end = len(buffer)
    unpack = _LENGTH.unpack_from
    elements = []
    position = 0
    for _ in range(count):
        if position + 4 > end:
            return None
        (length,) = unpack(buffer, position)
        position += 4
        if position + length > end:
            return None
        elements.append(buffer[position : position + length].tobytes())
        position += length
    result = np.empty(count, np.object_)
    result[:] = elements
    return result, position
