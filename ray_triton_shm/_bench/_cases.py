"""A model's workload, made from its configuration on the server: random inputs of each
input's dtype and shape, and the outputs' shapes (and longest BYTES elements) as the server
answers them, which size the slots of the shared-memory paths; and the rule of the example
streaming model, which every response of its streams must follow (:data:`STREAM_RULES`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ray_triton_shm._bench._config import ELASTIC, CaseSpec
from ray_triton_shm._slots._specs import TensorSpec, to_numpy_dtype

__all__ = ["DEFAULT_ELEMENT_BYTES", "STREAM_RULES", "ModelCase", "captioner_responses"]

#: Bytes of each element of a BYTES input whose case gives none.
DEFAULT_ELEMENT_BYTES = 128


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """A benchmark workload: ``batch_size`` samples per request of ``model``, which batches
    (its tensors have a batch dimension) or not. Its tensors' ``shape`` is the configuration's
    dims, ``max_shape`` the shape sent or answered per sample (the outputs': once
    :meth:`with_reference` was called), and BYTES tensors' ``max_element_bytes`` the length of
    each input element, or the room of an output's. A ``streaming`` (decoupled) model answers
    each request with any number of responses; ``values`` are the inputs sent with one value
    in every element, by name (the rest are random). ``model_max_batch_size`` is the model's
    own (its config's), and ``dynamic_batching`` whether its config turns Triton's dynamic
    batcher on."""

    name: str
    model: str
    batch_size: int
    batched: bool
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    streaming: bool = False
    values: tuple[tuple[str, int], ...] = ()
    model_max_batch_size: int = 0
    dynamic_batching: bool = False

    @classmethod
    def from_config(cls, spec: CaseSpec, config: Mapping[str, Any]) -> ModelCase:
        """The case ``spec`` of a model with configuration ``config`` (Triton's JSON).

        Raises:
            ValueError: An input's ``-1`` dim without a shape, or a batch too large.
        """
        where = f"model {spec.model!r}"
        max_batch_size = int(config.get("max_batch_size", 0))
        batch = spec.batch or max(1, max_batch_size)
        if batch > max(1, max_batch_size):
            raise ValueError(f"{where}: --batch {batch} exceeds its max_batch_size")

        def tensor(entry: Mapping[str, Any], sent: bool) -> TensorSpec:
            name = entry["name"]
            dims = tuple(int(d) for d in entry.get("dims", ()))
            dtype = to_numpy_dtype(entry["data_type"], model=spec.model, tensor=name)
            shape = tuple(spec.shapes.get(name, dims))
            if sent and -1 in shape:
                example = ",".join("8" if d == -1 else str(d) for d in dims)
                raise ValueError(
                    f"{where}: input {name} has dims {list(dims)}: give its shape, e.g. "
                    f"--shape {name}={example}"
                )
            if len(shape) != len(dims) or any(d not in (-1, s) for d, s in zip(dims, shape)):
                raise ValueError(f"{where}: shape {shape} of {name} does not fit its dims {dims}")
            size = spec.max_element_bytes.get(name, DEFAULT_ELEMENT_BYTES if sent else 0)
            return TensorSpec(name, dims, dtype, shape, size if dtype.kind == "O" else 0)

        inputs = tuple(tensor(entry, True) for entry in config.get("input", ()))
        unknown = sorted(set(spec.values) - {t.name for t in inputs})
        if unknown:
            raise ValueError(f"{where} has no input {', '.join(unknown)}")
        policy = config.get("model_transaction_policy") or {}
        return cls(
            name=spec.name,
            model=spec.model,
            batch_size=batch,
            batched=max_batch_size > 0,
            inputs=inputs,
            outputs=tuple(tensor(entry, False) for entry in config.get("output", ())),
            streaming=bool(policy.get("decoupled", False)),
            values=tuple(sorted(spec.values.items())),
            model_max_batch_size=max_batch_size,
            dynamic_batching="dynamic_batching" in config,
        )

    def with_reference(self, reference: Mapping[str, np.ndarray]) -> ModelCase:
        """This case with its outputs' shapes (and longest BYTES elements) from the server's
        answer ``reference`` to :meth:`make_inputs`."""
        outputs = []
        for t in self.outputs:
            array = reference[t.name]
            longest = max((len(e) for e in array.flat), default=0) if t.is_bytes else 0
            shape = array.shape[1:] if self.batched else array.shape
            size = max(t.max_element_bytes, longest)
            outputs.append(dataclasses.replace(t, max_shape=shape, max_element_bytes=size))
        return dataclasses.replace(self, outputs=tuple(outputs))

    def request_shape(self, tensor: TensorSpec) -> tuple[int, ...]:
        """The shape of ``tensor`` in one request."""
        return (self.batch_size, *tensor.max_shape) if self.batched else tensor.max_shape

    @property
    def max_batch_size(self) -> int:
        """The ``max_batch_size`` to register the model with: samples per slot (0: none)."""
        return self.batch_size if self.batched else 0

    def registration(self, slots: int, *, whole_batches: bool = False) -> dict[str, Any]:
        """``register_shm_model``'s (and ``ShmModel``'s) sizing arguments for this case: a
        fixed pool of ``slots`` slots, or none given for :data:`~._config.ELASTIC` (the pool
        follows its load); each slot as large as a request of the case, or with
        ``whole_batches``, as the model's ``max_batch_size`` (node batching merges several
        callers' rows into one slot)."""
        tensors = (*self.inputs, *self.outputs)
        rows = self.model_max_batch_size if whole_batches else self.max_batch_size
        return {
            **({} if slots == ELASTIC else {"pool_size": slots}),
            "max_batch_size": rows,
            "max_shapes": {t.name: t.max_shape for t in tensors if t.is_variable} or None,
            "max_element_bytes": {t.name: t.max_element_bytes for t in tensors if t.is_bytes}
            or None,
        }

    @property
    def has_bytes(self) -> bool:
        """Whether any tensor is a BYTES tensor."""
        return any(t.is_bytes for t in (*self.inputs, *self.outputs))

    @property
    def input_nbytes(self) -> int:
        """Bytes of input per request (of text, for BYTES tensors)."""
        total = 0
        for t in self.inputs:
            itemsize = t.max_element_bytes if t.is_bytes else t.dtype.itemsize
            total += math.prod(t.max_shape) * itemsize
        return total * self.batch_size

    def make_inputs(self, *, seed: int = 0) -> dict[str, np.ndarray]:
        """One request's inputs: random, of each input's dtype (deterministic for a seed),
        but for those of :attr:`values`."""
        rng = np.random.default_rng(seed)
        arrays: dict[str, np.ndarray] = {}
        values = dict(self.values)
        for t in self.inputs:
            shape = self.request_shape(t)
            if t.name in values:
                arrays[t.name] = np.full(shape, values[t.name], t.dtype)
            elif t.is_bytes:
                letters = rng.integers(97, 123, (math.prod(shape), t.max_element_bytes), np.uint8)
                arrays[t.name] = np.array([row.tobytes() for row in letters], object).reshape(shape)
            elif t.dtype.kind == "f":
                arrays[t.name] = rng.standard_normal(shape, np.float32).astype(t.dtype)
            elif t.dtype.kind == "b":
                arrays[t.name] = rng.integers(0, 2, shape).astype(bool)
            else:
                arrays[t.name] = rng.integers(0, 100, shape).astype(t.dtype)
        return arrays


def captioner_responses(inputs: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The responses the example ``captioner`` model must send for ``inputs`` (its rule, in
    ``local/models/captioner``): ``COUNT`` of them, response ``k`` ``TOKEN = [k]`` and
    ``FEATURE`` the image's 4 values from ``4k`` on (flattened, wrapping)."""
    flat = np.asarray(inputs["IMAGE"]).reshape(-1)
    count = int(np.asarray(inputs["COUNT"]).reshape(-1)[0])
    responses = []
    for k in range(max(count, 0)):
        start = (4 * k) % (flat.size - 3)
        feature = flat[start : start + 4].astype(np.float32)
        responses.append({"TOKEN": np.array([k], np.int32), "FEATURE": feature})
    return responses


#: The rules of the streaming models the bench knows, by model: a request's inputs -> the
#: responses it must get.
STREAM_RULES: dict[str, Callable[[Mapping[str, np.ndarray]], list[dict[str, np.ndarray]]]] = {
    "captioner": captioner_responses
}
