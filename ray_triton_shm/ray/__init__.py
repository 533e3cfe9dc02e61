"""The Ray layer: a node actor per node owns the regions; processes take their slots through
the regions and call Triton directly.

Importing this subpackage imports Ray (``pip install "ray-triton-shm[ray]"``)::

    from ray_triton_shm.ray import ShmModel

    model = ShmModel("classifier")               # picklable; binds lazily where it is used
    outputs = model.infer({"INPUT0": images})    # or: await model.infer_async(...)
"""

from typing import Any as _Any

from .._exceptions import BlockingCallError, RegionReplacedError
from .._exceptions import deprecated_name as _deprecated_name
from ._actor import URL_ENV_VAR, NodeStats, TritonNodeActor, get_node_actor
from ._dashboard import grafana_dashboard, install_grafana_dashboard
from ._data import ShmPredictor
from ._doctor import check_cluster
from ._handle import ShmModel

__all__ = [
    "BlockingCallError",
    "URL_ENV_VAR",
    "NodeStats",
    "RegionReplacedError",
    "ShmModel",
    "ShmPredictor",
    "TritonNodeActor",
    "check_cluster",
    "get_node_actor",
    "grafana_dashboard",
    "install_grafana_dashboard",
]


def __getattr__(name: str) -> _Any:
    return _deprecated_name(__name__, name)
