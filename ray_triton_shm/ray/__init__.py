"""The Ray layer: a node actor per node owns the regions; processes lease slots and call
Triton directly.

Importing this subpackage imports Ray (``pip install "ray-triton-shm[ray]"``)::

    from ray_triton_shm.ray import ShmModel

    model = ShmModel("classifier")               # picklable; binds lazily where it is used
    outputs = model.infer({"INPUT0": images})    # or: await model.infer_async(...)
"""

from .._exceptions import StaleLeaseError
from ._actor import (
    NAMESPACE,
    URL_ENV_VAR,
    ModelRegistration,
    NodeActorConfig,
    NodeStats,
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
    "StaleLeaseError",
    "TritonNodeActor",
    "actor_name",
    "get_node_actor",
]
