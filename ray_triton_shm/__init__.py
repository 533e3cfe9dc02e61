"""Zero-copy Triton Inference Server inference through system shared memory, for Ray users.

The core (this package's top level) does not import Ray::

    from ray_triton_shm import TritonSHMClient

    client = TritonSHMClient(url="localhost:8001")
    client.register_shm_model("classifier", pool_size=4)
    outputs = client.infer_shm("classifier", {"INPUT0": images})

Names are imported on first use, so ``import ray_triton_shm`` (and the command line's
``--help``) loads neither numpy nor gRPC.
"""

from __future__ import annotations

import importlib
import typing

from ._moved import install as _install_moved

__version__ = "0.1.0"

_install_moved(__name__)

#: Each public name, and the private module that defines it.
_EXPORTS = {
    "TritonSHMClient": "._client",
    "SlotLease": "._lease",
    "StreamResponse": "._inference._stream",
    "AccessDeniedError": "._exceptions",
    "ClientClosedError": "._exceptions",
    "CudaError": "._exceptions",
    "ForeignRegionError": "._exceptions",
    "GPUMemoryFullError": "._exceptions",
    "InvalidInputError": "._exceptions",
    "LeaseByValueError": "._exceptions",
    "LocalServerError": "._exceptions",
    "ModelChangedError": "._exceptions",
    "ModelNotLoadedError": "._exceptions",
    "ModelNotRegisteredError": "._exceptions",
    "ModelSpecError": "._exceptions",
    "OverloadedError": "._exceptions",
    "ServerUnreachableError": "._exceptions",
    "SharedMemoryFullError": "._exceptions",
    "SharedMemoryNotAllowedError": "._exceptions",
    "SharedMemoryUnreachableError": "._exceptions",
    "SlotTimeoutError": "._exceptions",
    "StreamInterruptedError": "._exceptions",
    "StreamingModelError": "._exceptions",
    "TLSHandshakeError": "._exceptions",
    "TritonServerError": "._exceptions",
    "TritonSHMError": "._exceptions",
    "CheckResult": "._tools._doctor_report",
    "NodeReport": "._tools._doctor_report",
    "check_node": "._tools._doctor",
    "Keys": "._wire._keys",
    "headers_from_dir": "._wire._keys",
    "headers_from_env": "._wire._keys",
    "TlsFiles": "._wire._tls",
    "PoolStats": "._slots._slot_pool",
    "SlotAutoscaling": "._slots._sizing",
    "NodeBatching": "._inference._node_batching",
    "ReclaimReport": "._pools._reclaim",
    "RegionStatus": "._tools._region_status",
    "StatusReport": "._tools._region_status",
    "reclaim_regions": "._pools._reclaim",
    "region_status": "._tools._region_status",
    "ModelSpec": "._slots._specs",
    "TensorSpec": "._slots._specs",
    "LocalTritonServer": ".local",
}

__all__ = [
    "AccessDeniedError",
    "CheckResult",
    "ClientClosedError",
    "CudaError",
    "ForeignRegionError",
    "GPUMemoryFullError",
    "InvalidInputError",
    "Keys",
    "LeaseByValueError",
    "LocalServerError",
    "LocalTritonServer",
    "ModelChangedError",
    "ModelNotLoadedError",
    "ModelNotRegisteredError",
    "ModelSpec",
    "ModelSpecError",
    "NodeBatching",
    "NodeReport",
    "OverloadedError",
    "PoolStats",
    "ReclaimReport",
    "RegionStatus",
    "ServerUnreachableError",
    "SharedMemoryFullError",
    "SharedMemoryNotAllowedError",
    "SharedMemoryUnreachableError",
    "SlotAutoscaling",
    "SlotLease",
    "SlotTimeoutError",
    "StreamInterruptedError",
    "StreamResponse",
    "StreamingModelError",
    "StatusReport",
    "TLSHandshakeError",
    "TensorSpec",
    "TlsFiles",
    "TritonSHMClient",
    "TritonSHMError",
    "TritonServerError",
    "__version__",
    "check_node",
    "headers_from_dir",
    "headers_from_env",
    "reclaim_regions",
    "region_status",
]


if typing.TYPE_CHECKING:  # what type checkers and IDEs see: the names, typed, and no others
    from ._client import TritonSHMClient
    from ._exceptions import (
        AccessDeniedError,
        ClientClosedError,
        CudaError,
        ForeignRegionError,
        GPUMemoryFullError,
        InvalidInputError,
        LeaseByValueError,
        LocalServerError,
        ModelChangedError,
        ModelNotLoadedError,
        ModelNotRegisteredError,
        ModelSpecError,
        OverloadedError,
        ServerUnreachableError,
        SharedMemoryFullError,
        SharedMemoryNotAllowedError,
        SharedMemoryUnreachableError,
        SlotTimeoutError,
        StreamingModelError,
        StreamInterruptedError,
        TLSHandshakeError,
        TritonServerError,
        TritonSHMError,
    )
    from ._inference._node_batching import NodeBatching
    from ._inference._stream import StreamResponse
    from ._lease import SlotLease
    from ._pools._reclaim import ReclaimReport, reclaim_regions
    from ._slots._sizing import SlotAutoscaling
    from ._slots._slot_pool import PoolStats
    from ._slots._specs import ModelSpec, TensorSpec
    from ._tools._doctor import check_node
    from ._tools._doctor_report import CheckResult, NodeReport
    from ._tools._region_status import RegionStatus, StatusReport, region_status
    from ._wire._keys import Keys, headers_from_dir, headers_from_env
    from ._wire._tls import TlsFiles
    from .local import LocalTritonServer
else:

    def __getattr__(name: str) -> typing.Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return list(__all__)
