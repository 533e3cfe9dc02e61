"""Zero-copy Triton Inference Server inference through system shared memory, for Ray users.

The core (this package's top level) does not import Ray::

    from ray_triton_shm import TritonSHMClient

    client = TritonSHMClient(url="localhost:8001")
    client.register_shm_model("classifier", pool_size=4)
    outputs = client.infer_shm("classifier", {"INPUT0": images})
"""

from ._client import TritonSHMClient
from ._exceptions import (
    ClientClosedError,
    InvalidInputError,
    ModelNotRegisteredError,
    ModelSpecError,
    OverloadedError,
    SharedMemoryNotAllowedError,
    SlotTimeoutError,
    TritonServerError,
    TritonSHMError,
    UnsupportedDatatypeError,
)
from ._pool import PoolStats, SlotPool
from ._specs import ModelSpec, SlotLayout, TensorSpec

__version__ = "0.1.0"

__all__ = [
    "ClientClosedError",
    "InvalidInputError",
    "ModelNotRegisteredError",
    "ModelSpec",
    "ModelSpecError",
    "OverloadedError",
    "PoolStats",
    "SharedMemoryNotAllowedError",
    "SlotLayout",
    "SlotPool",
    "SlotTimeoutError",
    "TensorSpec",
    "TritonSHMClient",
    "TritonSHMError",
    "TritonServerError",
    "UnsupportedDatatypeError",
    "__version__",
]
