"""Shared memory by hand, as in Triton's ``simple_grpc_shm_client`` and
``simple_grpc_cudashm_client``: a region per input and output tensor of a case, in system
shared memory or on GPU 0, created and registered once (:class:`ManualRegions`)."""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._slots._memory import CUDA, SYSTEM

__all__ = ["SHM_KEY_PREFIX", "ManualRegions"]

#: Prefix of the shared-memory keys and region names the hand-written shm paths create
#: (followed by the process id).
SHM_KEY_PREFIX = "rtsbench_"


class ManualRegions:
    """Regions made with tritonclient's utilities for ``memory`` (``"system"``:
    ``shared_memory``; ``"cuda"``: ``cuda_shared_memory``, on GPU 0) and registered on Triton
    with ``client``: one per tensor of a case (:meth:`create`); :meth:`close` releases them,
    even made in part.

    Attributes:
        utils: The utilities module (its ``set_shared_memory_region`` and
            ``get_contents_as_numpy`` fill and read a region).
        regions: ``"in:NAME"`` / ``"out:NAME"`` -> (handle, region name, bytes), in the
            order they were registered.
    """

    def __init__(self, client: Any, memory: str = SYSTEM) -> None:
        self._client, self._memory = client, memory
        if memory == CUDA:
            import tritonclient.utils.cuda_shared_memory as cudashm  # needs cuda-bindings

            self.utils: Any = cudashm
        else:
            self.utils = shm
        self.regions: dict[str, tuple[Any, str, int]] = {}

    def create(self, case: ModelCase) -> None:
        """Creates and registers a region per input and output of ``case``, each the size of
        one request's tensor."""
        client = self._client
        tag = f"{SHM_KEY_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
        for kind, tensors in (("in", case.inputs), ("out", case.outputs)):
            for t in tensors:
                elements = math.prod(case.request_shape(t))
                if self._memory == CUDA:
                    region, nbytes = f"{tag}_cuda_{kind}_{t.name}", elements * t.dtype.itemsize
                    handle = self.utils.create_shared_memory_region(region, nbytes, 0)
                    self.regions[f"{kind}:{t.name}"] = (handle, region, nbytes)
                    raw = self.utils.get_raw_handle(handle)
                    client.register_cuda_shared_memory(region, raw, 0, nbytes)
                else:
                    # Serialized BYTES: a 4-byte length before each element.
                    size = 4 + t.max_element_bytes if t.is_bytes else t.dtype.itemsize
                    region, nbytes = f"{tag}_{kind}_{t.name}", elements * size
                    handle = shm.create_shared_memory_region(
                        region, "/" + region, nbytes, create_only=True
                    )
                    self.regions[f"{kind}:{t.name}"] = (handle, region, nbytes)
                    client.register_system_shared_memory(region, "/" + region, nbytes)

    def requested_outputs(self, case: ModelCase) -> list[Any]:
        """One request's outputs, each to be written into its region."""
        outputs = []
        for t in case.outputs:
            _, region, nbytes = self.regions[f"out:{t.name}"]
            outputs.append(grpcclient.InferRequestedOutput(t.name))
            outputs[-1].set_shared_memory(region, nbytes)
        return outputs

    def close(self) -> None:
        """Unregisters and destroys the regions, last first; never raises."""
        unregister = (
            self._client.unregister_cuda_shared_memory
            if self._memory == CUDA
            else self._client.unregister_system_shared_memory
        )
        for handle, region, _ in reversed(self.regions.values()):
            with contextlib.suppress(Exception):
                unregister(region)
            with contextlib.suppress(Exception):
                self.utils.destroy_shared_memory_region(handle)
        self.regions = {}
