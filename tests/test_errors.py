"""Bad input and server errors: clear messages, nothing written to shared memory, slots free."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from ray_triton_shm import (
    AccessDeniedError,
    ClientClosedError,
    InvalidInputError,
    ModelNotRegisteredError,
    ModelSpecError,
    OverloadedError,
    ServerUnreachableError,
    SharedMemoryFullError,
    SharedMemoryNotAllowedError,
    SlotTimeoutError,
    TritonServerError,
    TritonSHMClient,
    TritonSHMError,
)
from ray_triton_shm._client import registry_of
from ray_triton_shm._exceptions import RegionReplacedError
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES
from ray_triton_shm._wire._triton_errors import translate_error

GOOD = {
    "INPUT0": np.zeros((2, 3, 224, 224), np.float32),
    "INPUT1": np.zeros((2, 10), np.int32),
}


@pytest.fixture
def client(client: TritonSHMClient) -> TritonSHMClient:
    """conftest's client, with ``my_model`` on 2 slots."""
    client.register_shm_model("my_model", pool_size=2)
    return client


def region_bytes(client: TritonSHMClient) -> bytes:
    return bytes(registry_of(client).get("my_model").region.buffer[REGION_HEADER_BYTES:])


def with_input(name: str, value: Any) -> dict[str, Any]:
    return {**GOOD, name: value}


BAD_INPUTS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("missing input", lambda: {"INPUT0": GOOD["INPUT0"]}, InvalidInputError,
     r"my_model.*missing input 'INPUT1'"),
    ("unexpected input", lambda: with_input("EXTRA", np.zeros((2, 1))), InvalidInputError,
     r"my_model.*unexpected input 'EXTRA'"),
    ("wrong dtype", lambda: with_input("INPUT1", np.zeros((2, 10), np.int64)), InvalidInputError,
     r"my_model.*'INPUT1'.*int32.*got int64"),
    ("big-endian dtype", lambda: with_input("INPUT1", np.zeros((2, 10), ">i4")),
     InvalidInputError, r"'INPUT1'.*int32.*got >i4"),
    ("wrong sample shape", lambda: with_input("INPUT0", np.zeros((2, 3, 224, 225), np.float32)),
     InvalidInputError, r"'INPUT0'.*\(batch, 3, 224, 224\).*\(2, 3, 224, 225\)"),
    ("missing batch dim", lambda: with_input("INPUT1", np.zeros(10, np.int32)),
     InvalidInputError, r"'INPUT1'.*\(batch, 10\).*\(10,\)"),
    ("different batch lengths", lambda: with_input("INPUT1", np.zeros((3, 10), np.int32)),
     InvalidInputError, r"different batch lengths.*'INPUT0'.*2.*'INPUT1'.*3"),
    ("not an array", lambda: with_input("INPUT1", [[1] * 10, [2] * 10]), InvalidInputError,
     r"'INPUT1'.*numpy array.*got list"),
    ("not an array at all", lambda: with_input("INPUT1", "hello"), InvalidInputError,
     r"'INPUT1'.*numpy array.*got str"),
    ("bad sample in a list",
     lambda: with_input("INPUT1", [np.zeros(10, np.int32), np.zeros(9, np.int32)]),
     InvalidInputError, r"'INPUT1'.*\(10,\).*\(9,\)"),
    ("not a mapping", lambda: [GOOD["INPUT0"], GOOD["INPUT1"]], InvalidInputError,
     r"mapping.*got list"),
    ("strings into a numeric tensor", lambda: with_input("INPUT1", np.array([["a"] * 10] * 2)),
     InvalidInputError, r"'INPUT1'.*int32.*got <U1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "make", "error", "pattern"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_is_refused_before_anything_is_written(
    client: TritonSHMClient,
    case: str,
    make: Callable[[], Any],
    error: type[Exception],
    pattern: str,
) -> None:
    client.infer_shm("my_model", GOOD)
    pool = registry_of(client).get("my_model")
    # A sentinel every write into the slots would disturb (the header holds live state).
    pool.region.buffer[REGION_HEADER_BYTES:] = b"\xab" * (pool.region.size - REGION_HEADER_BYTES)
    before = region_bytes(client)
    with pytest.raises(error, match=pattern) as info:
        client.infer_shm("my_model", make())
    assert isinstance(info.value, ValueError)
    assert info.value.model == "my_model"
    assert region_bytes(client) == before, f"{case}: bytes were written to shared memory"
    assert client.shm_stats("my_model").in_use == 0
    out = client.infer_shm("my_model", GOOD)  # and the client still works
    assert out["OUTPUT0"].shape == (2, 512)


def test_bad_input_async(client: TritonSHMClient) -> None:
    with pytest.raises(InvalidInputError, match="INPUT1"):
        asyncio.run(client.infer_shm_async("my_model", with_input("INPUT1", np.zeros((2, 10)))))
    assert client.shm_stats("my_model").in_use == 0


def test_unregistered_model(client: TritonSHMClient) -> None:
    with pytest.raises(ModelNotRegisteredError, match=r"'classifier'.*register_shm_model") as info:
        client.infer_shm("classifier", {"INPUT0": np.zeros((1, 3, 224, 224), np.float32)})
    assert isinstance(info.value, LookupError)


def test_a_bytes_tensor_needs_max_element_bytes(client: TritonSHMClient) -> None:
    with pytest.raises(ModelSpecError, match=r"'INPUT0'.*'strings'.*max_element_bytes=") as info:
        client.register_shm_model("strings")
    assert info.value.tensor == "INPUT0"
    with pytest.raises(ModelSpecError, match=r"'OUTPUT0'.*max_element_bytes"):
        client.register_shm_model(
            "strings",
            inputs=[("INPUT0", (1,), np.bytes_)],
            outputs=[("OUTPUT0", (1,), "BYTES")],
            max_batch_size=8,
            max_element_bytes={"INPUT0": 16},
        )
    with pytest.raises(ModelSpecError, match=r"\['INPUT1'\], which are not BYTES"):
        client.register_shm_model("my_model", max_element_bytes={"INPUT1": 16})
    assert "strings" not in client.registered_models


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"inputs": [("INPUT0", (3,))]}, r"\(name, shape_without_batch, dtype\)"),
        ({"inputs": [("INPUT0", (3,), "complex")]}, r"'INPUT0'.*not a dtype|no Triton datatype"),
        ({"inputs": [("A", (1,), np.float32), ("A", (1,), np.float32)]}, "more than once"),
        ({"max_shapes": {"NOPE": (1,)}}, r"unknown tensors \['NOPE'\]"),
        ({"max_shapes": {"INPUT0": (3, 224)}}, r"'INPUT0'.*does not fit"),
        ({"pool_size": 0}, "pool_size must be >= 1"),
        ({"max_batch_size": -1}, "max_batch_size must be >= 0"),
    ],
)
def test_bad_specs(client: TritonSHMClient, kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ModelSpecError, match=pattern):
        client.register_shm_model("classifier", **kwargs)
    assert "classifier" not in client.registered_models


def test_triton_errors_keep_status_and_message_and_free_slots(client: TritonSHMClient) -> None:
    client.register_shm_model(
        "fail_on_negative", pool_size=2, max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)}
    )
    bad = np.ones((20, 4), np.float32)
    bad[13, 2] = -1  # in the second of three chunks
    with pytest.raises(TritonServerError, match="negative input") as info:
        client.infer_shm("fail_on_negative", {"INPUT0": bad})
    assert info.value.status and "negative input" in info.value.server_message
    assert info.value.model == "fail_on_negative"
    assert isinstance(info.value.__cause__, grpc.RpcError)
    stats = client.shm_stats("fail_on_negative")
    assert (stats.in_use, stats.waiting) == (0, 0)
    good = np.abs(bad)
    out = client.infer_shm("fail_on_negative", {"INPUT0": good})["OUTPUT0"]
    np.testing.assert_array_equal(out, good)


def test_triton_error_async(client: TritonSHMClient) -> None:
    client.register_shm_model(
        "fail_on_negative", pool_size=2, max_shapes={"INPUT0": (4,), "OUTPUT0": (4,)}
    )
    with pytest.raises(TritonServerError, match="negative input"):
        asyncio.run(
            client.infer_shm_async("fail_on_negative", {"INPUT0": -np.ones((20, 4), np.float32)})
        )
    assert client.shm_stats("fail_on_negative").in_use == 0


def test_refused_client_shm_says_how_to_allow_it() -> None:
    # Triton 2.51 (the embedded server) has no such switch, so this refusal is the one thing
    # no real server here can produce: a tritonclient error as newer releases word it.
    refusal = InferenceServerException(
        msg="System shared memory is not allowed; start the server with --allow-client-shm=true",
        status="StatusCode.UNAVAILABLE",
    )
    error = translate_error(refusal, model="m", action="registering shared memory")
    assert isinstance(error, SharedMemoryNotAllowedError)
    assert "--allow-client-shm=true" in str(error) and error.status == "StatusCode.UNAVAILABLE"
    plain = translate_error(InferenceServerException(msg="boom", status="StatusCode.INTERNAL"))
    assert type(plain) is TritonServerError and plain.server_message == "boom"


ALL_ERRORS = [
    InvalidInputError("m", model="x", tensor="t", expected=1, actual=2),
    ModelSpecError("m", model="x", tensor="t"),
    ModelNotRegisteredError("m", model="x"),
    SlotTimeoutError("m", model="x", timeout_s=0.5),
    OverloadedError("m", model="x"),
    RegionReplacedError("m", model="x", incarnation="abc"),
    ClientClosedError("m"),
    TritonServerError("m", status="StatusCode.INTERNAL", server_message="s", model="x"),
    SharedMemoryNotAllowedError("m", status="StatusCode.UNAVAILABLE", server_message="s"),
    ServerUnreachableError("m", url="h:1", waited_s=1.5, status="StatusCode.UNAVAILABLE"),
    AccessDeniedError(
        "m", header="triton-grpc-protocol-admin-key", status="StatusCode.UNAVAILABLE", model="x"
    ),
    SharedMemoryFullError("m", model="x", needed=10, free=1),
]


@pytest.mark.parametrize("error", ALL_ERRORS, ids=lambda e: type(e).__name__)
def test_every_exception_survives_pickle(error: TritonSHMError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__
    assert isinstance(copy, TritonSHMError)
    if isinstance(error, OSError):
        assert copy.errno == error.errno


def test_failed_calls_are_counted_by_kind_and_answers_by_latency(client: TritonSHMClient) -> None:
    """What the metrics export: every failed call counted once under its kind (a bad input
    before any slot, a deadline while Triton runs the request), every answered request in
    the latency and wait histograms."""
    client.register_shm_model("delay_echo", pool_size=1, max_shapes={"DATA": (4,), "ECHO": (4,)})
    header = registry_of(client).get("delay_echo").header
    data = np.arange(4, dtype=np.float32)

    def call(delay_ms: int, **options: Any) -> Any:
        inputs = {"DELAY_MS": np.array([delay_ms], np.int32), "DATA": data}
        return client.infer_shm("delay_echo", inputs, **options)

    for _ in range(3):
        np.testing.assert_array_equal(call(0)["ECHO"], data)
    with pytest.raises(InvalidInputError):
        client.infer_shm("delay_echo", {"DATA": data})
    with pytest.raises(TritonServerError, match="client_timeout_s"):
        call(1000, client_timeout_s=0.2)
    np.testing.assert_array_equal(call(0)["ECHO"], data)  # after Triton answered it

    failures = header.failures()
    assert failures["bad_input"] == 1 and failures["deadline"] == 1
    assert sum(failures.values()) == 2
    totals, histograms = header.totals(), header.histograms()
    assert totals.requests == 4
    assert histograms["latency"].sum() == 4 and totals.latency_ns > 0
    # Every request that took a slot waited for it, if only for nothing: the deadline's too.
    assert histograms["wait"].sum() == 5
    assert 0 < header.latency_quantile_s(0.5) < 1.0
