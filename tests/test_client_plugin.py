"""tritonclient's plugin on a ``TritonSHMClient``: the client's keys reach tritonclient's own
calls through tritonclient's public plugin hook, and a caller's plugin still registers,
unregisters and sees every call's headers, the client's keys among them."""

from __future__ import annotations

from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from ray_triton_shm import TritonSHMClient
from ray_triton_shm.local import LocalTritonServer

KEY = "triton-grpc-protocol-read-key"


def test_a_callers_plugin_sees_the_keys_and_the_calls_headers(triton: LocalTritonServer) -> None:
    seen: list[dict[str, str]] = []

    def plugin(request: Any) -> None:
        seen.append(dict(request.headers))
        request.headers["x-plugin"] = "1"

    with TritonSHMClient(triton.grpc_url, headers={KEY: "k"}) as client:
        assert client.plugin() is None
        assert client.is_server_live(headers={"x-call": "c"})  # keys, without a plugin
        client.register_plugin(plugin)
        assert client.plugin() is plugin
        with pytest.raises(InferenceServerException, match="already registered"):
            client.register_plugin(plugin)
        assert client.is_server_live(headers={"x-call": "c"})
        assert seen == [{KEY: "k", "x-call": "c"}]
        client.unregister_plugin()
        assert client.plugin() is None
        with pytest.raises(InferenceServerException, match="No plugin"):
            client.unregister_plugin()
        assert client.is_server_ready()
        assert len(seen) == 1


def test_tritonclients_own_calls_show_no_key(
    triton: LocalTritonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """In verbose mode tritonclient prints each call's headers: the keys' values stay out."""
    with TritonSHMClient(triton.grpc_url, verbose=True, headers={KEY: "s3cret-value"}) as client:
        assert client.is_server_live()
    printed = capsys.readouterr().out
    assert KEY in printed and "s3cret-value" not in printed
