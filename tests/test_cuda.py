"""Pools in GPU memory, where no GPU is needed: the options, the errors of a machine without a
GPU (from the real CUDA bindings, or their absence), Triton refusing GPU memory, and what
never changes for system memory. The tests that need a GPU are in ``test_gpu.py``."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import uuid
from typing import Any

import numpy as np
import pytest
from _helpers import registered_on

from ray_triton_shm import (
    CudaError,
    GPUMemoryFullError,
    InvalidInputError,
    ModelSpecError,
    TritonSHMClient,
)
from ray_triton_shm._client import registry_of
from ray_triton_shm._inference._transport import Unmappable
from ray_triton_shm._pools import _registry
from ray_triton_shm._slots import _cuda
from ray_triton_shm._slots._header import RegionHeader
from ray_triton_shm._slots._memory import (
    CUDA_PREVIEW,
    CudaMemory,
    SlotMemory,
    open_memory,
    region_bytes,
)
from ray_triton_shm._slots._shm import (
    SharedMemoryRegion,
    list_local_regions,
    new_region_name,
    slot_key,
)
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES, SlotLayout
from ray_triton_shm._wire._reconnect import Reconnect


def _gpu_here() -> bool:
    try:
        return bool(_cuda._visible())
    except CudaError:
        return False


SHAPES = {"INPUT0": (4,), "OUTPUT0": (4,)}
no_gpu_only = pytest.mark.skipif(_gpu_here(), reason="this machine has a GPU: see test_gpu.py")


def _mine() -> set[str]:
    return {r.name for r in list_local_regions() if r.owner.pid == os.getpid()}


def test_memory_options_are_checked_before_anything(grpc_url: str) -> None:
    before = _mine(), registered_on(grpc_url)
    with TritonSHMClient(url=grpc_url) as client:
        with pytest.raises(ModelSpecError, match=r"memory must be one of \('system', 'cuda'\)"):
            client.register_shm_model("identity", memory="gpu")
        with pytest.raises(ModelSpecError, match="for memory='cuda' only"):
            client.register_shm_model("identity", device=0)
        with pytest.raises(CudaError, match="device must be a GPU index"):
            client.register_shm_model("identity", memory="cuda", device=1.5)  # type: ignore[arg-type]
        assert client.registered_models == {}
    assert (_mine(), registered_on(grpc_url)) == before


@no_gpu_only
def test_no_gpu_is_a_clear_error_and_nothing_is_left(grpc_url: str) -> None:
    before = _mine(), registered_on(grpc_url)
    with TritonSHMClient(url=grpc_url) as client:
        with pytest.raises(CudaError) as caught:
            client.register_shm_model("identity", memory="cuda")
        error = caught.value
        assert "no NVIDIA driver was found" in str(error), error
        assert "memory='system'" in str(error)
        assert error.cuda_error == "cudaErrorInsufficientDriver"
        assert (_mine(), registered_on(grpc_url)) == before
        # The client goes on in system memory.
        client.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
    assert (_mine(), registered_on(grpc_url)) == before


def test_without_the_bindings_the_core_works_and_gpu_memory_names_the_extra(
    grpc_url: str,
) -> None:
    script = f"""
import sys
sys.modules["cuda"] = None  # as if cuda-bindings were not installed
import numpy as np
from ray_triton_shm import CudaError, TritonSHMClient
with TritonSHMClient(url={grpc_url!r}) as client:
    client.register_shm_model("identity", pool_size=1, max_shapes={SHAPES!r})
    x = np.ones((1, 4), np.float32)
    assert (client.infer_shm("identity", {{"INPUT0": x}})["OUTPUT0"] == x).all()
    try:
        client.register_shm_model("my_model", memory="cuda")
    except CudaError as exc:
        print("ERROR", exc)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert 'pip install "ray-triton-shm[cuda]"' in done.stdout, done.stdout


def test_the_core_never_imports_cuda_for_system_memory(grpc_url: str) -> None:
    script = f"""
import sys
import numpy as np
from ray_triton_shm import TritonSHMClient
with TritonSHMClient(url={grpc_url!r}) as client:
    client.register_shm_model("identity", pool_size=1, max_shapes={SHAPES!r})
    client.infer_shm("identity", {{"INPUT0": np.ones((1, 4), np.float32)}})
print(sorted(m for m in sys.modules if m.split(".")[0] in ("cuda", "torch", "cupy")))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


class _GpuTensorStandIn:
    """Something that offers its memory as a GPU tensor (no real one can exist here)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (0, False),
            "version": 3,
        }


def test_a_gpu_tensor_for_a_system_pool_is_refused_before_any_byte(grpc_url: str) -> None:
    with TritonSHMClient(url=grpc_url) as client:
        client.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
        with pytest.raises(InvalidInputError) as caught:
            client.infer_shm("identity", {"INPUT0": _GpuTensorStandIn((2, 4))})
        error = caught.value
        assert error.tensor == "INPUT0" and error.expected == "np.ndarray"
        assert "pool is in system memory and takes NumPy arrays" in str(error)
        assert "GPU tensors go to a pool registered with memory='cuda'" in str(error)
        with pytest.raises(InvalidInputError, match=r"outputs_as must be one of"):
            client.infer_shm(
                "identity", {"INPUT0": np.ones((1, 4), np.float32)}, outputs_as="torch"
            )
        with pytest.raises(InvalidInputError, match=r"got 'jax'"):
            client.infer_shm("identity", {"INPUT0": np.ones((1, 4), np.float32)}, outputs_as="jax")
        stats = client.shm_stats("identity")
        assert stats.in_use == 0 and stats.abandoned == 0


def test_triton_refusing_gpu_memory_names_the_causes_and_nothing_stays(grpc_url: str) -> None:
    """The real Triton here cannot open a CUDA IPC handle (no GPU): its refusal, explained."""
    before = registered_on(grpc_url)
    with TritonSHMClient(url=grpc_url) as client:
        spec = client.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)
        layout = SlotLayout.for_model(spec)
        client.unregister_shm_model("identity")
        name = new_region_name("identity")
        region = SharedMemoryRegion.create(name, region_bytes("cuda", layout, 2))
        try:
            device = _cuda.Device(0, f"GPU-{uuid.uuid4()}", "a GPU of another machine")
            handles = [os.urandom(_cuda.IPC_HANDLE_BYTES) for _ in range(2)]
            memory = CudaMemory(region, layout, device, 0, [], handles, owner=True)
            keys = [slot_key(name, slot) for slot in range(2)]
            reconnect = Reconnect(client._channel, grpc_url, 1.0, "identity")
            with pytest.raises(Unmappable) as caught:
                registry_of(client).register_slots(memory, keys, reconnect, model="identity")
        finally:
            region.unlink()
            region.close()
        message = str(caught.value)
        for cause in ("another machine", "container", "triton_device_id=", "CPU-only build"):
            assert cause in message, message
        assert "invalid args" in caught.value.refusal.server_message
        assert registered_on(grpc_url) == before


def test_gpu_memory_triton_cannot_open_falls_back_to_system_shared_memory(
    grpc_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU here: the GPU and its memory are stand-ins, Triton's refusal of them is real."""
    device = _cuda.Device(0, f"GPU-{uuid.uuid4()}", "a GPU Triton cannot open")
    made = _registry.new_memory

    def new_memory(
        kind: str, region: SharedMemoryRegion, layout: SlotLayout, count: int, **kw: Any
    ) -> Any:
        if kind != "cuda":
            return made(kind, region, layout, count, **kw)
        handles = [os.urandom(_cuda.IPC_HANDLE_BYTES) for _ in range(count)]
        return CudaMemory(region, layout, device, 0, [], handles, owner=True)

    monkeypatch.setattr(_cuda, "find_device", lambda _: device)
    monkeypatch.setattr(_registry, "new_memory", new_memory)
    before = registered_on(grpc_url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with TritonSHMClient(url=grpc_url) as client:
        client.register_shm_model(
            "identity", pool_size=2, max_shapes=SHAPES, memory="cuda", triton_device_id=0
        )
        stats = client.shm_stats("identity")
        assert stats.transport == "shm"
        assert "could not open the GPU memory" in stats.transport_reason
        assert "mapped the region" in stats.transport_reason  # system memory, proven
        np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
    assert registered_on(grpc_url) == before


def test_a_region_says_where_its_slots_live() -> None:
    layout = SlotLayout({"X": 0}, {"Y": 64}, {"in:X": 64, "out:Y": 64}, 4096)
    region = SharedMemoryRegion.create(new_region_name("m"), layout.region_bytes(2), slots=2)
    try:
        header = RegionHeader(region.buffer, 2)
        assert header.memory == "system"
        assert type(open_memory(region, layout, 2)) is SlotMemory
        header.set_memory("cuda")
        assert RegionHeader(region.buffer, 2).memory == "cuda"
    finally:
        region.unlink()
        region.close()
    # A GPU region's file holds only its header and the table of its slots.
    assert region_bytes("cuda", layout, 64) == region_bytes("cuda", layout, 1)
    assert region_bytes("cuda", layout, 1) <= REGION_HEADER_BYTES + 2**13


@pytest.mark.parametrize(
    "error",
    [
        CudaError("m", model="x", cuda_error="cudaErrorNoDevice", device="GPU-1"),
        GPUMemoryFullError("m", model="x", device="GPU-1", needed=10, free=2),
    ],
)
def test_gpu_errors_survive_pickle(error: Any) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == "m"
    assert again.__dict__ == error.__dict__
    if isinstance(error, GPUMemoryFullError):
        assert isinstance(again, MemoryError) and again.needed == 10 and again.free == 2


def test_bench_memory_cuda_runs_the_gpu_paths_on_the_gpu_cases() -> None:
    import argparse

    from ray_triton_shm._bench._config import (
        GPU_CASES,
        GPU_PATHS,
        add_arguments,
        config_from_args,
    )

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--memory", "cuda"]))
    assert config.memory == "cuda" and config.paths == GPU_PATHS
    assert config.models == tuple(GPU_CASES) and config.model_update_s == 0
    case = config.case("gpu-64MiB")
    assert case.model == "identity_gpu" and case.shapes == {"INPUT0": (2**24,)}
    assert config_from_args(parser.parse_args([])).memory == "system"


@no_gpu_only
def test_bench_memory_cuda_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from ray_triton_shm._cli import main

    options = ["--quick", "--no-plot", "--no-report", "--no-progress"]
    assert main(["bench", "--memory", "cuda", *options]) == 1
    error = capsys.readouterr().err
    assert "ray-triton-shm bench: error:" in error and "no NVIDIA driver was found" in error
    # Said before it runs, as long as GPU memory is a preview (tests/test_docs.py).
    assert error.startswith(f"note: {CUDA_PREVIEW}\n"), error
