"""The request that points Triton at a slot, over Triton's HTTP endpoint: proven to be the same
Triton before use, exact answers on every path, Triton's refusals read as over gRPC, keys of
restricted APIs, and a Triton that restarts. Against real Tritons."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from _helpers import ADMIN, INFER, READ, local_triton, model_repository, our_regions, wait_for
from tritonclient.grpc import service_pb2

from ray_triton_shm import AccessDeniedError, TritonServerError, TritonSHMClient
from ray_triton_shm._defaults import HTTP_URL_ENV_VAR
from ray_triton_shm._tools._doctor import check_node
from ray_triton_shm._tools._doctor_report import CheckResult
from ray_triton_shm._wire._http import HttpRoute, http_body, http_headers
from ray_triton_shm._wire._plain_client import tritonclient_for
from ray_triton_shm.local._server import LocalTritonServer

IDENTITY = {"max_batch_size": 8, "max_shapes": {"INPUT0": (64,), "OUTPUT0": (64,)}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_embedded_triton_puts_http_where_clients_look(triton: LocalTritonServer) -> None:
    assert triton.http_port == triton.grpc_port - 1  # type: ignore[operator]


def test_requests_go_over_http_once_proven_and_every_answer_is_its_own(
    client: TritonSHMClient,
) -> None:
    client.register_shm_model("identity", pool_size=2, **IDENTITY)
    stats = client.shm_stats("identity")
    assert stats.protocol == "http", stats.protocol_reason
    assert "proven" in stats.protocol_reason
    rng = np.random.default_rng(0)
    # Shapes, sizes and request ids change between calls: each slot's JSON is written again.
    for index, (rows, width) in enumerate([(1, 16), (1, 16), (3, 8), (8, 64), (1, 16), (2, 1)]):
        x = rng.random((rows, width), dtype=np.float32)
        out = client.infer_shm("identity", {"INPUT0": x}, request_id=f"r{index % 2}")
        np.testing.assert_array_equal(out["OUTPUT0"], x)
    with client.lease("identity", batch=2, shapes={"INPUT0": (5,)}) as lease:
        lease.inputs["INPUT0"][...] = 7.0
        np.testing.assert_array_equal(lease.infer()["OUTPUT0"], np.full((2, 5), 7.0))

    async def many() -> None:
        batches = [rng.random((1 + i % 8, 16), dtype=np.float32) for i in range(40)]
        outs = await asyncio.gather(
            *(client.infer_shm_async("identity", {"INPUT0": b}) for b in batches)
        )
        for batch, out in zip(batches, outs, strict=True):
            np.testing.assert_array_equal(out["OUTPUT0"], batch)

    asyncio.run(many())
    assert client.shm_stats("identity").in_use == 0


def test_http_url_none_keeps_every_request_on_grpc(grpc_url: str) -> None:
    with TritonSHMClient(url=grpc_url, http_url=None) as client:
        client.register_shm_model("identity", pool_size=1, **IDENTITY)
        stats = client.shm_stats("identity")
        assert (stats.protocol, stats.protocol_reason) == ("grpc", "http_url=None")
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)


def _http_check(url: str) -> CheckResult:
    return next(c for c in check_node(url=url, timeout_s=5.0).checks if c.name == "http")


def test_an_endpoint_that_is_not_this_triton_is_never_used(
    triton: LocalTritonServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Triton whose HTTP port is not next to its gRPC port: "auto" finds nothing there and
    stays on gRPC (doctor says so, and what to do); the HTTP endpoint of another Triton is
    refused, saying why, and leaves no region behind; its own, given or in
    ``$RAY_TRITON_SHM_HTTP_URL``, is proven and used."""
    grpc_port = _free_port()
    http_port = next(p for p in iter(_free_port, None) if abs(p - grpc_port) > 1)
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    with local_triton(
        model_repository(tmp_path / "models", "identity"),
        grpc_port=grpc_port,
        http_port=http_port,
        log_path=tmp_path / "tritonserver.log",
    ) as server:
        with TritonSHMClient(url=server.grpc_url) as client:
            client.register_shm_model("identity", pool_size=1, **IDENTITY)
            stats = client.shm_stats("identity")
            assert stats.protocol == "grpc"
            assert f"no Triton HTTP endpoint at 127.0.0.1:{grpc_port - 1}" in stats.protocol_reason
            np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
        check = _http_check(server.grpc_url)
        assert (check.status, check.details["protocol"]) == ("warn", "grpc")
        assert HTTP_URL_ENV_VAR in check.fix

        with TritonSHMClient(url=server.grpc_url, http_url=triton.http_url) as client:
            with pytest.raises(TritonServerError, match="is not this Triton's HTTP endpoint"):
                client.register_shm_model("identity", pool_size=1, **IDENTITY)
            assert client.registered_models == {}
        assert our_regions(os.getpid()) == set()

        with TritonSHMClient(url=server.grpc_url, http_url=server.http_url) as client:
            client.register_shm_model("identity", pool_size=1, **IDENTITY)
            assert client.shm_stats("identity").protocol == "http"
            np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)

        monkeypatch.setenv(HTTP_URL_ENV_VAR, server.http_url)
        with TritonSHMClient(url=server.grpc_url) as client:
            client.register_shm_model("identity", pool_size=1, **IDENTITY)
            assert client.shm_stats("identity").protocol == "http"
        assert _http_check(server.grpc_url).status == "ok"
    assert our_regions(os.getpid()) == set()


def test_a_restarted_triton_is_reached_again_over_http(
    fresh_triton: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> None:
    """The keep-alive connections die with Triton: the next request waits for it, registers
    the region again and goes on, over HTTP still, with exact answers."""
    client = make_client(fresh_triton.grpc_url, reconnect_timeout_s=60)
    client.register_shm_model("identity", pool_size=2, **IDENTITY)
    assert client.shm_stats("identity").protocol == "http"
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
    fresh_triton.restart()
    for step in range(5):
        y = x + step
        np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": y})["OUTPUT0"], y)
    assert client.shm_stats("identity").protocol == "http"
    assert client.shm_stats("identity").in_use == 0


def test_restricted_apis_take_the_same_keys_over_http(
    restricted: LocalTritonServer, keys: dict[str, str]
) -> None:
    """Triton names a restricted API's key ``<key>`` over HTTP and ``triton-grpc-protocol-
    <key>`` over gRPC: the client's keys (gRPC's names) reach both, and a refusal names the
    key as the client knows it."""
    with TritonSHMClient(url=restricted.grpc_url, headers=keys) as client:
        client.register_shm_model("identity", pool_size=1, **IDENTITY)
        assert client.shm_stats("identity").protocol == "http"
        x = np.ones((1, 16), np.float32)
        np.testing.assert_array_equal(client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"], x)
        with pytest.raises(AccessDeniedError) as refused:
            client.infer_shm("identity", {"INPUT0": x}, headers={INFER: "wrong"})
        assert refused.value.header == INFER
        assert keys[INFER] not in str(refused.value)
        assert client.shm_stats("identity").in_use == 0
    assert {ADMIN, READ} <= set(keys)


def _identity_request(region: str, datatype: str = "FP32") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity")
    entry = request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 16])
    entry.parameters["shared_memory_region"].string_param = region
    entry.parameters["shared_memory_offset"].int64_param = 0
    entry.parameters["shared_memory_byte_size"].int64_param = 64
    return request


@pytest.mark.parametrize(
    "request_",
    [
        service_pb2.ModelInferRequest(model_name="nosuch"),
        _identity_request("nosuch-region"),
        service_pb2.ModelInferRequest(model_name="identity"),
    ],
    ids=["unknown model", "unknown region", "no inputs"],
)
def test_tritons_refusals_read_the_same_over_both_protocols(
    triton: LocalTritonServer, request_: service_pb2.ModelInferRequest
) -> None:
    """Triton's refusal of one request, over HTTP (status mapped to gRPC's code) and gRPC."""
    plain = tritonclient_for(triton.grpc_url)
    try:
        with pytest.raises(grpc.RpcError) as over_grpc:
            plain._client_stub.ModelInfer(request_)
    finally:
        plain.close()
    route = HttpRoute(triton.http_url)
    try:
        body = http_body(request_)
        assert body is not None
        path = f"/v2/models/{request_.model_name}/infer".encode()
        response = route.exchange(path, body, http_headers(()))
        with pytest.raises(grpc.RpcError) as over_http:
            response.answer()
    finally:
        route.close()
    assert over_http.value.code() == over_grpc.value.code()
    assert over_http.value.answered is True  # type: ignore[attr-defined]
    grpc_words = over_grpc.value.details().split(":")[0]
    assert over_http.value.details().startswith(grpc_words)


def test_a_request_given_up_frees_its_slot_once_answered_even_after_a_collection(
    fresh_triton: LocalTritonServer,
    make_client: Callable[..., TritonSHMClient],
) -> None:
    """A request over HTTP whose caller's deadline passed is held by nobody but its own task
    (an event loop holds its tasks weakly): it must still read Triton's answer, however the
    garbage collector runs meanwhile, and free its slot."""
    client = make_client(fresh_triton.grpc_url)
    client.register_shm_model("delay_echo", pool_size=2, max_shapes={"DATA": (8,), "ECHO": (8,)})
    assert client.shm_stats("delay_echo").protocol == "http"
    slow = {"DELAY_MS": np.array([300], np.int32), "DATA": np.ones(8, np.float32)}

    async def give_up() -> list[str]:
        calls = [
            client.infer_shm_async("delay_echo", slow, client_timeout_s=0.05) for _ in range(2)
        ]
        # Only the names: the errors' tracebacks would hold the requests alive.
        return [type(r).__name__ for r in await asyncio.gather(*calls, return_exceptions=True)]

    async def give_up_then_wait() -> None:
        assert await give_up() == ["TritonServerError"] * 2
        for _ in range(3):  # turns of the loop, no time: it lets go of the callers' tasks
            await asyncio.sleep(0)
        gc.collect()
        await asyncio.to_thread(
            wait_for,
            lambda: client.shm_stats("delay_echo").in_use == 0,
            timeout_s=5,
            what="both slots back once Triton answered",
        )

    asyncio.run(give_up_then_wait())
    assert client.shm_stats("delay_echo").in_use == 0
    quick = {"DELAY_MS": np.array([0], np.int32), "DATA": np.arange(8, dtype=np.float32)}
    np.testing.assert_array_equal(
        client.infer_shm("delay_echo", quick, slot_timeout_s=5)["ECHO"], quick["DATA"]
    )
