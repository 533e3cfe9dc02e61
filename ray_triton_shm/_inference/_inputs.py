"""Checks a caller's inputs against a :class:`ModelSpec` before anything touches shared memory.

Inputs are ``{name: array}`` where an array is either one ``np.ndarray`` holding the whole batch
or a list of per-sample arrays (as in the seed). Every check happens here, up front, so a bad
input never leaves half a batch written into a slot. BYTES inputs are serialized here too (see
:mod:`._bytes`), which is where an element too long for its slot is found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._exceptions import InvalidInputError
from .._slots._cuda import Device
from .._slots._memory import SlotIO
from .._slots._specs import ModelSpec, TensorSpec
from ._bytes import EncodedBytes, encode
from ._gpu_tensors import DeviceInput, as_device_input, is_device_tensor

__all__ = ["Batch", "prepare_batch"]

#: One input as given by the caller: a batched array, or one array per sample; for a pool in
#: GPU memory, also a GPU tensor (torch, cupy, JAX... see :mod:`._gpu_tensors`).
InputValue = np.ndarray | Sequence[np.ndarray] | Any


class Batch:
    """Validated inputs of one ``infer_shm`` call.

    Attributes:
        spec: The model.
        size: Number of samples (``1`` for a model that does not batch).
        batched: Whether the model batches (arrays carry a leading batch dim).
        sample_shapes: Actual per-sample shape of each input (the whole shape when unbatched).
        values: Each input as given: an array, a tuple of per-sample arrays, or a GPU
            tensor described as a :class:`DeviceInput`.
        encoded: Each BYTES input, serialized.
    """

    __slots__ = ("batched", "encoded", "sample_shapes", "size", "spec", "values")

    def __init__(
        self,
        spec: ModelSpec,
        size: int,
        sample_shapes: Mapping[str, tuple[int, ...]],
        values: Mapping[str, np.ndarray | tuple[np.ndarray, ...] | DeviceInput],
        encoded: Mapping[str, EncodedBytes] | None = None,
    ) -> None:
        self.spec = spec
        self.size = size
        self.batched = spec.batched
        self.sample_shapes = sample_shapes
        self.values = values
        self.encoded = encoded or {}

    def chunks(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each chunk of at most ``batch_capacity`` samples."""
        size = self.spec.batch_capacity
        return [(start, min(start + size, self.size)) for start in range(0, self.size, size)]

    def write_chunk(self, slot: SlotIO, start: int, stop: int) -> list[int]:
        """Copies samples ``start:stop`` of every input into a slot, which holds them once
        this returns.

        Returns:
            The bytes written for each input, in the model's order.
        """
        written, staged = [], []
        for tensor in self.spec.inputs:
            staged.append(not isinstance(self.values.get(tensor.name), DeviceInput))
            encoded = self.encoded.get(tensor.name)
            if encoded is not None:
                data = encoded.chunk(start, stop)
                slot.inputs[tensor.name][: len(data)] = np.frombuffer(data, np.uint8)
                written.append(len(data))
                continue
            value = self.values[tensor.name]
            if isinstance(value, DeviceInput):
                row = value.row_bytes() if self.batched else 0
                nbytes = (stop - start) * row if self.batched else value.nbytes
                slot.write_device(tensor.name, value, start * row, nbytes)
                written.append(nbytes)
                continue
            sample_shape = self.sample_shapes[tensor.name]
            shape = (stop - start, *sample_shape) if self.batched else sample_shape
            destination = slot.inputs[tensor.name][: math.prod(shape)].reshape(shape)
            if not self.batched:
                np.copyto(destination, value)
            elif isinstance(value, np.ndarray):
                np.copyto(destination, value[start:stop])
            else:
                for row_view, sample in zip(destination, value[start:stop]):
                    np.copyto(row_view, sample)
            written.append(destination.nbytes)
        slot.commit(written, staged)
        return written

    def chunk_values(self, start: int, stop: int) -> list[memoryview | bytes]:
        """The bytes of samples ``start:stop`` of every input, in the model's order, for a
        request by value: a view of the caller's array where it is contiguous (no copy),
        else a contiguous copy.

        Raises:
            TypeError: a GPU tensor (a pool by value takes NumPy arrays, as one in system
                memory does; refused when the inputs are checked).
        """
        values: list[memoryview | bytes] = []
        for tensor in self.spec.inputs:
            encoded = self.encoded.get(tensor.name)
            if encoded is not None:
                values.append(encoded.chunk(start, stop))
                continue
            value = self.values[tensor.name]
            if isinstance(value, DeviceInput):
                raise TypeError(f"input {tensor.name!r}: a GPU tensor for a request by value")
            if isinstance(value, np.ndarray):
                whole = not self.batched or (start == 0 and stop == len(value))
                values.append(_raw(value if whole else value[start:stop]))
            else:
                values.append(_raw(np.stack(value[start:stop])))
        return values


def _raw(array: np.ndarray) -> memoryview | bytes:
    """An array's bytes, in C order: a view where it is contiguous."""
    if array.size == 0:
        return b""
    flat: Any = np.ascontiguousarray(array).reshape(-1)
    return memoryview(flat).cast("B")


def prepare_batch(
    spec: ModelSpec, inputs: Mapping[str, InputValue], device: Device | None = None
) -> Batch:
    """Validates ``inputs`` for ``spec`` and returns them as a :class:`Batch`.

    Args:
        spec: The model.
        inputs: The caller's inputs.
        device: The GPU of the pool's slots, which then also takes GPU tensors on it
            (``None``: a pool in system memory, NumPy arrays only).

    Raises:
        InvalidInputError: naming the model, the tensor, what was expected and what came.
    """
    batch = _common_case(spec, inputs)
    if batch is not None:
        return batch
    model = spec.name
    _check_names(spec, inputs)
    sizes: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    values: dict[str, np.ndarray | tuple[np.ndarray, ...] | DeviceInput] = {}
    for tensor in spec.inputs:
        sizes[tensor.name], shapes[tensor.name], values[tensor.name] = _one_input(
            model, tensor, inputs[tensor.name], device, batched=spec.batched
        )
    size = _batch_size(model, sizes)
    encoded = {
        t.name: _encode(model, t, values[t.name], size if spec.batched else 1)  # type: ignore[arg-type]
        for t in spec.inputs
        if t.is_bytes
    }
    return Batch(spec, size, shapes, values, encoded)


def _check_names(spec: ModelSpec, inputs: Any) -> None:
    """Checks that ``inputs`` maps each input of ``spec``, and nothing else, to a value."""
    model = spec.name
    if not isinstance(inputs, Mapping):
        raise InvalidInputError(
            f"model {model!r}: inputs must be a mapping of tensor name to array, "
            f"got {type(inputs).__name__}",
            model=model,
            expected="dict[str, np.ndarray]",
            actual=type(inputs).__name__,
        )
    expected_names = [t.name for t in spec.inputs]
    missing = [n for n in expected_names if n not in inputs]
    if missing:
        raise InvalidInputError(
            f"model {model!r}: missing input {missing[0]!r} (expected inputs {expected_names}, "
            f"got {list(inputs)})",
            model=model,
            tensor=missing[0],
            expected=expected_names,
            actual=list(inputs),
        )
    unexpected = [n for n in inputs if n not in expected_names]
    if unexpected:
        raise InvalidInputError(
            f"model {model!r}: unexpected input {unexpected[0]!r} (expected inputs "
            f"{expected_names})",
            model=model,
            tensor=unexpected[0],
            expected=expected_names,
            actual=list(inputs),
        )


def _one_input(
    model: str, tensor: TensorSpec, value: Any, device: Device | None, *, batched: bool
) -> tuple[int, tuple[int, ...], np.ndarray | tuple[np.ndarray, ...] | DeviceInput]:
    """One input checked: its samples, its sample shape, and the value kept for the slots."""
    if is_device_tensor(value):
        described = _device_input(model, tensor, value, device, batched=batched)
        if batched:
            return described.shape[0], described.shape[1:], described
        return 1, described.shape, described
    if batched:
        return _batched_input(model, tensor, value)
    shape, normalized = _unbatched_input(model, tensor, value)
    return 1, shape, normalized


def _batch_size(model: str, sizes: Mapping[str, int]) -> int:
    """The samples of the batch, which every input must have."""
    if len(set(sizes.values())) > 1:
        first, *_ = sizes
        other = next(n for n in sizes if sizes[n] != sizes[first])
        raise InvalidInputError(
            f"model {model!r}: inputs have different batch lengths: {first!r} has "
            f"{sizes[first]} samples, {other!r} has {sizes[other]}",
            model=model,
            tensor=other,
            expected=sizes[first],
            actual=sizes[other],
        )
    return next(iter(sizes.values()))


def _device_input(
    model: str, tensor: TensorSpec, value: Any, device: Device | None, *, batched: bool
) -> DeviceInput:
    """Checks a GPU tensor given as input ``tensor`` (dtype, shape, GPU) and describes it."""
    if device is None:
        raise InvalidInputError(
            f"model {model!r}: input {tensor.name!r} is a "
            f"{type(value).__module__.split('.')[0]}.{type(value).__name__}, not a NumPy array: "
            "this model's pool is in system memory and takes NumPy arrays (np.asarray, or "
            "torch's .numpy()); GPU tensors go to a pool registered with memory='cuda'",
            model=model,
            tensor=tensor.name,
            expected="np.ndarray",
            actual=type(value).__name__,
        )
    described = as_device_input(value, model=model, tensor=tensor.name)
    _check_dtype(model, tensor, described, convert=f"its framework's cast ({described.kind})")
    if batched and len(described.shape) != len(tensor.shape) + 1:
        raise _shape_error(model, tensor, described.shape, batched=True)
    sample_shape = described.shape[1:] if batched else described.shape
    _check_sample_shape(model, tensor, sample_shape, described.shape, batched=batched)
    if described.nbytes and described.device != device.index:
        raise InvalidInputError(
            f"model {model!r}: input {tensor.name!r} is on cuda:{described.device}, but the "
            f"model's slots are on cuda:{device.index} ({device.uuid}); move it there first "
            f"(.to('cuda:{device.index}'))",
            model=model,
            tensor=tensor.name,
            expected=f"cuda:{device.index}",
            actual=f"cuda:{described.device}",
        )
    return described


def _encode(
    model: str, tensor: TensorSpec, value: np.ndarray | tuple[np.ndarray, ...], samples: int
) -> EncodedBytes:
    array = value if isinstance(value, np.ndarray) else np.array(value, dtype=np.object_)
    return encode(
        array, samples, model=model, tensor=tensor.name, max_element_bytes=tensor.max_element_bytes
    )


def _common_case(spec: ModelSpec, inputs: Any) -> Batch | None:
    """The checks of a dict of batched arrays that are all fine, on the hot path; ``None``
    sends anything else through the full checks, which name what is wrong."""
    if (
        type(inputs) is not dict
        or not spec.batched
        or spec.has_bytes
        or len(inputs) != len(spec.inputs)
    ):
        return None
    size = -1
    shapes = {}
    for tensor in spec.inputs:
        value = inputs.get(tensor.name)
        if type(value) is not np.ndarray or value.dtype != tensor.dtype:
            return None
        shape = value.shape
        sample_shape = shape[1:]
        if sample_shape != tensor.shape and not (tensor.is_variable and tensor.fits(sample_shape)):
            return None
        if size != shape[0]:
            if size != -1:
                return None
            size = shape[0]
        shapes[tensor.name] = sample_shape
    return Batch(spec, size, shapes, inputs)


def _batched_input(
    model: str, tensor: TensorSpec, value: Any
) -> tuple[int, tuple[int, ...], np.ndarray | tuple[np.ndarray, ...]]:
    if isinstance(value, np.ndarray):
        _check_dtype(model, tensor, value)
        if value.ndim != len(tensor.shape) + 1:
            raise _shape_error(model, tensor, value.shape, batched=True)
        _check_sample_shape(model, tensor, value.shape[1:], value.shape, batched=True)
        return value.shape[0], value.shape[1:], value
    if isinstance(value, (list, tuple)):
        samples = tuple(value)
        sample_shape: tuple[int, ...] | None = None
        for index, sample in enumerate(samples):
            if not isinstance(sample, np.ndarray):
                raise _not_an_array(model, tensor, sample, f" (sample {index} of the list)")
            _check_dtype(model, tensor, sample)
            _check_sample_shape(model, tensor, sample.shape, sample.shape, batched=False)
            if sample_shape is None:
                sample_shape = sample.shape
            elif sample.shape != sample_shape:
                raise InvalidInputError(
                    f"model {model!r}: input {tensor.name!r} sample {index} has shape "
                    f"{sample.shape}, but sample 0 has {sample_shape}; samples of one batch "
                    "must share a shape",
                    model=model,
                    tensor=tensor.name,
                    expected=sample_shape,
                    actual=sample.shape,
                )
        return len(samples), sample_shape or tensor.max_shape, samples
    raise _not_an_array(model, tensor, value, "")


def _unbatched_input(
    model: str, tensor: TensorSpec, value: Any
) -> tuple[tuple[int, ...], np.ndarray]:
    if not isinstance(value, np.ndarray):
        raise _not_an_array(model, tensor, value, " (this model does not batch: one array)")
    _check_dtype(model, tensor, value)
    _check_sample_shape(model, tensor, value.shape, value.shape, batched=False)
    return value.shape, value


def _check_dtype(
    model: str, tensor: TensorSpec, array: np.ndarray | DeviceInput, *, convert: str = ""
) -> None:
    if array.dtype == tensor.dtype or (tensor.is_bytes and array.dtype.kind in "SU"):
        return  # BYTES elements are checked as they are serialized
    if tensor.is_bytes:
        raise InvalidInputError(
            f"model {model!r}: input {tensor.name!r} is a BYTES tensor: give an array of bytes "
            f"or str (dtype object, S or U), got dtype {array.dtype}",
            model=model,
            tensor=tensor.name,
            expected="bytes or str",
            actual=str(array.dtype),
        )
    raise InvalidInputError(
        f"model {model!r}: input {tensor.name!r} must have dtype {tensor.dtype} "
        f"({tensor.datatype}), got {array.dtype}; convert it with "
        f"{convert or f'.astype(np.{tensor.dtype})'}",
        model=model,
        tensor=tensor.name,
        expected=str(tensor.dtype),
        actual=str(array.dtype),
    )


def _check_sample_shape(
    model: str,
    tensor: TensorSpec,
    sample_shape: tuple[int, ...],
    full_shape: tuple[int, ...],
    *,
    batched: bool,
) -> None:
    if not tensor.fits(sample_shape):
        raise _shape_error(model, tensor, full_shape, batched=batched)


def _shape_error(
    model: str, tensor: TensorSpec, actual: tuple[int, ...], *, batched: bool
) -> InvalidInputError:
    dims = [str(d) if d != -1 else f"<={m}" for d, m in zip(tensor.shape, tensor.max_shape)]
    if batched:
        dims.insert(0, "batch")
    expected = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
    return InvalidInputError(
        f"model {model!r}: input {tensor.name!r} must have shape {expected}, got {actual}",
        model=model,
        tensor=tensor.name,
        expected=expected,
        actual=actual,
    )


def _not_an_array(model: str, tensor: TensorSpec, value: Any, where: str) -> InvalidInputError:
    return InvalidInputError(
        f"model {model!r}: input {tensor.name!r} must be a numpy array or a list of per-sample "
        f"arrays, got {type(value).__name__}{where}",
        model=model,
        tensor=tensor.name,
        expected="np.ndarray",
        actual=type(value).__name__,
    )
