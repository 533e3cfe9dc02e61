"""The shared-memory paths without Ray: tritonclient's utilities by hand, and the core
client (``TritonSHMClient``) three ways. Their callers are threads."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from ray_triton_shm._bench._config import BY_VALUE, ELASTIC
from ray_triton_shm._bench.paths._base import BenchPath, SkipPath
from ray_triton_shm._bench.paths._clients import shm_client
from ray_triton_shm._bench.paths._regions import ManualRegions
from ray_triton_shm._slots._specs import SlotLayout
from ray_triton_shm._wire._plain_client import tritonclient_for

__all__ = ["PATHS", "ShmClientPath", "ShmLeasePath", "ShmManualPath", "ShmPreparedPath"]


class ShmManualPath(BenchPath):
    """``tritonclient.utils.shared_memory`` by hand, as in Triton's ``simple_grpc_shm_client``
    (one caller): a region per tensor, registered once (:class:`~._regions.ManualRegions`);
    per request the inputs are copied in (``set_shared_memory_region``), the outputs read
    (``get_contents_as_numpy``) and copied out."""

    name, label = "shm-manual", "gRPC + shm utils by hand"
    _regions: ManualRegions

    def setup(self) -> None:
        self.target.needs_shm("shared memory by hand (tritonclient's utilities)")
        self._client = tritonclient_for(self.target.grpc_url)
        self._regions = ManualRegions(self._client)
        self._regions.create(self.case)

    def run_once(self) -> Mapping[str, np.ndarray]:
        regions, infer_inputs = self._regions.regions, []
        for name, array in self.inputs.items():
            handle, region, _ = regions[f"in:{name}"]
            if array.dtype.kind == "O":
                data = serialize_byte_tensor(array)
                nbytes = len(data.item())
            else:
                data, nbytes = array, array.nbytes
            shm.set_shared_memory_region(handle, [data])
            datatype = str(np_to_triton_dtype(array.dtype))
            infer_input = grpcclient.InferInput(name, list(array.shape), datatype)
            infer_input.set_shared_memory(region, nbytes)
            infer_inputs.append(infer_input)
        outputs = self._regions.requested_outputs(self.case)
        result = self._client.infer(self.case.model, infer_inputs, outputs=outputs)
        arrays: dict[str, np.ndarray] = {}
        for t in self.case.outputs:
            output = result.get_output(t.name)
            handle, _, _ = regions[f"out:{t.name}"]
            dtype = triton_to_np_dtype(output.datatype)
            arrays[t.name] = shm.get_contents_as_numpy(handle, dtype, list(output.shape)).copy()
        return arrays

    def teardown(self) -> None:
        regions = getattr(self, "_regions", None)
        if regions is not None:
            regions.close()
        super().teardown()


class ShmClientPath(BenchPath):
    """``TritonSHMClient.infer_shm``: one client with ``slots`` slots, shared by the callers
    (threads)."""

    name, label = "shm-client", "TritonSHMClient.infer_shm"

    def setup(self) -> None:
        self._client, self._spec = shm_client(
            self.target.grpc_url,
            self.case,
            self.slots,
            reconnect_timeout_s=self.target.reconnect_timeout_s,
        )

    def run_once(self) -> Mapping[str, np.ndarray]:
        return self._client.infer_shm(self.case.model, self.inputs)  # type: ignore[no-any-return]

    def stats(self) -> dict[str, Any]:
        """The ``/dev/shm`` its pool takes (``shm_bytes``; an elastic pool's, or one by
        value, as it says at the end), and how it reached Triton (``transport``, ``"shm"`` or
        ``"inline"``: by value) and why (``transport_reason``)."""
        stats = self._client.shm_stats(self.case.model)
        numbers = {"transport": stats.transport, "transport_reason": stats.transport_reason}
        if self.slots == ELASTIC or stats.transport == BY_VALUE:
            return numbers | {"shm_bytes": stats.shm_bytes}
        return numbers | {"shm_bytes": SlotLayout.for_model(self._spec).region_bytes(self.slots)}


class ShmPreparedPath(ShmClientPath):
    """``TritonSHMClient.infer_shm`` of a batch its caller's preprocessing has just written
    (a copy of the case's inputs into the caller's own arrays, standing for the last write of
    decoding or resizing), which ``infer_shm`` then copies into the slot: the plain path that
    :class:`ShmLeasePath` is compared with, the same work on both sides."""

    name, label = "shm-client-prep", "preprocessing, then infer_shm"

    def setup(self) -> None:
        if self.case.has_bytes:
            raise SkipPath("BYTES tensors have no fixed place in a slot to write into")
        super().setup()
        self._batches = threading.local()  # each caller preprocesses into arrays of its own

    def run_once(self) -> Mapping[str, np.ndarray]:
        batch = getattr(self._batches, "arrays", None)
        if batch is None:
            batch = self._batches.arrays = {n: np.empty_like(a) for n, a in self.inputs.items()}
        for name, array in self.inputs.items():
            np.copyto(batch[name], array)
        return self._client.infer_shm(self.case.model, batch)  # type: ignore[no-any-return]


class ShmLeasePath(ShmClientPath):
    """``TritonSHMClient.lease``: the same preprocessing as :class:`ShmPreparedPath`'s writes
    the batch straight into its slot, and the outputs are read where Triton wrote them."""

    name, label = "shm-lease", "preprocessing into a lease"

    def setup(self) -> None:
        if self.case.has_bytes:
            raise SkipPath("BYTES tensors have no fixed place in a slot to write into")
        self.target.needs_shm("a lease")
        super().setup()
        spec = self._spec
        first = next(iter(self.inputs.values()))
        self._batch = len(first) if spec.batched else None
        if self._batch is not None and self._batch > spec.batch_capacity:
            raise SkipPath(
                f"a lease is one request of at most max_batch_size ({spec.batch_capacity}) "
                f"samples, and the batch has {self._batch}"
            )
        cut = 1 if spec.batched else 0
        self._shapes = {name: array.shape[cut:] for name, array in self.inputs.items()}

    def run_once(self) -> Mapping[str, np.ndarray]:
        with self._client.lease(self.case.model, batch=self._batch, shapes=self._shapes) as lease:
            for name, array in self.inputs.items():
                np.copyto(lease.inputs[name], array)
            return lease.infer()  # type: ignore[no-any-return]


#: The shared-memory paths without Ray, in table order (see ``_config.DEFAULT_PATHS``).
PATHS: tuple[type[BenchPath], ...] = (ShmManualPath, ShmClientPath, ShmPreparedPath, ShmLeasePath)
