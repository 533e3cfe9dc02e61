"""Tensors that live on a GPU: a caller's inputs read in place, and outputs made as the
caller's own GPU tensors.

An input is any object with ``__cuda_array_interface__`` (torch, cupy, JAX, Numba) or
``__dlpack__`` (any DLPack producer). It is described once, when the call's inputs are checked
(:func:`as_device_input`), and copied device to device into the slot later, ordered after the
stream its producer made it on. Outputs come back as ``torch`` or ``cupy`` tensors on the
pool's GPU (:class:`DeviceOutputs`), copied out of the slot so that the slot is free at once;
either converts to any other framework through DLPack. torch and cupy are imported only where
a caller passes their tensors or asks for them.
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._exceptions import InvalidInputError, TritonServerError
from .._slots import _cuda
from .._slots._specs import ModelSpec

__all__ = ["OUTPUT_KINDS", "DeviceInput", "DeviceOutputs", "as_device_input", "is_device_tensor"]

#: What ``outputs_as=`` takes: NumPy arrays (copied to the host), or GPU tensors.
OUTPUT_KINDS = ("numpy", "torch", "cupy")

_CUDA_MEMORY_TYPES = (2, 3)  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
_DLPACK_CUDA = 2  # kDLCUDA


@dataclass(frozen=True)
class DeviceInput:
    """A caller's input tensor on a GPU, described for copying.

    Attributes:
        pointer: Device address of its first element.
        shape: Its shape.
        dtype: Its dtype.
        device: The CUDA index (in this process) of the GPU it is on.
        stream: The stream its producer made it on (``None``: none to wait for).
        kind: What it is, for messages (``"torch.Tensor"``).
        keep: What keeps its memory alive until it is copied.
    """

    pointer: int
    shape: tuple[int, ...]
    dtype: np.dtype
    device: int
    stream: int | None
    kind: str
    keep: Any

    @property
    def nbytes(self) -> int:
        """Its size in bytes."""
        return math.prod(self.shape) * self.dtype.itemsize

    def row_bytes(self) -> int:
        """Bytes of one sample (a row of the leading dim)."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize


def is_device_tensor(value: Any) -> bool:
    """Whether ``value`` offers its memory as a tensor of another framework (torch, cupy,
    JAX...): a GPU tensor, or one :func:`as_device_input` refuses as not on a GPU."""
    if isinstance(value, np.ndarray):
        return False
    return hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__")


def as_device_input(value: Any, *, model: str, tensor: str) -> DeviceInput:
    """Describes a GPU tensor given as input ``tensor``.

    Raises:
        InvalidInputError: it is not in GPU memory, not C-contiguous, or cannot be read.
    """
    kind = f"{type(value).__module__.split('.')[0]}.{type(value).__name__}"

    def refuse(what: str, expected: str, actual: Any) -> InvalidInputError:
        return InvalidInputError(
            f"model {model!r}: input {tensor!r} ({kind}) {what}",
            model=model,
            tensor=tensor,
            expected=expected,
            actual=actual,
        )

    try:
        interface = getattr(value, "__cuda_array_interface__", None)
    except AttributeError:
        interface = None  # torch's CPU tensors: DLPack says where they are
    except Exception as exc:  # torch refuses tensors that require grad
        raise refuse(f"cannot be read in place: {exc}; pass .detach()", "a tensor", kind) from exc
    if interface is not None:
        pointer, _ = interface["data"]
        shape = tuple(int(d) for d in interface["shape"])
        dtype = np.dtype(interface["typestr"])
        strides = interface.get("strides")
        stream = interface.get("stream")
        keep: Any = value
    else:
        pointer, shape, dtype, strides, keep = _from_dlpack(value, refuse)
        stream = None  # asked for on the legacy default stream, which ours waits for
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        raise refuse(
            "is not C-contiguous; pass .contiguous() (torch) or ascontiguousarray (cupy)",
            "C-contiguous",
            f"strides {tuple(strides)}",
        )
    if stream is None and "torch" in sys.modules and kind == "torch.Tensor":
        stream = sys.modules["torch"].cuda.current_stream(value.device).cuda_stream
    device = _device_of(pointer, refuse) if math.prod(shape) else 0
    return DeviceInput(int(pointer), shape, dtype.newbyteorder("="), device, stream, kind, keep)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _from_dlpack(value: Any, refuse: Any) -> tuple[int, tuple[int, ...], np.dtype, Any, Any]:
    from tritonclient.utils import _dlpack  # tritonclient's reading of DLPack capsules

    device_type, _ = value.__dlpack_device__()
    if device_type != _DLPACK_CUDA:
        raise refuse("is not in GPU memory", "a CUDA tensor", f"DLPack device {device_type}")
    capsule = _dlpack.get_dlpack_capsule(value, 1)  # 1: the legacy default stream
    managed = _dlpack.get_managed_tensor(capsule)
    dl = managed.dl_tensor
    shape = tuple(int(dl.shape[i]) for i in range(dl.ndim))
    strides = None if not dl.strides else tuple(int(dl.strides[i]) for i in range(dl.ndim))
    dtype = _dlpack_dtype(dl.dtype, refuse)
    if strides is not None:
        strides = tuple(s * dtype.itemsize for s in strides)  # DLPack counts elements
    return int(dl.data or 0) + int(dl.byte_offset), shape, dtype, strides, (value, capsule)


def _dlpack_dtype(dl_dtype: Any, refuse: Any) -> np.dtype:
    kinds = {0: "i", 1: "u", 2: "f", 6: "b"}  # kDLInt, kDLUInt, kDLFloat, kDLBool
    kind = kinds.get(int(dl_dtype.type_code))
    if kind is None or int(dl_dtype.lanes) != 1:
        raise refuse("has a DLPack dtype Triton does not take", "a numeric dtype", "other")
    return np.dtype(f"{kind}{int(dl_dtype.bits) // 8}")


def _device_of(pointer: int, refuse: Any) -> int:
    cudart = _cuda.runtime()
    error, attributes = cudart.cudaPointerGetAttributes(pointer)
    if error != cudart.cudaError_t.cudaSuccess or int(attributes.type) not in _CUDA_MEMORY_TYPES:
        cudart.cudaGetLastError()
        raise refuse("is not in GPU memory", "a CUDA tensor", "host memory")
    return int(attributes.device)


# ------------------------------------------------------------------ outputs


class DeviceOutputs:
    """Assembles a call's outputs as GPU tensors of ``library`` (``"torch"`` or ``"cupy"``) on
    the pool's GPU, copying each chunk's outputs out of its slot device to device.

    It has the interface of :class:`._outputs.OutputAssembler`.
    """

    def __init__(
        self,
        spec: ModelSpec,
        total: int,
        names: tuple[str, ...] | None,
        library: str,
        device: _cuda.Device,
    ) -> None:
        self._spec = spec
        self._total = total
        self._names = names
        self._library = _import(library)
        self._device = device
        self._arrays: dict[str, Any] = {}

    def add(self, slot: Any, start: int, answered: Any) -> int:
        """Copies one chunk's outputs out of a slot (a CUDA slot's views); returns the bytes
        copied."""
        copied = 0
        for name, _, shape, _ in answered:
            dtype = self._spec.outputs_by_name[name].dtype
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > slot.outputs_capacity(name):
                raise TritonServerError(
                    f"model {self._spec.name!r}: output {name!r} has shape {shape}, larger than "
                    f"the {slot.outputs_capacity(name)} bytes its slot holds; register a larger "
                    "max_shapes entry",
                    model=self._spec.name,
                )
            array = self._array(name, shape, dtype)
            row = nbytes // shape[0] if self._spec.batched and shape and shape[0] else 0
            slot.copy_output(name, nbytes, _pointer(array) + start * row)
            copied += nbytes
        slot.synchronize()
        return copied

    def _array(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        full = (self._total, *shape[1:]) if self._spec.batched else shape
        array = self._arrays.get(name)
        if array is None:
            array = self._empty(full, dtype)
            self._arrays[name] = array
        elif tuple(array.shape) != full:
            raise TritonServerError(
                f"model {self._spec.name!r}: output {name!r} came back as {shape[1:]} per sample "
                f"in one chunk and {tuple(array.shape[1:])} in another; call with at most "
                "max_batch_size samples for such outputs",
                model=self._spec.name,
            )
        return array

    def _empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        library, index = self._library, self._device.index
        if library.__name__ == "torch":
            torch_dtype = library.from_numpy(np.empty(0, dtype)).dtype
            return library.empty(shape, dtype=torch_dtype, device=f"cuda:{index}")
        with library.cuda.Device(index):
            return library.empty(shape, dtype)

    def result(self) -> dict[str, Any]:
        """The outputs asked for, by name, in the model's order."""
        names = self._names or tuple(t.name for t in self._spec.outputs)
        return {name: self._arrays[name] for name in names}


def _pointer(array: Any) -> int:
    return int(array.data_ptr()) if hasattr(array, "data_ptr") else int(array.data.ptr)


def _import(library: str) -> Any:
    try:
        return importlib.import_module(library)
    except ImportError as exc:
        raise InvalidInputError(
            f"outputs_as={library!r} needs {library}, which is not installed",
            expected=OUTPUT_KINDS,
            actual=library,
        ) from exc
