"""The ways of getting tensors that live on a GPU to Triton and back (``bench --memory cuda``):
over gRPC and through system shared memory (both through the host), with tritonclient's CUDA
shared-memory utilities by hand, and with ``TritonSHMClient(memory="cuda")``. Each takes the
case's inputs as NumPy arrays, or as torch CUDA tensors (the ``-torch`` paths, whose outputs are
torch CUDA tensors too). One caller each; the model is ``identity_gpu`` (``gpu_models/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from ray_triton_shm._bench.paths._base import BenchPath, SkipPath
from ray_triton_shm._bench.paths._clients import infer, shm_client
from ray_triton_shm._bench.paths._regions import ManualRegions
from ray_triton_shm._slots._memory import CUDA
from ray_triton_shm._wire._plain_client import tritonclient_for

__all__ = ["GPU_MODEL_REPOSITORY", "PATHS"]

#: The models ``bench --memory cuda`` serves on the embedded Triton.
GPU_MODEL_REPOSITORY = Path(__file__).resolve().parents[1] / "gpu_models"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise SkipPath("torch is not installed (these paths send torch CUDA tensors)") from None
    if not torch.cuda.is_available():
        raise SkipPath("torch sees no GPU")
    return torch


class _OnGpu(BenchPath):
    """A path whose inputs are torch CUDA tensors (made once, as a caller's preprocessing
    would leave them) and whose outputs come back as torch CUDA tensors."""

    def setup(self) -> None:
        self._torch = _torch()
        self._tensors = {n: self._torch.from_numpy(a).cuda() for n, a in self.inputs.items()}

    def _to_gpu(self, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        torch = self._torch
        return {n: torch.from_numpy(np.ascontiguousarray(a)).cuda() for n, a in outputs.items()}

    def _to_host(self) -> dict[str, np.ndarray]:
        return {n: t.cpu().numpy() for n, t in self._tensors.items()}


class GrpcTorchPath(_OnGpu):
    """``tritonclient.grpc``, the tensors copied to the host and back."""

    name, label = "grpc-torch", "gRPC, torch CUDA tensors"

    def setup(self) -> None:
        super().setup()
        self._client = tritonclient_for(self.target.grpc_url)

    def run_once(self) -> Mapping[str, Any]:
        return self._to_gpu(infer(self._client, self.case, self._to_host()))


class ShmClientTorchPath(_OnGpu):
    """``TritonSHMClient`` in system memory, the tensors copied to the host and back."""

    name, label = "shm-client-torch", "TritonSHMClient (system memory), torch CUDA tensors"

    def setup(self) -> None:
        super().setup()
        self._client, _ = shm_client(
            self.target.grpc_url,
            self.case,
            self.slots,
            reconnect_timeout_s=self.target.reconnect_timeout_s,
        )

    def run_once(self) -> Mapping[str, Any]:
        return self._to_gpu(self._client.infer_shm(self.case.model, self._to_host()))


class _CudaManual(BenchPath):
    """tritonclient's ``cuda_shared_memory`` by hand, as in Triton's
    ``simple_grpc_cudashm_client``: a region per tensor on GPU 0, registered once
    (:class:`~._regions.ManualRegions`)."""

    _regions: ManualRegions

    def setup(self) -> None:
        self._client = tritonclient_for(self.target.grpc_url)
        self._regions = ManualRegions(self._client, CUDA)
        self._cudashm = self._regions.utils
        self._regions.create(self.case)

    def _send(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        infer_inputs, regions = [], self._regions.regions
        for t in self.case.inputs:
            _, region, nbytes = regions[f"in:{t.name}"]
            datatype = str(np_to_triton_dtype(t.dtype))
            infer_input = grpcclient.InferInput(t.name, list(shapes[t.name]), datatype)
            infer_input.set_shared_memory(region, nbytes)
            infer_inputs.append(infer_input)
        outputs = self._regions.requested_outputs(self.case)
        return self._client.infer(self.case.model, infer_inputs, outputs=outputs)

    def teardown(self) -> None:
        regions = getattr(self, "_regions", None)
        if regions is not None:
            regions.close()
        super().teardown()


class CudaManualPath(_CudaManual):
    """NumPy in and out through tritonclient's helpers (``set_shared_memory_region``,
    ``get_contents_as_numpy``)."""

    name, label = "cuda-manual", "CUDA shm utils by hand, NumPy"

    def run_once(self) -> Mapping[str, np.ndarray]:
        for name, array in self.inputs.items():
            self._cudashm.set_shared_memory_region(self._regions.regions[f"in:{name}"][0], [array])
        result = self._send({n: a.shape for n, a in self.inputs.items()})
        arrays = {}
        for t in self.case.outputs:
            output = result.get_output(t.name)
            handle = self._regions.regions[f"out:{t.name}"][0]
            arrays[t.name] = self._cudashm.get_contents_as_numpy(
                handle, t.dtype, list(output.shape)
            )
        return arrays


class CudaManualTorchPath(_CudaManual, _OnGpu):
    """torch CUDA tensors in and out through tritonclient's DLPack helpers
    (``set_shared_memory_region_from_dlpack``, ``as_shared_memory_tensor``), each output
    copied out of its region so that the next request may use it."""

    name, label = "cuda-manual-torch", "CUDA shm utils by hand, torch CUDA tensors"

    def setup(self) -> None:
        _OnGpu.setup(self)
        _CudaManual.setup(self)

    def run_once(self) -> Mapping[str, Any]:
        torch = self._torch
        for name, tensor in self._tensors.items():
            handle = self._regions.regions[f"in:{name}"][0]
            self._cudashm.set_shared_memory_region_from_dlpack(handle, [tensor])
        result = self._send({n: tuple(t.shape) for n, t in self._tensors.items()})
        arrays = {}
        for t in self.case.outputs:
            output = result.get_output(t.name)
            handle = self._regions.regions[f"out:{t.name}"][0]
            view = self._cudashm.as_shared_memory_tensor(handle, output.datatype, output.shape)
            arrays[t.name] = torch.from_dlpack(view).clone()
        return arrays


class CudaClientPath(BenchPath):
    """``TritonSHMClient(memory="cuda")``: NumPy in (through pinned staging) and out."""

    name, label = "cuda-client", "TritonSHMClient (GPU memory), NumPy"

    def setup(self) -> None:
        self._client = _cuda_client(self)

    def run_once(self) -> Mapping[str, Any]:
        return self._client.infer_shm(self.case.model, self.inputs)  # type: ignore[no-any-return]


class CudaClientTorchPath(_OnGpu):
    """``TritonSHMClient(memory="cuda")``: torch CUDA tensors in, device to device, and out
    (``outputs_as="torch"``)."""

    name, label = "cuda-client-torch", "TritonSHMClient (GPU memory), torch CUDA tensors"

    def setup(self) -> None:
        super().setup()
        self._client = _cuda_client(self)

    def run_once(self) -> Mapping[str, Any]:
        out = self._client.infer_shm(self.case.model, self._tensors, outputs_as="torch")
        return out  # type: ignore[no-any-return]


#: The GPU paths, in table order (their names are ``_config.GPU_PATHS`` but gRPC's and
#: ``shm-client``, which are :mod:`._plain`'s and :mod:`._shm`'s).
PATHS: tuple[type[BenchPath], ...] = (
    CudaManualPath,
    CudaClientPath,
    GrpcTorchPath,
    ShmClientTorchPath,
    CudaManualTorchPath,
    CudaClientTorchPath,
)


def _cuda_client(path: BenchPath) -> Any:
    """The measured client of a path, its pool in GPU memory on GPU 0."""
    client, _ = shm_client(
        path.target.grpc_url,
        path.case,
        path.slots,
        reconnect_timeout_s=path.target.reconnect_timeout_s,
        memory=CUDA,
        device=0,
    )
    return client
