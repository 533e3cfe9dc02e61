"""Pools in GPU memory on a real GPU, against a real Triton on it (``-m gpu``).

Skipped where there is no GPU, torch or cupy, saying which. They need no Ray. On a machine with
an NVIDIA GPU and its driver, this installs what they need (torch and cupy, the ``[cuda]``
extra, torch in the server environment for the model) and runs them::

    make test-gpu

Until every one of them has passed on a GPU, GPU memory is a preview (tests/test_docs.py).

The model, ``tests/gpu_models/gpu_affine``, answers ``2 * x + 1`` computed with torch on the GPU,
and says whether its input reached it in GPU memory.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import local_triton, runs_in_triton, wait_for

from ray_triton_shm import CudaError, GPUMemoryFullError, TritonSHMClient
from ray_triton_shm._client import registry_of
from ray_triton_shm._slots import _cuda
from ray_triton_shm._slots._memory import CudaMemory
from ray_triton_shm._slots._shm import list_local_regions
from ray_triton_shm.local import LocalTritonServer

GPU_MODELS = Path(__file__).resolve().parent / "gpu_models"
SHAPES = {"INPUT0": (256,), "OUTPUT0": (256,)}
CALLER = Path(__file__).resolve().parent / "_gpu_caller.py"


def _missing() -> str | None:
    try:
        if not _cuda._visible():
            return "no GPU is visible"
    except CudaError as exc:
        return str(exc)
    for module in ("torch", "cupy"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed"
    return None


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_missing() is not None, reason=f"needs a GPU: {_missing()}"),
]


@pytest.fixture(scope="module")
def gpu_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    log = tmp_path_factory.mktemp("gpu-triton") / "tritonserver.log"
    with local_triton(
        GPU_MODELS, log_path=log, extra_args=["--cuda-memory-pool-byte-size=0:268435456"]
    ) as server:
        yield server


@pytest.fixture
def client(gpu_triton: LocalTritonServer) -> Iterator[TritonSHMClient]:
    with TritonSHMClient(url=gpu_triton.grpc_url) as client:
        client.register_shm_model("gpu_affine", pool_size=2, max_shapes=SHAPES, memory="cuda")
        yield client
    assert _registered(gpu_triton.grpc_url) == set()


def _registered(url: str) -> set[str]:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as plain:
        cuda = plain.get_cuda_shared_memory_status(as_json=True).get("regions", {})
        system = plain.get_system_shared_memory_status(as_json=True).get("regions", {})
    return {*cuda, *system}


def _expected(x: np.ndarray) -> np.ndarray:
    return 2 * x + 1


def _host(value: Any) -> np.ndarray:
    if hasattr(value, "get"):  # cupy
        return value.get()  # type: ignore[no-any-return]
    if hasattr(value, "cpu"):  # torch
        return value.cpu().numpy()  # type: ignore[no-any-return]
    return np.asarray(value)


@pytest.mark.parametrize("given", ["numpy", "torch", "cupy"])
@pytest.mark.parametrize("outputs_as", ["numpy", "torch", "cupy"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_exact_answers_in_and_out_of_gpu_memory_with_chunking(
    client: TritonSHMClient, given: str, outputs_as: str, mode: str
) -> None:
    import cupy
    import torch

    x = np.random.default_rng(7).random((21, 256), dtype=np.float32)  # 3 chunks of <= 8
    inputs: Any = {
        "numpy": x,
        "torch": torch.from_numpy(x).cuda(),
        "cupy": cupy.asarray(x),
    }[given]

    async def infer_async() -> dict[str, Any]:
        return await client.infer_shm_async("gpu_affine", {"INPUT0": inputs}, outputs_as=outputs_as)

    if mode == "async":
        out = asyncio.run(infer_async())
    else:
        out = client.infer_shm("gpu_affine", {"INPUT0": inputs}, outputs_as=outputs_as)
    kind = {"numpy": np.ndarray, "torch": torch.Tensor, "cupy": cupy.ndarray}[outputs_as]
    assert isinstance(out["OUTPUT0"], kind)
    if outputs_as != "numpy":
        device = out["OUTPUT0"].device
        assert getattr(device, "type", "cuda") == "cuda"
    np.testing.assert_array_equal(_host(out["OUTPUT0"]), _expected(x))
    assert _host(out["ON_GPU"]).all(), "the model did not get its input in GPU memory"
    stats = client.shm_stats("gpu_affine")
    assert stats.in_use == 0 and stats.abandoned == 0


def test_bad_gpu_input_is_refused_before_any_byte(client: TritonSHMClient) -> None:
    import torch

    from ray_triton_shm import InvalidInputError

    x = torch.ones((2, 256), dtype=torch.float64, device="cuda")
    with pytest.raises(InvalidInputError, match="must have dtype float32"):
        client.infer_shm("gpu_affine", {"INPUT0": x})
    with pytest.raises(InvalidInputError, match="not C-contiguous"):
        client.infer_shm("gpu_affine", {"INPUT0": torch.ones((256, 2), device="cuda").T})
    with pytest.raises(InvalidInputError, match="must have shape"):
        client.infer_shm("gpu_affine", {"INPUT0": torch.ones((2, 300), device="cuda")})
    stats = client.shm_stats("gpu_affine")
    assert stats.in_use == 0


def _share(client: TritonSHMClient) -> None:
    """Makes the client's new pools shared with other processes, as the node actor does."""
    registry_of(client).share_slots(max_waiting=64)


def _caller(url: str, region: str, *args: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(CALLER), url, region, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_callers_in_other_processes_open_the_owners_gpu_memory(
    gpu_triton: LocalTritonServer,
) -> None:
    url = gpu_triton.grpc_url
    with TritonSHMClient(url=url) as owner:
        _share(owner)
        owner.register_shm_model("gpu_affine", pool_size=3, max_shapes=SHAPES, memory="cuda")
        region = registry_of(owner).get("gpu_affine").region.name
        callers = [
            _caller(url, region, 3, rows, 40, seed) for seed, rows in enumerate((1, 5, 8, 13))
        ]
        for caller in callers:
            out, err = caller.communicate(timeout=300)
            assert caller.returncode == 0, err
            assert out.strip().endswith("ok 40"), out
        pool = registry_of(owner).get("gpu_affine")
        assert pool.header.totals().requests >= 4 * 40
    assert _registered(url) == set()


def test_a_caller_killed_mid_request_leaves_its_slot_out_until_triton_is_done(
    gpu_triton: LocalTritonServer,
) -> None:
    url = gpu_triton.grpc_url
    with TritonSHMClient(url=url) as owner:
        _share(owner)
        owner.register_shm_model("gpu_affine", pool_size=1, max_shapes=SHAPES, memory="cuda")
        pool = registry_of(owner).get("gpu_affine")
        with runs_in_triton(gpu_triton, "gpu_affine") as runs:
            victim = _caller(url, pool.region.name, 1, 4, 1, 0, 1500)  # a 1.5 s request

            def running() -> int:
                assert victim.poll() is None, victim.communicate()[1]
                return runs()

            wait_for(running, timeout_s=60, what="the victim's request running in Triton")
        assert pool.header.busy_since(0)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        # The next caller waits for Triton to finish the dead caller's request, then gets
        # the slot, and its own answer.
        started = time.monotonic()
        after = _caller(url, pool.region.name, 1, 8, 6, 1)
        out, err = after.communicate(timeout=120)
        assert after.returncode == 0, err
        assert out.strip().endswith("ok 6"), out
        assert pool.header.totals().abandoned == 1
        assert pool.header.abandoned_slots() == []
        assert time.monotonic() - started < 30


def test_a_triton_restart_registers_gpu_memory_again(tmp_path: Path) -> None:
    with local_triton(
        GPU_MODELS,
        log_path=tmp_path / "tritonserver.log",
        extra_args=["--cuda-memory-pool-byte-size=0:268435456"],
    ) as server:
        with TritonSHMClient(url=server.grpc_url, reconnect_timeout_s=120) as client:
            client.register_shm_model("gpu_affine", pool_size=2, max_shapes=SHAPES, memory="cuda")
            x = np.arange(4 * 256, dtype=np.float32).reshape(4, 256)
            np.testing.assert_array_equal(
                client.infer_shm("gpu_affine", {"INPUT0": x})["OUTPUT0"], _expected(x)
            )
            server.restart()
            for _ in range(3):
                out = client.infer_shm("gpu_affine", {"INPUT0": x})["OUTPUT0"]
                np.testing.assert_array_equal(out, _expected(x))
            assert len(_registered(server.grpc_url)) == 2  # both slots, registered again
        assert _registered(server.grpc_url) == set()


def _free_gpu_bytes() -> int:
    device = _cuda.find_device(0)
    return _cuda.memory_info(device)[0]


def test_gpu_memory_comes_back_after_close(gpu_triton: LocalTritonServer) -> None:
    big = {"INPUT0": (2**21,), "OUTPUT0": (2**21,)}  # 8 samples x 8 MiB x 2: 128 MiB a slot
    before = _free_gpu_bytes()
    client = TritonSHMClient(url=gpu_triton.grpc_url)
    client.register_shm_model("gpu_affine", pool_size=4, max_shapes=big, memory="cuda")
    during = _free_gpu_bytes()
    assert before - during >= 4 * 128 * 2**20
    client.infer_shm("gpu_affine", {"INPUT0": np.ones((8, 2**21), np.float32)})
    client.close()
    after = _free_gpu_bytes()
    assert after >= before - 16 * 2**20, (before, during, after)
    assert _registered(gpu_triton.grpc_url) == set()
    assert [r for r in list_local_regions() if r.owner.pid == os.getpid()] == []


def test_a_sigkilled_owners_registrations_are_taken_back(gpu_triton: LocalTritonServer) -> None:
    url = gpu_triton.grpc_url
    before = _free_gpu_bytes()
    script = (
        "import os, signal\n"
        "from ray_triton_shm import TritonSHMClient\n"
        "from ray_triton_shm._client import registry_of\n"
        f"c = TritonSHMClient(url={url!r})\n"
        f"c.register_shm_model('gpu_affine', pool_size=2, max_shapes={SHAPES!r}, memory='cuda')\n"
        "print(registry_of(c).get('gpu_affine').region.name, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    region = done.stdout.strip()
    wait_for(
        lambda: not any(name.startswith(region) for name in _registered(url)),
        timeout_s=30,
        what="the watchdog to take the registrations back",
    )
    assert region not in {r.name for r in list_local_regions()}
    wait_for(
        lambda: _free_gpu_bytes() >= before - 16 * 2**20,
        timeout_s=10,
        what=lambda: f"the GPU memory back ({before} bytes free before, {_free_gpu_bytes()} now)",
    )


def test_a_caller_that_does_not_see_the_gpu_says_which(gpu_triton: LocalTritonServer) -> None:
    with TritonSHMClient(url=gpu_triton.grpc_url) as owner:
        _share(owner)
        owner.register_shm_model("gpu_affine", pool_size=1, max_shapes=SHAPES, memory="cuda")
        memory = registry_of(owner).get("gpu_affine").memory
        assert isinstance(memory, CudaMemory)
        caller = subprocess.run(
            [
                sys.executable,
                str(CALLER),
                gpu_triton.grpc_url,
                memory.region.name,
                "1",
                "1",
                "1",
                "0",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    assert caller.returncode != 0
    assert "CUDA_VISIBLE_DEVICES=''" in caller.stderr, caller.stderr
    assert "no GPU" in caller.stderr or memory.device.uuid in caller.stderr, caller.stderr


def test_a_pool_too_large_for_the_gpu_leaves_nothing(gpu_triton: LocalTritonServer) -> None:
    free = _free_gpu_bytes()
    samples = free // 8 // 4  # one slot of 8 inputs and 8 outputs: about twice what is free
    huge = {"INPUT0": (samples,), "OUTPUT0": (samples,)}
    with TritonSHMClient(url=gpu_triton.grpc_url) as client:
        with pytest.raises(GPUMemoryFullError, match="smaller pool_size") as caught:
            client.register_shm_model("gpu_affine", pool_size=2, max_shapes=huge, memory="cuda")
        assert caught.value.needed > caught.value.free
        assert client.registered_models == {}
    assert _registered(gpu_triton.grpc_url) == set()
    assert [r for r in list_local_regions() if r.owner.pid == os.getpid()] == []
    assert _free_gpu_bytes() >= free - 16 * 2**20
