"""An embedded Triton for demos, benchmarks and tests: the server, its environment, and the
example models.

    from ray_triton_shm.local import LocalTritonServer

    with LocalTritonServer() as server:          # the example model repository
        print(server.grpc_url)

The server side lives in its own environment (``tritonserver`` from ``nvidia-pytriton`` with
``numpy<2``), set up by ``ray-triton-shm setup-server``, by ``make``, or with ``install=True``.
"""

from ._config import EXAMPLE_MODEL_REPOSITORY, RESTRICTABLE_PROTOCOLS
from ._crashes import ServerCrash, ServerEvent
from ._install import TritonServerInstall, ensure_server_env, find_tritonserver
from ._log import KEPT_LOG_DIR
from ._server import LocalTritonServer

__all__ = [
    "EXAMPLE_MODEL_REPOSITORY",
    "KEPT_LOG_DIR",
    "RESTRICTABLE_PROTOCOLS",
    "LocalTritonServer",
    "ServerCrash",
    "ServerEvent",
    "TritonServerInstall",
    "ensure_server_env",
    "find_tritonserver",
]
