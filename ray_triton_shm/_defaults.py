"""Defaults that appear in signatures and in the command line's help.

A leaf module, importing nothing: the command line shows these without loading numpy or gRPC.
"""

from __future__ import annotations

__all__ = ["DEFAULT_RECONNECT_TIMEOUT_S", "DEFAULT_URL", "HTTP_URL_ENV_VAR", "URL_ENV_VAR"]

#: Triton's gRPC address when none is given (or found in ``$RAY_TRITON_SHM_URL`` on a node).
DEFAULT_URL = "localhost:8001"

#: The environment variable with Triton's gRPC address on a node (read on that node).
URL_ENV_VAR = "RAY_TRITON_SHM_URL"

#: The environment variable with Triton's HTTP address, where it is not next below the gRPC
#: port (``http_url="auto"`` reads it; the requests use it once it proves to be that Triton).
HTTP_URL_ENV_VAR = "RAY_TRITON_SHM_HTTP_URL"

#: How long a request waits for an unreachable Triton by default.
DEFAULT_RECONNECT_TIMEOUT_S = 60.0
