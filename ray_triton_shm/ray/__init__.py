"""The Ray layer: one node-local actor owns the shm pools; Serve and Ray Data call it.

Importing this subpackage imports Ray (``pip install "ray-triton-shm[ray]"``)::

    from ray_triton_shm.ray import ShmModel

    model = ShmModel("classifier")               # picklable; binds lazily where it is used
    outputs = model.infer({"INPUT0": images})    # or: await model.infer_async(...)
"""

from ._actor import (
    NAMESPACE,
    URL_ENV_VAR,
    ModelRegistration,
    NodeActorConfig,
    NodeStats,
    SlotClaim,
    StaleClaimError,
    TritonNodeActor,
    actor_name,
    get_node_actor,
)
from ._data import ShmPredictor
from ._handle import ShmModel

__all__ = [
    "NAMESPACE",
    "URL_ENV_VAR",
    "ModelRegistration",
    "NodeActorConfig",
    "NodeStats",
    "ShmModel",
    "ShmPredictor",
    "SlotClaim",
    "StaleClaimError",
    "TritonNodeActor",
    "actor_name",
    "get_node_actor",
]
