"""What a model's tensors look like, and how one batch of them is laid out in a slot.

A :class:`ModelSpec` is built once per ``register_shm_model`` call, from the caller's specs, the
model's configuration on the server, or both. :class:`SlotLayout` turns it into byte offsets:
every input and output of one batch of ``max_batch_size`` samples at an aligned offset.

A BYTES (string) tensor has the dtype ``object`` and a per-element maximum, so that its slots
can be sized: each element takes at most ``4 + max_element_bytes`` bytes serialized.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from .._exceptions import ModelSpecError, TritonSHMError

__all__ = ["ModelSpec", "SlotLayout", "TensorSpec", "resolve_model_spec"]

#: Tensor offsets inside a slot are multiples of this (cache line, and enough for any dtype).
TENSOR_ALIGNMENT = 64
#: Slots start on page boundaries so two slots never share a page.
SLOT_ALIGNMENT = 4096
#: A region starts with a header before its slots (see :mod:`ray_triton_shm._slots._header`).
REGION_HEADER_BYTES = 160 * SLOT_ALIGNMENT
#: BYTES outputs with at most this much room in a slot come back in Triton's response instead:
#: Triton's Python backend answers small BYTES outputs faster inline than through shared memory
#: (0.63 against 0.68 ms for 8 x 64 bytes here; from 8 x 1 KB on, shared memory is faster).
INLINE_BYTES_OUTPUT_MAX = 4096

DTypeLike = np.dtype | type | str
#: ``(name, shape_without_batch, dtype)`` as in the seed's ``register_shm_model``.
SpecLike = Union["TensorSpec", tuple[str, Sequence[int], DTypeLike]]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor of a model, without the batch dimension.

    Attributes:
        name: Tensor name, as in the model configuration.
        shape: Per-sample dims as the model declares them; ``-1`` marks a variable dim.
        dtype: NumPy dtype of the tensor (native byte order); ``object`` for BYTES.
        max_shape: Per-sample maximum used to size slots; equals ``shape`` when nothing varies.
        max_element_bytes: For a BYTES tensor, the longest element its slots hold.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    max_shape: tuple[int, ...] = field(default=())
    max_element_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.max_shape:
            object.__setattr__(self, "max_shape", self.shape)

    @functools.cached_property
    def datatype(self) -> str:
        """The Triton datatype name (``"FP32"``, ``"INT32"``, ...)."""
        return str(np_to_triton_dtype(self.dtype))

    @functools.cached_property
    def is_variable(self) -> bool:
        """Whether any dim is ``-1`` in the model's declaration."""
        return -1 in self.shape

    def fits(self, sample_shape: Sequence[int]) -> bool:
        """Whether one sample of ``sample_shape`` fits: same rank, fixed dims equal, each
        variable dim at most its maximum."""
        if len(sample_shape) != len(self.shape):
            return False
        for s, d, m in zip(sample_shape, self.shape, self.max_shape):  # no generator: hot path
            if s != d and (d != -1 or s > m):
                return False
        return True

    @property
    def is_bytes(self) -> bool:
        """Whether this is a BYTES (string) tensor."""
        return self.dtype.kind == "O"

    @property
    def max_sample_bytes(self) -> int:
        """Bytes of one sample at its maximum shape (serialized, for BYTES)."""
        if self.is_bytes:
            return math.prod(self.max_shape) * (4 + self.max_element_bytes)
        return math.prod(self.max_shape) * self.dtype.itemsize


@dataclass(frozen=True)
class ModelSpec:
    """Everything the client needs to know about a registered model.

    Attributes:
        name: Model name on the server.
        version: Model version (``""`` lets the server choose).
        inputs: Input tensors, in request order.
        outputs: Output tensors, in request order.
        max_batch_size: The model's ``max_batch_size``; ``0`` means the model does not batch and
            its tensors have no batch dimension.
        decoupled: Whether the model streams (Triton's ``model_transaction_policy { decoupled:
            true }``): it answers a request with any number of responses, only over Triton's
            gRPC stream. Its outputs come back by value, in the responses (Triton writes
            every response of a request into the same place of shared memory, with no flow
            control), so its slots hold the inputs alone, and its outputs need no maximum.
        dynamic_batching: Whether Triton merges the model's requests itself (its config has
            ``dynamic_batching``): a sign that its rows are independent of each other, which
            node batching (see :mod:`.._inference._batching`) relies on.
    """

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    decoupled: bool = False
    dynamic_batching: bool = False

    @property
    def batched(self) -> bool:
        """Whether tensors carry a leading batch dimension."""
        return self.max_batch_size > 0

    @property
    def batch_capacity(self) -> int:
        """Samples per slot (one request): ``max_batch_size``, or 1 for a non-batching model."""
        return max(1, self.max_batch_size)

    def input(self, name: str) -> TensorSpec:
        """Returns the input spec called ``name``."""
        return next(t for t in self.inputs if t.name == name)

    @functools.cached_property
    def has_bytes(self) -> bool:
        """Whether any tensor is a BYTES tensor."""
        return any(t.is_bytes for t in (*self.inputs, *self.outputs))

    @functools.cached_property
    def outputs_by_name(self) -> dict[str, TensorSpec]:
        """The output specs by name."""
        return {t.name: t for t in self.outputs}

    @functools.cached_property
    def bytes_outputs(self) -> frozenset[str]:
        """The names of the BYTES outputs."""
        return frozenset(t.name for t in self.outputs if t.is_bytes)

    @functools.cached_property
    def inline_outputs(self) -> frozenset[str]:
        """BYTES outputs small enough to come back in the response (see
        :data:`INLINE_BYTES_OUTPUT_MAX`), or every output of a :attr:`decoupled` model; every
        other output is written into the slot."""
        if self.decoupled:
            return frozenset(t.name for t in self.outputs)
        return frozenset(
            t.name
            for t in self.outputs
            if t.is_bytes and self.batch_capacity * t.max_sample_bytes <= INLINE_BYTES_OUTPUT_MAX
        )


@dataclass(frozen=True)
class SlotLayout:
    """Byte layout of one slot: where each tensor of one full batch lives.

    A region holds a header (:class:`~ray_triton_shm._slots._header.RegionHeader`), then its slots
    one after the other (in system memory; see :mod:`._memory` for slots on a GPU).

    Attributes:
        input_offsets: Offset of each input inside a slot.
        output_offsets: Offset of each output inside a slot.
        capacities: Bytes reserved for each tensor (keyed ``"in:NAME"`` / ``"out:NAME"``).
        slot_bytes: Size of one slot, a multiple of :data:`SLOT_ALIGNMENT`.
    """

    input_offsets: Mapping[str, int]
    output_offsets: Mapping[str, int]
    capacities: Mapping[str, int]
    slot_bytes: int

    @classmethod
    def for_model(cls, spec: ModelSpec) -> SlotLayout:
        """Lays out every input then every output of one batch of ``spec.batch_capacity`` (the
        inputs alone for a decoupled model: its outputs come back in the responses)."""
        offset = 0
        input_offsets: dict[str, int] = {}
        output_offsets: dict[str, int] = {}
        capacities: dict[str, int] = {}
        for kind, tensors, offsets in (
            ("in", spec.inputs, input_offsets),
            ("out", () if spec.decoupled else spec.outputs, output_offsets),
        ):
            for tensor in tensors:
                capacity = spec.batch_capacity * tensor.max_sample_bytes
                offsets[tensor.name] = offset
                capacities[f"{kind}:{tensor.name}"] = capacity
                offset += _align(max(capacity, 1), TENSOR_ALIGNMENT)
        return cls(input_offsets, output_offsets, capacities, _align(offset, SLOT_ALIGNMENT))

    def slot_offset(self, slot: int) -> int:
        """Where slot ``slot`` starts in its region."""
        return REGION_HEADER_BYTES + slot * self.slot_bytes

    def region_bytes(self, slots: int) -> int:
        """Size of a region of ``slots`` slots, header included."""
        return self.slot_offset(slots)


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def to_numpy_dtype(dtype: DTypeLike, *, model: str, tensor: str) -> np.dtype:
    """Converts a NumPy dtype or a Triton datatype name (``FP32``/``TYPE_FP32``) to a dtype.

    BYTES tensors (``BYTES``, ``TYPE_STRING``, ``np.object_``, ``np.bytes_``, ``np.str_``) get
    the dtype ``object``.

    Raises:
        ModelSpecError: for anything that is not a known datatype.
    """
    if isinstance(dtype, str) and dtype.upper().removeprefix("TYPE_") in _TRITON_NAMES:
        name = dtype.upper().removeprefix("TYPE_")
        if name in ("BYTES", "STRING"):
            return np.dtype(np.object_)
        converted = triton_to_np_dtype(name)
        if converted is None:
            raise ModelSpecError(
                f"tensor {tensor!r} of model {model!r}: Triton datatype {name} is not supported",
                model=model,
                tensor=tensor,
            )
        return np.dtype(converted)
    try:
        result = np.dtype(dtype)
    except TypeError as exc:
        raise ModelSpecError(
            f"tensor {tensor!r} of model {model!r}: {dtype!r} is not a dtype",
            model=model,
            tensor=tensor,
        ) from exc
    if result.kind in "OSU":
        return np.dtype(np.object_)
    if np_to_triton_dtype(result) is None:
        raise ModelSpecError(
            f"tensor {tensor!r} of model {model!r}: dtype {result} has no Triton datatype",
            model=model,
            tensor=tensor,
        )
    return result.newbyteorder("=")


_TRITON_NAMES = {
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES", "STRING", "BF16",
}  # fmt: skip


def resolve_model_spec(
    model_name: str,
    *,
    inputs: Sequence[SpecLike] | None,
    outputs: Sequence[SpecLike] | None,
    max_batch_size: int | None,
    model_version: str,
    max_shapes: Mapping[str, Sequence[int]] | None,
    load_config: Callable[[], Mapping[str, Any]],
    max_element_bytes: Mapping[str, int] | None = None,
) -> ModelSpec:
    """Builds a :class:`ModelSpec` from the caller's specs, completed by the model config.

    ``load_config`` is only called when something was left out.

    Raises:
        ModelSpecError: for a ``-1`` dim without a maximum, a BYTES tensor without a
            ``max_element_bytes`` entry, duplicate names, bad shapes.
    """
    config: Mapping[str, Any] = {}
    if inputs is None or outputs is None or max_batch_size is None:
        config = load_config()
    decoupled, dynamic_batching = _config_flags(config, load_config)
    if max_batch_size is None:
        max_batch_size = _config_int(model_name, config.get("max_batch_size", 0))
    if max_batch_size < 0:
        raise ModelSpecError(
            f"model {model_name!r}: max_batch_size must be >= 0, got {max_batch_size}",
            model=model_name,
        )
    max_shapes = dict(max_shapes or {})
    maxima = dict(max_element_bytes or {})
    input_specs = _resolve_tensors(model_name, inputs, config.get("input", []), max_shapes, maxima)
    output_specs = _resolve_tensors(
        model_name, outputs, config.get("output", []), max_shapes, maxima, bounded=not decoupled
    )
    names = [t.name for t in input_specs]
    if not input_specs or not output_specs:
        raise ModelSpecError(
            f"model {model_name!r} needs at least one input and one output "
            f"(got {len(input_specs)} inputs, {len(output_specs)} outputs)",
            model=model_name,
        )
    for group in (names, [t.name for t in output_specs]):
        duplicates = sorted({n for n in group if group.count(n) > 1})
        if duplicates:
            raise ModelSpecError(
                f"model {model_name!r}: tensor names given more than once: {duplicates}",
                model=model_name,
            )
    unknown = set(max_shapes) - set(names) - {t.name for t in output_specs}
    if unknown:
        raise ModelSpecError(
            f"model {model_name!r}: max_shapes names unknown tensors {sorted(unknown)}",
            model=model_name,
        )
    strings = {t.name for t in (*input_specs, *output_specs) if t.is_bytes}
    if set(maxima) - strings:
        raise ModelSpecError(
            f"model {model_name!r}: max_element_bytes names {sorted(set(maxima) - strings)}, "
            f"which are not BYTES tensors (the BYTES tensors are {sorted(strings)})",
            model=model_name,
        )
    return ModelSpec(
        name=model_name,
        version=model_version,
        inputs=tuple(input_specs),
        outputs=tuple(output_specs),
        max_batch_size=max_batch_size,
        decoupled=decoupled,
        dynamic_batching=dynamic_batching,
    )


def _config_int(model: str, value: Any) -> int:
    """``max_batch_size`` as Triton's JSON has it (an int, or a string of one over gRPC).

    Raises:
        ModelSpecError: it is not an integer.
    """
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ModelSpecError(
            f"model {model!r}: its config's max_batch_size is not an integer: {value!r}",
            model=model,
        ) from None


def _config_flags(
    config: Mapping[str, Any], load_config: Callable[[], Mapping[str, Any]]
) -> tuple[bool, bool]:
    """Whether the model streams (``model_transaction_policy { decoupled: true }``) and whether
    Triton batches it (``dynamic_batching``), from ``config``, or read for it where every spec
    was given (and the config is not readable: neither)."""
    if not config:
        try:
            config = load_config()
        except TritonSHMError:
            return False, False
    policy = config.get("model_transaction_policy", {})
    decoupled = isinstance(policy, Mapping) and bool(policy.get("decoupled", False))
    return decoupled, config.get("dynamic_batching") is not None


def _resolve_tensors(
    model: str,
    given: Sequence[SpecLike] | None,
    config_tensors: Sequence[Mapping[str, Any]],
    max_shapes: Mapping[str, Sequence[int]],
    max_element_bytes: Mapping[str, int],
    *,
    bounded: bool = True,
) -> list[TensorSpec]:
    if given is not None:
        raw = [_split_spec(model, item) for item in given]
    else:
        raw = [_config_tensor(model, t) for t in config_tensors]
        inferred = {
            name: fixed
            for (name, _, _), t in zip(raw, config_tensors)
            if name not in max_shapes and (fixed := reshaped_dims(t)) is not None
        }
        max_shapes = {**inferred, **max_shapes}
    return [
        _tensor_spec(model, name, shape, dtype, max_shapes, max_element_bytes, bounded=bounded)
        for name, shape, dtype in raw
    ]


def _config_tensor(model: str, tensor: Any) -> tuple[str, Sequence[int], DTypeLike]:
    """A tensor of Triton's JSON config as ``(name, dims, data_type)``.

    Raises:
        ModelSpecError: a tensor without a name, dims that are not ints, or no data type.
    """
    try:
        name, dtype = tensor["name"], tensor["data_type"]
        dims = [int(d) for d in tensor.get("dims", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelSpecError(
            f"model {model!r}: a tensor of its config cannot be read ({exc!r}): {tensor!r}",
            model=model,
        ) from None
    if not isinstance(name, str) or not name:
        raise ModelSpecError(f"model {model!r}: a tensor of its config has no name", model=model)
    return name, dims, dtype


def reshaped_dims(tensor: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The dims a config tensor's one ``-1`` must take, when its ``reshape`` (the model's own
    shape per sample) holds a fixed number of values: skl2onnx's ``label``, written
    ``dims: [ -1 ] reshape: { shape: [ ] }``, holds one value per sample, so ``(1,)``.
    ``None`` when nothing is to infer (no ``-1``, several, no reshape, or one that varies)."""
    try:
        dims = [int(d) for d in tensor.get("dims", [])]
        reshape = tensor.get("reshape")
        if dims.count(-1) != 1 or not isinstance(reshape, Mapping):
            return None
        model_dims = [int(d) for d in reshape.get("shape", [])]
    except (TypeError, ValueError, AttributeError):
        return None
    fixed = math.prod(d for d in dims if d != -1)
    count = math.prod(model_dims)
    if any(d < 0 for d in model_dims) or fixed <= 0 or count % fixed:
        return None
    return tuple(count // fixed if d == -1 else d for d in dims)


def _split_spec(model: str, item: SpecLike) -> tuple[str, Sequence[int], DTypeLike]:
    if isinstance(item, TensorSpec):
        return item.name, item.shape, item.dtype
    if not isinstance(item, (tuple, list)) or len(item) != 3:
        raise ModelSpecError(
            f"model {model!r}: a tensor spec is (name, shape_without_batch, dtype), got {item!r}",
            model=model,
        )
    return item[0], item[1], item[2]


def _tensor_spec(
    model: str,
    name: str,
    shape: Sequence[int],
    dtype: DTypeLike,
    max_shapes: Mapping[str, Sequence[int]],
    max_element_bytes: Mapping[str, int],
    *,
    bounded: bool = True,
) -> TensorSpec:
    """A tensor's spec; ``bounded=False`` for one that needs no room in a slot (a decoupled
    model's output), whose variable dims and BYTES elements need no maximum."""
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as exc:
        raise ModelSpecError(
            f"tensor {name!r} of model {model!r}: shape must be a sequence of ints, got {shape!r}",
            model=model,
            tensor=name,
        ) from exc
    np_dtype = to_numpy_dtype(dtype, model=model, tensor=name)
    if any(d < -1 for d in dims):
        raise ModelSpecError(
            f"tensor {name!r} of model {model!r}: invalid dims {dims}", model=model, tensor=name
        )
    max_dims = dims
    if name in max_shapes:
        max_dims = tuple(int(d) for d in max_shapes[name])
        fits = len(max_dims) == len(dims) and all(
            m >= 0 and (d == -1 or d == m) for d, m in zip(dims, max_dims)
        )
        if not fits:
            raise ModelSpecError(
                f"tensor {name!r} of model {model!r}: max_shapes entry {max_dims} does not fit "
                f"the declared dims {dims} (same rank; fixed dims equal, -1 dims any maximum)",
                model=model,
                tensor=name,
            )
    elif -1 in dims and bounded:
        example = tuple(8 if d == -1 else d for d in dims)
        raise ModelSpecError(
            f"tensor {name!r} of model {model!r} has variable dims {dims}; slots need a maximum "
            f"size: pass max_shapes={{{name!r}: {example}}} (your maxima in place of the -1s)",
            model=model,
            tensor=name,
        )
    element_bytes = 0
    if np_dtype.kind == "O" and (bounded or name in max_element_bytes):
        element_bytes = _max_element_bytes(model, name, max_element_bytes)
    return TensorSpec(
        name=name,
        shape=dims,
        dtype=np_dtype,
        max_shape=max_dims,
        max_element_bytes=element_bytes,
    )


def _max_element_bytes(model: str, name: str, maxima: Mapping[str, int]) -> int:
    if name not in maxima:
        raise ModelSpecError(
            f"tensor {name!r} of model {model!r} is a BYTES (string) tensor; slots need the "
            f"longest element it may hold: pass max_element_bytes={{{name!r}: 256}} (your "
            "maximum in bytes, UTF-8 for str)",
            model=model,
            tensor=name,
        )
    value = maxima[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelSpecError(
            f"tensor {name!r} of model {model!r}: max_element_bytes must be an int >= 0, "
            f"got {value!r}",
            model=model,
            tensor=name,
        )
    return value
