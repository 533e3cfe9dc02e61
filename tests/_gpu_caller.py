"""A caller process of a GPU pool another process owns (tests/test_gpu.py), as a Ray worker
uses the node actor's regions, without Ray: it attaches the region, opens the owner's CUDA IPC
handles, takes slots through the region's locks and calls Triton itself.

    python tests/_gpu_caller.py URL REGION SLOTS ROWS CALLS SEED [DELAY_MS]

It checks every answer against its own input (``2 * x + 1``), alternating torch CUDA tensors
and NumPy arrays in, and prints one line: ``ok CALLS`` or what went wrong.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from ray_triton_shm import TritonSHMClient
from ray_triton_shm._client import registry_of
from ray_triton_shm._slots._specs import ModelSpec, TensorSpec

#: gpu_affine as the owner registers it in the tests (max_shapes INPUT0/OUTPUT0: (256,)).
SPEC = ModelSpec(
    name="gpu_affine",
    version="",
    inputs=(TensorSpec("INPUT0", (-1,), np.dtype(np.float32), (256,)),),
    outputs=(
        TensorSpec("OUTPUT0", (-1,), np.dtype(np.float32), (256,)),
        TensorSpec("ON_GPU", (1,), np.dtype(np.int32)),
    ),
    max_batch_size=8,
)


def main(argv: list[str]) -> int:
    url, region_name = argv[0], argv[1]
    slots, rows, calls, seed = (int(a) for a in argv[2:6])
    delay_ms = int(argv[6]) if len(argv) > 6 else 0
    client = TritonSHMClient(url=url, crash_cleanup=False)
    assert registry_of(client).attach_region(SPEC, region_name, slots, lambda: None)
    device = registry_of(client).get(SPEC.name).memory.device
    assert device is not None
    rng = np.random.default_rng(seed)
    parameters = {"delay_ms": delay_ms} if delay_ms else None
    for call in range(calls):
        x = rng.random((rows, 256), dtype=np.float32)
        given = torch.from_numpy(x).to(f"cuda:{device.index}") if call % 2 else x
        out = client.infer_shm("gpu_affine", {"INPUT0": given}, parameters=parameters)
        if not np.array_equal(out["OUTPUT0"], 2 * x + 1) or not out["ON_GPU"].all():
            print(f"wrong answer at call {call}", flush=True)
            return 1
        print(f"answered {call}", flush=True)
    client.close()
    print(f"ok {calls}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
