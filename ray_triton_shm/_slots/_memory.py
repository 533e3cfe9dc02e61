"""Where a pool's slots live: in the region's own pages (system shared memory), on a GPU
(CUDA shared memory), or nowhere (by value: the tensors travel in the requests, for a Triton
that cannot map this process's memory). The one seam between the kinds.

Every region is a POSIX shm file that starts with its header (:mod:`._header`): the slot locks,
queue, counters and retirement work the same for both kinds. What differs is behind
:class:`SlotMemory`:

* where a slot's bytes are (:meth:`SlotMemory.views`: what the engine writes inputs into and
  reads outputs from), and where each slot starts in its Triton registration;
* how a slot is registered in Triton (:meth:`SlotMemory.register`): a system slot by its name
  in ``/dev/shm``, a GPU slot by its CUDA IPC handle;
* what is freed once Triton let go (:meth:`SlotMemory.release`).

A pool in **system memory** keeps its slots after the header in the region's file. A pool in
**GPU memory** keeps one allocation per slot on one GPU (so each slot has its own IPC handle and
its own registration, and is proven free exactly as a system slot, see :mod:`.._pools._abandoned`),
and the region's file holds, after the header, a table every process reads to use them: the GPU's
UUID, the slot size, and each slot's IPC handle. The owner allocates and exports; every other
process opens the handles once (:meth:`CudaMemory.attach`), on the GPU it finds by UUID.

A pool **by value** (:class:`ByValueMemory`) has a region of its header alone: its slots are
locks that bound the requests in flight (on a node, over every process), and nothing is
registered in Triton.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import service_pb2

from .._exceptions import CudaError, ForeignRegionError, ModelSpecError, TritonServerError
from .._wire._keys import Metadata
from . import _cuda
from ._gpu_choice import uuid_bytes, uuid_name
from ._header import RegionHeader
from ._shm import SharedMemoryRegion
from ._specs import REGION_HEADER_BYTES, SLOT_ALIGNMENT, ModelSpec, SlotLayout, TensorSpec

__all__ = [
    "BY_VALUE",
    "CUDA",
    "CUDA_PREVIEW",
    "MEMORY_KINDS",
    "SYSTEM",
    "ByValueMemory",
    "CudaMemory",
    "CudaSlotViews",
    "SlotIO",
    "SlotMemory",
    "SlotViews",
    "check_memory_options",
    "check_numeric",
    "new_memory",
    "open_memory",
    "region_bytes",
]

SYSTEM, CUDA = "system", "cuda"
#: The memory of a pool whose tensors travel by value, in the requests: its slots hold none.
#: Its word is ``"inline"``, the transport it makes (as headers, stats and metrics say it).
BY_VALUE = "inline"
#: What ``memory=`` takes.
MEMORY_KINDS = (SYSTEM, CUDA)
#: What GPU memory is worth as long as its GPU tests have not passed on a GPU: said by
#: ``bench --memory cuda`` when it runs, and by the README and the GPU guide (tests/test_docs.py).
CUDA_PREVIEW = (
    'GPU memory (memory="cuda") is a preview: its GPU tests (tests/test_gpu.py) have not yet '
    "run on a GPU."
)
#: The table of a GPU region, after its header: GPU UUID (16 bytes), slot bytes, Triton's
#: device id, slot count (int64 each), then each slot's IPC handle.
_TABLE = struct.Struct("=16sqqq")
_TABLE_BYTES = 2 * SLOT_ALIGNMENT
#: Deadline of each register/unregister call (Triton may be gone).
CALL_TIMEOUT_S = 5.0


def check_memory_options(
    model: str, memory: str, device: int | str | None, triton_device_id: int | None
) -> None:
    """Checks ``register_shm_model``'s memory options, before anything is made.

    Raises:
        ModelSpecError: an unknown kind, or a device given for system memory.
    """
    if memory not in MEMORY_KINDS:
        raise ModelSpecError(
            f"model {model!r}: memory must be one of {MEMORY_KINDS}, got {memory!r}", model=model
        )
    if memory == SYSTEM and (device is not None or triton_device_id is not None):
        raise ModelSpecError(
            f"model {model!r}: device and triton_device_id choose a GPU, for memory='cuda' "
            f"only (memory is {memory!r})",
            model=model,
        )


def region_bytes(memory: str, layout: SlotLayout, slots: int, *, rows: bool = False) -> int:
    """Size of a region's file in ``/dev/shm`` for ``slots`` slots of ``layout`` (``rows``: a
    region by value whose slots gather a node batch's rows)."""
    if memory == SYSTEM or (memory == BY_VALUE and rows):
        return layout.region_bytes(slots)
    return REGION_HEADER_BYTES + (_TABLE_BYTES if memory == CUDA else 0)


class SlotIO(Protocol):
    """One slot as the engine uses it: inputs written into :attr:`inputs` (or to the GPU),
    made visible to Triton by :meth:`commit`; outputs read through :meth:`output`."""

    @property
    def inputs(self) -> dict[str, np.ndarray]: ...

    @property
    def outputs(self) -> dict[str, np.ndarray]: ...

    def write_device(self, name: str, value: Any, start: int, nbytes: int) -> None: ...

    def commit(self, written: Sequence[int], staged: Sequence[bool]) -> None: ...

    def output(self, name: str, nbytes: int) -> np.ndarray: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------ system memory


class SlotViews:
    """Flat typed views of each tensor's place in one slot of system memory, made once and
    reused by every call.

    Attributes:
        inputs: Per input name, a 1-D array over its whole reserved space.
        outputs: Per output name, the same.
    """

    __slots__ = ("inputs", "outputs")

    def __init__(self, spec: ModelSpec, layout: SlotLayout, buffer: Any, base: int) -> None:
        self.inputs: dict[str, np.ndarray] = _views(
            spec.inputs, layout.input_offsets, layout, "in", buffer, base
        )
        self.outputs: dict[str, np.ndarray] = _views(
            spec.outputs, layout.output_offsets, layout, "out", buffer, base
        )

    def write_device(self, name: str, value: Any, start: int, nbytes: int) -> None:
        """GPU tensors go to pools in GPU memory only (refused when inputs are checked)."""
        raise TypeError(f"input {name!r}: a GPU tensor for a slot in system memory")

    def commit(self, written: Sequence[int], staged: Sequence[bool]) -> None:
        """The inputs are written: nothing to do, Triton reads them where they are."""

    def output(self, name: str, nbytes: int) -> np.ndarray:
        """Output ``name``'s place (its first ``nbytes`` are Triton's answer)."""
        return self.outputs[name]

    def close(self) -> None:
        """Nothing to free: the views go with the region's mapping."""


def _views(
    tensors: tuple[TensorSpec, ...],
    offsets: Mapping[str, int],
    layout: SlotLayout,
    kind: str,
    buffer: Any,
    base: int,
) -> dict[str, np.ndarray]:
    result = {}
    for t in tensors:
        if t.name not in offsets:
            continue  # a decoupled model's output: it comes back in the responses
        dtype = np.dtype(np.uint8) if t.is_bytes else t.dtype  # BYTES: serialized
        capacity = layout.capacities[f"{kind}:{t.name}"]
        count = capacity // dtype.itemsize
        result[t.name] = np.frombuffer(buffer, dtype, count, base + offsets[t.name])
    return result


class SlotMemory:
    """Slots in system shared memory: after the header, in the region's own file.

    Args:
        region: The region.
        layout: One slot's layout.
        slot_count: Slots in the region.
    """

    kind = SYSTEM

    def __init__(self, region: SharedMemoryRegion, layout: SlotLayout, slot_count: int) -> None:
        self.region = region
        self.layout = layout
        self.slot_count = slot_count

    @property
    def holds_rows(self) -> bool:
        """Whether its slots hold tensors in this region's pages, where a node batch gathers
        its rows (not on a GPU)."""
        return self.kind == SYSTEM

    @property
    def device(self) -> _cuda.Device | None:
        """The GPU of the slots (``None``: host memory)."""
        return None

    def views(self, spec: ModelSpec) -> list[SlotIO]:
        """Each slot's views, for the engine to write inputs into and read outputs from."""
        buffer, layout = self.region.buffer, self.layout
        return [
            SlotViews(spec, layout, buffer, layout.slot_offset(slot))
            for slot in range(self.slot_count)
        ]

    def offset(self, slot: int) -> int:
        """Where ``slot`` starts in its registration (offsets of requests count from there)."""
        return self.layout.slot_offset(slot)

    def register(self, stub: Any, key: str, slot: int, metadata: Metadata) -> None:
        """Registers ``slot`` in Triton as ``key`` (over the whole region's file, linked as
        ``key`` in ``/dev/shm``).

        Raises:
            grpc.RpcError: Triton refused (``ALREADY_EXISTS`` included) or is unreachable.
        """
        request = service_pb2.SystemSharedMemoryRegisterRequest(
            name=key, key="/" + key, offset=0, byte_size=self.region.size
        )
        stub.SystemSharedMemoryRegister(request, metadata=metadata, timeout=CALL_TIMEOUT_S)

    def unregister(self, stub: Any, key: str, metadata: Metadata) -> None:
        """Unregisters a slot's name from Triton (one Triton does not know is fine).

        Raises:
            grpc.RpcError: Triton refused (a request still uses the slot) or is unreachable.
        """
        request = service_pb2.SystemSharedMemoryUnregisterRequest(name=key)
        stub.SystemSharedMemoryUnregister(request, metadata=metadata, timeout=CALL_TIMEOUT_S)

    def release(self, registered: Sequence[int] = ()) -> None:
        """Frees what the slots hold beyond the region's file, once Triton let go of every
        slot but ``registered``: nothing, for system memory."""

    def back(self, slot: int) -> None:
        """Reserves the pages of ``slot`` in ``/dev/shm`` (a pool growing; the owner only).

        Raises:
            SharedMemoryFullError: ``/dev/shm`` has no room.
        """
        self.region.back(self.layout.slot_offset(slot), self.layout.slot_bytes)

    def unback(self, slot: int) -> None:
        """Gives the pages of ``slot`` back to ``/dev/shm`` (a pool shrinking; only for a slot
        that nobody, Triton included, uses)."""
        self.region.unback(self.layout.slot_offset(slot), self.layout.slot_bytes)

    def explain(self, refusal: TritonServerError) -> TritonServerError | CudaError:
        """What the caller gets when Triton refused to register a slot."""
        return refusal


# ------------------------------------------------------------------ GPU memory


class CudaSlotViews:
    """One GPU slot as one process uses it: inputs written to it (NumPy arrays through pinned
    staging memory, GPU tensors device to device) and outputs read out of it, on a stream of
    the slot's own. Staging memory and the stream are made on first use."""

    def __init__(self, spec: ModelSpec, layout: SlotLayout, device: _cuda.Device, pointer: int):
        self._spec = spec
        self._layout = layout
        self._device = device
        self._pointer = pointer
        self._stream: _cuda.Stream | None = None
        self._staging: tuple[int, np.ndarray] | None = None
        self._host_views: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """Per input, its place in this slot's pinned staging memory (NumPy inputs are
        written there, then copied to the GPU by :meth:`commit`)."""
        return self._host()[0]

    @property
    def outputs(self) -> dict[str, np.ndarray]:
        """Per output, its place in the staging memory (see :meth:`output`)."""
        return self._host()[1]

    def _host(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        if self._host_views is None:
            self._staging = _cuda.pinned(self._layout.slot_bytes)
            buffer, layout, spec = self._staging[1], self._layout, self._spec
            self._host_views = (
                _views(spec.inputs, layout.input_offsets, layout, "in", buffer, 0),
                _views(spec.outputs, layout.output_offsets, layout, "out", buffer, 0),
            )
        return self._host_views

    def _on_stream(self) -> _cuda.Stream:
        if self._stream is None:
            self._stream = _cuda.Stream(self._device)
        return self._stream

    def write_device(self, name: str, value: Any, start: int, nbytes: int) -> None:
        """Queues a copy of ``nbytes`` of a GPU tensor, from byte ``start``, into input
        ``name``'s place, after the work its producer queued on its stream."""
        stream = self._on_stream()
        stream.after(value.stream)
        offset = self._layout.input_offsets[name]
        stream.copy(self._pointer + offset, value.pointer + start, nbytes)

    def commit(self, written: Sequence[int], staged: Sequence[bool]) -> None:
        """Copies the inputs written to the staging memory (``staged``, per input) to the GPU,
        and waits for every input's copy: the slot holds the chunk's inputs once this
        returns."""
        stream = self._on_stream()
        for tensor, nbytes, in_staging in zip(self._spec.inputs, written, staged):
            if in_staging:
                offset = self._layout.input_offsets[tensor.name]
                stream.copy(self._pointer + offset, self._staging_pointer() + offset, nbytes)
        stream.synchronize()

    def output(self, name: str, nbytes: int) -> np.ndarray:
        """Copies the first ``nbytes`` of output ``name`` to the staging memory; its place
        there."""
        place = self.outputs[name]
        offset = self._layout.output_offsets[name]
        stream = self._on_stream()
        stream.copy(self._staging_pointer() + offset, self._pointer + offset, nbytes)
        stream.synchronize()
        return place

    def outputs_capacity(self, name: str) -> int:
        """Bytes reserved for output ``name``."""
        return self._layout.capacities[f"out:{name}"]

    def copy_output(self, name: str, nbytes: int, destination: int) -> None:
        """Queues a copy of the first ``nbytes`` of output ``name`` to GPU memory at
        ``destination`` (see :meth:`synchronize`)."""
        offset = self._layout.output_offsets[name]
        self._on_stream().copy(destination, self._pointer + offset, nbytes)

    def synchronize(self) -> None:
        """Waits for every copy queued."""
        self._on_stream().synchronize()

    def _staging_pointer(self) -> int:
        self._host()
        assert self._staging is not None
        return self._staging[0]

    def close(self) -> None:
        """Frees the staging memory and the stream (no view of them may be used after)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        staging, self._staging, self._host_views = self._staging, None, None
        if staging is not None:
            _cuda.free_pinned(staging[0])


class CudaMemory(SlotMemory):
    """Slots on one GPU, one allocation each, exported by CUDA IPC handles.

    Made by :meth:`create` (the owner, which allocates) or :meth:`attach` (any other process,
    which opens the owner's handles).
    """

    kind = CUDA

    def __init__(
        self,
        region: SharedMemoryRegion,
        layout: SlotLayout,
        device: _cuda.Device,
        triton_device_id: int,
        pointers: list[int],
        handles: list[bytes],
        *,
        owner: bool,
    ) -> None:
        super().__init__(region, layout, len(pointers))
        self._device = device
        self.triton_device_id = triton_device_id
        self._pointers = pointers
        self._handles = handles
        self._owner = owner
        self._views: list[CudaSlotViews] = []

    @property
    def device(self) -> _cuda.Device:
        """The GPU of the slots."""
        return self._device

    @classmethod
    def create(
        cls,
        region: SharedMemoryRegion,
        layout: SlotLayout,
        slot_count: int,
        device: _cuda.Device,
        triton_device_id: int,
        *,
        model: str,
    ) -> CudaMemory:
        """Allocates ``slot_count`` slots on ``device`` and writes their table into the
        region's file. Nothing is left allocated if it fails.

        Raises:
            GPUMemoryFullError: the GPU has no room.
            CudaError: any other CUDA failure.
        """
        pointers: list[int] = []
        fix = (
            f"register {model!r} with a smaller pool_size (now {slot_count}) or max_batch_size, "
            "or free GPU memory (Triton's own pools: --cuda-memory-pool-byte-size)"
        )
        try:
            for _ in range(slot_count):
                pointers.append(_cuda.allocate(device, layout.slot_bytes, model=model, fix=fix))
            handles = [_cuda.ipc_handle(pointer) for pointer in pointers]
        except BaseException:
            for pointer in pointers:
                _cuda.free(device, pointer)
            raise
        raw_uuid = uuid_bytes(device.uuid)
        table = _TABLE.pack(raw_uuid, layout.slot_bytes, triton_device_id, slot_count)
        buffer = region.buffer
        buffer[REGION_HEADER_BYTES : REGION_HEADER_BYTES + _TABLE.size] = table
        start = REGION_HEADER_BYTES + _TABLE.size
        buffer[start : start + len(handles) * _cuda.IPC_HANDLE_BYTES] = b"".join(handles)
        RegionHeader(buffer, slot_count).set_memory(CUDA)
        return cls(region, layout, device, triton_device_id, pointers, handles, owner=True)

    @classmethod
    def attach(cls, region: SharedMemoryRegion, layout: SlotLayout, slot_count: int) -> CudaMemory:
        """Opens the slots of a GPU region another process owns, on the GPU of its table.

        Raises:
            CudaError: this process does not see that GPU (naming it and
                ``CUDA_VISIBLE_DEVICES``), or cannot open the handles.
        """
        buffer = region.buffer
        raw_uuid, slot_bytes, triton_device_id, count = _TABLE.unpack_from(
            buffer, REGION_HEADER_BYTES
        )
        if slot_bytes != layout.slot_bytes or count != slot_count:
            raise CudaError(
                f"region {region.name!r} holds {count} slots of {slot_bytes} bytes, not the "
                f"{slot_count} of {layout.slot_bytes} expected"
            )
        device = _cuda.find_device(uuid_name(bytes(raw_uuid)))
        start = REGION_HEADER_BYTES + _TABLE.size
        size = _cuda.IPC_HANDLE_BYTES
        handles = [bytes(buffer[start + i * size : start + (i + 1) * size]) for i in range(count)]
        pointers: list[int] = []
        try:
            for handle in handles:
                pointers.append(_cuda.open_ipc(device, handle))
        except BaseException:
            for pointer in pointers:
                _cuda.close_ipc(device, pointer)
            raise
        return cls(region, layout, device, triton_device_id, pointers, handles, owner=False)

    def views(self, spec: ModelSpec) -> list[SlotIO]:
        """Each slot's views (see :class:`CudaSlotViews`)."""
        self._views = [
            CudaSlotViews(spec, self.layout, self._device, pointer) for pointer in self._pointers
        ]
        return list(self._views)

    def offset(self, slot: int) -> int:
        """Each slot is a registration of its own, from its first byte."""
        return 0

    def register(self, stub: Any, key: str, slot: int, metadata: Metadata) -> None:
        """Registers ``slot`` in Triton as ``key``, by its IPC handle.

        Raises:
            grpc.RpcError: Triton refused (``ALREADY_EXISTS`` included; it cannot open the
                handle) or is unreachable.
        """
        request = service_pb2.CudaSharedMemoryRegisterRequest(
            name=key,
            raw_handle=self._handles[slot],
            device_id=self.triton_device_id,
            byte_size=self.layout.slot_bytes,
        )
        stub.CudaSharedMemoryRegister(request, metadata=metadata, timeout=CALL_TIMEOUT_S)

    def explain(self, refusal: TritonServerError) -> TritonServerError | CudaError:
        """Triton's refusal of a GPU slot, with its likely causes: Triton says only "invalid
        args" when it cannot open the IPC handle."""
        if type(refusal) is not TritonServerError:
            return refusal  # keys, reachability...: said as for system memory
        return CudaError(
            f"Triton could not open the GPU memory of a slot on GPU {self._device.uuid} "
            f"({self._device.name}) as its device {self.triton_device_id} "
            f"({refusal.server_message}). Either Triton runs on another machine, or in a "
            "container that does not have this GPU (give it the GPU, and let it share the "
            "host's IPC namespace with this process: --ipc=host, or one pod), or Triton sees "
            "this GPU under another index (pass triton_device_id=), or this Triton has no GPU "
            "support (a CPU-only build, or no GPU or driver where it runs): use "
            "memory='system' there",
            model=refusal.model,
            device=self._device.uuid,
        )

    def unregister(self, stub: Any, key: str, metadata: Metadata) -> None:
        """Unregisters a slot's name from Triton (one Triton does not know is fine)."""
        request = service_pb2.CudaSharedMemoryUnregisterRequest(name=key)
        stub.CudaSharedMemoryUnregister(request, metadata=metadata, timeout=CALL_TIMEOUT_S)

    def release(self, registered: Sequence[int] = ()) -> None:
        """Frees the staging memory and streams; the owner frees each slot Triton let go of
        (one Triton still holds stays allocated until this process exits: freeing memory
        another process maps is undefined), any other process closes its handles."""
        for view in self._views:
            view.close()
        pointers, self._pointers = self._pointers, []
        for slot, pointer in enumerate(pointers):
            if self._owner and slot in registered:
                continue
            try:
                if self._owner:
                    _cuda.free(self._device, pointer)
                else:
                    _cuda.close_ipc(self._device, pointer)
            except CudaError:
                pass  # a context already torn down (the process exits): nothing left to free


# ------------------------------------------------------------------ by value


class _NoViews:
    """A slot by value holds no tensors: its requests carry them (see
    :class:`.._inference._requests.ValueRequests`)."""

    inputs: dict[str, np.ndarray] = {}
    outputs: dict[str, np.ndarray] = {}

    def write_device(self, name: str, value: Any, start: int, nbytes: int) -> None:
        raise TypeError(f"input {name!r}: a slot by value holds no tensor")

    def commit(self, written: Sequence[int], staged: Sequence[bool]) -> None:
        """Nothing to do: the request carries the inputs."""

    def output(self, name: str, nbytes: int) -> np.ndarray:
        raise TypeError(f"output {name!r}: a slot by value holds no tensor")

    def close(self) -> None:
        """Nothing to free."""


class ByValueMemory(SlotMemory):
    """The slots of a pool whose tensors go by value, in the requests: locks in a region of
    the header alone, which Triton never maps (nothing is registered in it); or, for a pool
    batched on the node, slots that gather the rows of a batch before it goes out by value
    (:attr:`holds_rows`)."""

    kind = BY_VALUE

    @property
    def holds_rows(self) -> bool:
        """Whether its slots have room for tensors (a region made that large)."""
        return self.region.size >= self.layout.region_bytes(self.slot_count)

    def views(self, spec: ModelSpec) -> list[SlotIO]:
        if self.holds_rows:
            return super().views(spec)
        return [_NoViews()] * self.slot_count

    def offset(self, slot: int) -> int:
        return 0

    def register(self, stub: Any, key: str, slot: int, metadata: Metadata) -> None:
        """Nothing to register: Triton gets the tensors in the request."""

    def unregister(self, stub: Any, key: str, metadata: Metadata) -> None:
        """Nothing registered."""

    def back(self, slot: int) -> None:
        """No pages: a slot by value is a lock."""

    def unback(self, slot: int) -> None:
        """No pages."""


def new_memory(
    kind: str,
    region: SharedMemoryRegion,
    layout: SlotLayout,
    slot_count: int,
    *,
    gpu: str | None,
    triton_device_id: int | None,
    model: str,
) -> SlotMemory:
    """The memory of a new region's slots, of ``kind`` (GPU memory, on ``gpu`` by its UUID,
    is allocated here), said in the region's header for the processes that attach it (stamped
    as this layout's first)."""
    RegionHeader.new(region.buffer, slot_count, region=region.name)
    if kind == SYSTEM:
        return SlotMemory(region, layout, slot_count)
    if kind == BY_VALUE:
        RegionHeader(region.buffer, slot_count).set_memory(BY_VALUE)
        return ByValueMemory(region, layout, slot_count)
    assert triton_device_id is not None
    device = _cuda.find_device(gpu)
    return CudaMemory.create(region, layout, slot_count, device, triton_device_id, model=model)


def open_memory(
    region: SharedMemoryRegion, layout: SlotLayout, slot_count: int, *, model: str | None = None
) -> SlotMemory:
    """The memory of a region another process owns, of the kind its header says.

    Args:
        region: The region.
        layout: Its slots' layout.
        slot_count: Slots it has room for.
        model: Its model, for errors.

    Raises:
        ForeignRegionError: its memory word names no kind of memory (something wrote over
            it), naming the region and ``model``.
    """
    try:
        kind = RegionHeader(region.buffer, slot_count, region=region.name).memory
    except ForeignRegionError as exc:
        if model is None or exc.model is not None:
            raise
        raise ForeignRegionError(
            f"model {model!r}: {exc}",
            model=model,
            region=exc.region,
            version=exc.version,
            expected_version=exc.expected_version,
        ) from None
    if kind == CUDA:
        return CudaMemory.attach(region, layout, slot_count)
    if kind == BY_VALUE:
        return ByValueMemory(region, layout, slot_count)
    return SlotMemory(region, layout, slot_count)


def check_numeric(spec: ModelSpec) -> None:
    """Refuses a model with BYTES tensors for GPU memory.

    Raises:
        ModelSpecError: naming the BYTES tensors.
    """
    strings = [t.name for t in (*spec.inputs, *spec.outputs) if t.is_bytes]
    if strings:
        raise ModelSpecError(
            f"model {spec.name!r} has BYTES (string) tensors {strings}: pools in GPU memory hold "
            "numeric tensors only (Triton's backends take strings in host memory); register it "
            "with memory='system'",
            model=spec.name,
            tensor=strings[0],
        )
