"""Copies outputs out of slots into arrays that belong to the caller.

A call's outputs may come back in several chunks (one per slot used); each chunk's outputs are
copied out of shared memory as soon as it is answered, so the slot can be reused, and put in
place in the caller's arrays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ._exceptions import TritonServerError
from ._specs import ModelSpec, SlotViews

__all__ = ["OutputAssembler", "empty_outputs"]


class OutputAssembler:
    """Assembles the outputs of one call of ``total`` samples.

    Args:
        spec: The model.
        total: Samples in the whole call.
    """

    def __init__(self, spec: ModelSpec, total: int) -> None:
        self._spec = spec
        self._total = total
        self._arrays: dict[str, np.ndarray] = {}

    def add(
        self, slot: SlotViews, start: int, shapes: Iterable[tuple[str, tuple[int, ...]]]
    ) -> int:
        """Copies one chunk's outputs out of a slot; returns the bytes copied.

        Args:
            slot: The slot the chunk used.
            start: Index of the chunk's first sample in the call.
            shapes: Name and shape of each output, as Triton answered.

        Raises:
            TritonServerError: an output larger than its place in the slot, or chunks whose
                per-sample output shapes differ.
        """
        copied = 0
        for name, shape in shapes:
            space = slot.outputs[name]
            count = math.prod(shape)
            if count > space.size:
                raise TritonServerError(
                    f"model {self._spec.name!r}: output {name!r} has shape {shape}, larger "
                    f"than the {space.nbytes} bytes its slot holds; register a larger "
                    "max_shapes entry",
                    model=self._spec.name,
                )
            view = space[:count].reshape(shape)
            copied += view.nbytes
            if not self._spec.batched or (start == 0 and shape[0] == self._total):
                self._arrays[name] = view.copy()  # the whole result in one chunk
                continue
            array = self._arrays.get(name)
            if array is None:
                array = np.empty((self._total, *shape[1:]), space.dtype)
                self._arrays[name] = array
            elif array.shape[1:] != shape[1:]:
                raise TritonServerError(
                    f"model {self._spec.name!r}: output {name!r} came back as "
                    f"{shape[1:]} per sample in one chunk and {array.shape[1:]} in another; "
                    "call with at most max_batch_size samples for such outputs",
                    model=self._spec.name,
                )
            array[start : start + shape[0]] = view
        return copied

    def result(self) -> dict[str, np.ndarray]:
        """The outputs, by name, in the model's order."""
        return {t.name: self._arrays[t.name] for t in self._spec.outputs}


def empty_outputs(spec: ModelSpec) -> dict[str, np.ndarray]:
    """Outputs of an empty batch: zero samples, each variable dim 0."""
    return {t.name: np.empty((0, *(max(d, 0) for d in t.shape)), t.dtype) for t in spec.outputs}
