"""The CUDA runtime as GPU-memory pools use it: GPUs by UUID, allocations and their IPC
handles, pinned staging memory, streams and copies.

This is the one place that calls CUDA, and the one place where a CUDA failure becomes a
:class:`CudaError` that says what to do. It calls the runtime of ``cuda-bindings`` (the
``[cuda]`` extra; the bindings tritonclient's own ``cuda_shared_memory`` uses), imported on
first use: the library imports and runs without them until a pool asks for GPU memory.

A GPU is named by its UUID across processes; which GPU a name means among those this process
sees is decided by :mod:`._gpu_choice`, without CUDA.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from types import ModuleType
from typing import Any

import numpy as np

from .._exceptions import CudaError, GPUMemoryFullError
from ._gpu_choice import VISIBLE_DEVICES_ENV_VAR, Device, choose_device, parse_device, uuid_name

__all__ = [
    "IPC_HANDLE_BYTES",
    "VISIBLE_DEVICES_ENV_VAR",
    "Device",
    "Stream",
    "allocate",
    "close_ipc",
    "find_device",
    "free",
    "free_pinned",
    "ipc_handle",
    "memory_info",
    "open_ipc",
    "pinned",
    "runtime",
    "use_device",
]

#: Size of a CUDA IPC memory handle (``CUDA_IPC_HANDLE_SIZE``).
IPC_HANDLE_BYTES = 64
_INSTALL = 'pip install "ray-triton-shm[cuda]"'


@functools.cache
def runtime() -> ModuleType:
    """``cuda.bindings.runtime``, imported once.

    Raises:
        CudaError: the bindings are not installed.
    """
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        raise CudaError(
            "pools in GPU memory (memory='cuda') need the CUDA Python bindings, which are not "
            f"installed: {_INSTALL} (or pip install cuda-bindings)"
        ) from exc
    return cudart


def check(result: Any, action: str, *, device: str | None = None) -> Any:
    """The values of a ``cuda.bindings`` call's result, or a :class:`CudaError` naming the
    action and what to do.

    Args:
        result: What the call returned: ``(error, *values)``.
        action: What was being done, for the message.
        device: The GPU concerned, for the message.
    """
    cudart = runtime()
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cudart.cudaError_t.cudaSuccess:
        raise _error(error, action, device)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _error(error: Any, action: str, device: str | None) -> CudaError:
    cudart = runtime()
    name = getattr(error, "name", str(error))
    described = cudart.cudaGetErrorString(error)[1]
    text = described.decode() if isinstance(described, bytes) else str(described)
    codes = cudart.cudaError_t
    if error == codes.cudaErrorInsufficientDriver:
        driver = cudart.cudaDriverGetVersion()[1]
        needed = cudart.cudaRuntimeGetVersion()[1]
        if not driver:
            text = (
                "no NVIDIA driver was found on this machine (no libcuda): pools in GPU memory "
                "need a GPU and its driver; use memory='system' here"
            )
        else:
            text = (
                f"the NVIDIA driver supports CUDA {_version(driver)}, older than the CUDA "
                f"{_version(needed)} of the installed cuda-bindings: upgrade the driver, or "
                f"install bindings of your driver's CUDA (pip install 'cuda-bindings=="
                f"{driver // 1000}.*')"
            )
    elif error == codes.cudaErrorNoDevice:
        visible = os.environ.get(VISIBLE_DEVICES_ENV_VAR)
        text = "this process sees no GPU" + (
            f" ({VISIBLE_DEVICES_ENV_VAR}={visible!r})" if visible is not None else ""
        )
    return CudaError(f"{action}: {text} ({name})", cuda_error=name, device=device)


def _version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


# ------------------------------------------------------------------ devices


@functools.cache
def _visible() -> tuple[Device, ...]:
    cudart = runtime()
    count = check(cudart.cudaGetDeviceCount(), "looking for GPUs")
    devices = []
    for index in range(count):
        props = check(cudart.cudaGetDeviceProperties(index), f"reading GPU {index}")
        name = props.name
        name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        devices.append(Device(index, uuid_name(bytes(props.uuid.bytes)), name.rstrip("\0")))
    return tuple(devices)


def _forget_devices_in_child() -> None:
    _visible.cache_clear()  # a child may see other GPUs (CUDA_VISIBLE_DEVICES set for it)


os.register_at_fork(after_in_child=_forget_devices_in_child)


def find_device(device: int | str | None) -> Device:
    """The GPU ``device`` names, as this process sees it.

    Args:
        device: An index in this process (``0``, ``"cuda:1"``), a UUID (``"GPU-..."``, as
            ``nvidia-smi -L`` prints it; a prefix is enough), or ``None`` for this thread's
            current CUDA device.

    Raises:
        CudaError: no GPU or driver here, or the GPU named is not visible to this process
            (named, with ``CUDA_VISIBLE_DEVICES``).
    """
    wanted = parse_device(device)
    devices = _visible()
    if wanted is None:
        wanted = int(check(runtime().cudaGetDevice(), "reading the current GPU"))
    return choose_device(wanted, devices)


_current = threading.local()


def use_device(device: Device) -> None:
    """Makes ``device`` this thread's current CUDA device (once per thread and device)."""
    if getattr(_current, "index", None) != device.index:
        check(runtime().cudaSetDevice(device.index), "selecting the GPU", device=device.uuid)
        _current.index = device.index


def memory_info(device: Device) -> tuple[int, int]:
    """``(free, total)`` bytes of the GPU's memory."""
    use_device(device)
    free_bytes, total = check(runtime().cudaMemGetInfo(), "reading GPU memory", device=device.uuid)
    return int(free_bytes), int(total)


# ------------------------------------------------------------------ memory


def allocate(device: Device, size: int, *, model: str, fix: str) -> int:
    """``size`` bytes of the GPU's memory (their device pointer).

    Raises:
        GPUMemoryFullError: the GPU has no room (naming ``fix``).
        CudaError: any other CUDA failure.
    """
    cudart = runtime()
    use_device(device)
    error, pointer = cudart.cudaMalloc(size)
    if error == cudart.cudaError_t.cudaErrorMemoryAllocation:
        cudart.cudaGetLastError()  # clear it, or the next call reports it again
        free_bytes = memory_info(device)[0]
        raise GPUMemoryFullError(
            f"model {model!r}: GPU {device.uuid} ({device.name}) has {free_bytes / 2**20:,.1f} "
            f"MiB free, too little for a slot of {size / 2**20:,.1f} MiB; {fix}",
            model=model,
            device=device.uuid,
            needed=size,
            free=free_bytes,
        )
    check((error,), f"allocating GPU memory for model {model!r}", device=device.uuid)
    return int(pointer)


def free(device: Device, pointer: int) -> None:
    """Frees an allocation of :func:`allocate`."""
    use_device(device)
    check(runtime().cudaFree(pointer), "freeing GPU memory", device=device.uuid)


def ipc_handle(pointer: int) -> bytes:
    """The CUDA IPC handle of an allocation, as the bytes Triton's registration takes."""
    cudart = runtime()
    handle = check(cudart.cudaIpcGetMemHandle(pointer), "exporting GPU memory")
    # cuda-bindings 13 exposes the handle's bytes only through its address.
    return bytes((ctypes.c_char * IPC_HANDLE_BYTES).from_address(handle.getPtr()))


def open_ipc(device: Device, handle: bytes) -> int:
    """Maps another process's allocation by its IPC handle; its device pointer here.

    Raises:
        CudaError: the handle cannot be opened here (its owner is gone, or another machine's).
    """
    cudart = runtime()
    use_device(device)
    raw = cudart.cudaIpcMemHandle_t()
    ctypes.memmove(raw.getPtr(), handle, IPC_HANDLE_BYTES)
    result = cudart.cudaIpcOpenMemHandle(raw, cudart.cudaIpcMemLazyEnablePeerAccess)
    return int(check(result, "opening the GPU memory of a pool's owner", device=device.uuid))


def close_ipc(device: Device, pointer: int) -> None:
    """Unmaps memory opened with :func:`open_ipc`."""
    use_device(device)
    check(runtime().cudaIpcCloseMemHandle(pointer), "closing GPU memory", device=device.uuid)


def pinned(size: int) -> tuple[int, np.ndarray]:
    """``size`` bytes of page-locked host memory (the GPU copies it at full speed, without a
    bounce through a pageable buffer): its address, and a NumPy view of it."""
    cudart = runtime()
    pointer = int(check(cudart.cudaHostAlloc(size, cudart.cudaHostAllocPortable), "pinning"))
    view = np.frombuffer(memoryview((ctypes.c_uint8 * size).from_address(pointer)), np.uint8)
    return pointer, view


def free_pinned(pointer: int) -> None:
    """Frees memory of :func:`pinned` (no view of it may be used afterwards)."""
    check(runtime().cudaFreeHost(pointer), "freeing pinned memory")


class Stream:
    """A CUDA stream of one slot in one process: its copies run in order on it, and
    :meth:`synchronize` waits for them."""

    def __init__(self, device: Device) -> None:
        cudart = runtime()
        use_device(device)
        self.device = device
        # A blocking stream: work on the legacy default stream (a caller's tensors made
        # there) is ordered before it without an event.
        self._stream = check(cudart.cudaStreamCreate(), "creating a stream", device=device.uuid)
        self._event: Any = None

    @property
    def handle(self) -> int:
        """The stream's handle, as DLPack's ``__dlpack__(stream=...)`` takes it."""
        return int(self._stream)

    def copy(self, destination: int, source: int, size: int) -> None:
        """Copies ``size`` bytes, either direction (pointers say where they live)."""
        cudart = runtime()
        use_device(self.device)
        kind = cudart.cudaMemcpyKind.cudaMemcpyDefault
        result = cudart.cudaMemcpyAsync(destination, source, size, kind, self._stream)
        check(result, "copying to or from GPU memory", device=self.device.uuid)

    def after(self, producer: int | None) -> None:
        """Orders this stream's next work after what the stream ``producer`` (a handle, as
        ``__cuda_array_interface__`` gives it) has queued so far."""
        if producer in (None, 0, 1):  # the legacy default stream: ours waits for it anyway
            return
        cudart = runtime()
        if self._event is None:
            flags = cudart.cudaEventDisableTiming
            self._event = check(cudart.cudaEventCreateWithFlags(flags), "creating an event")
        check(cudart.cudaEventRecord(self._event, cudart.cudaStream_t(producer)), "ordering")
        check(cudart.cudaStreamWaitEvent(self._stream, self._event, 0), "ordering")

    def synchronize(self) -> None:
        """Waits for every copy queued on the stream."""
        check(runtime().cudaStreamSynchronize(self._stream), "waiting for GPU copies")

    def close(self) -> None:
        """Destroys the stream (idempotent)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            cudart = runtime()
            cudart.cudaStreamDestroy(stream)
            if self._event is not None:
                cudart.cudaEventDestroy(self._event)
