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
    LocalServerError,
    ModelNotRegisteredError,
    ModelSpecError,
    OverloadedError,
    ServerUnreachableError,
    SharedMemoryFullError,
    SharedMemoryNotAllowedError,
    SlotTimeoutError,
    TritonServerError,
    TritonSHMError,
)
from ._pool import PoolStats
from ._reclaim import ReclaimReport, RegionStatus, StatusReport, reclaim, status
from ._specs import ModelSpec, TensorSpec
from .local import LocalTritonServer

__version__ = "0.1.0"

__all__ = [
    "ClientClosedError",
    "InvalidInputError",
    "LocalServerError",
    "LocalTritonServer",
    "ModelNotRegisteredError",
    "ModelSpec",
    "ModelSpecError",
    "OverloadedError",
    "PoolStats",
    "ReclaimReport",
    "RegionStatus",
    "ServerUnreachableError",
    "SharedMemoryFullError",
    "SharedMemoryNotAllowedError",
    "SlotTimeoutError",
    "StatusReport",
    "TensorSpec",
    "TritonSHMClient",
    "TritonSHMError",
    "TritonServerError",
    "__version__",
    "reclaim",
    "status",
]
