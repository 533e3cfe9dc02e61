"""A plain tritonclient gRPC client set up as this node's callers are (TLS files, key files and
the environment's keys): what the tools (reclaim, status, the bench's baselines) talk to
Triton with."""

from __future__ import annotations

from typing import Any

from ._keys import Keys, KeysPlugin
from ._reconnect import channel_options
from ._tls import TlsFiles

__all__ = ["tritonclient_for"]


def tritonclient_for(url: str, *, aio: bool = False) -> Any:
    """A plain tritonclient gRPC client set up as this node's callers are: the TLS files of
    ``$RAY_TRITON_SHM_TLS_DIR``, the keys of the key files and the environment on every
    call, and a channel that tries to reconnect at least every second once Triton is back
    (gRPC's default backoff would fail calls for up to two minutes after a restart); for the
    tools: reclaim, status, bench's baselines.

    Args:
        url: Triton's gRPC address.
        aio: The asyncio client (``tritonclient.grpc.aio``).
    """
    if aio:
        import tritonclient.grpc.aio as module
    else:
        import tritonclient.grpc as module  # type: ignore[no-redef]
    files = TlsFiles.from_options({}, None)
    options: dict[str, Any] = {"channel_args": channel_options(None, None)}
    if files is not None:
        options["ssl"] = True
        for name in ("root_certificates", "private_key", "certificate_chain"):
            path = getattr(files, name)
            options[name] = None if path is None else str(path)
    client = module.InferenceServerClient(url, **options)
    client.register_plugin(KeysPlugin(Keys(environ=True)))
    return client
