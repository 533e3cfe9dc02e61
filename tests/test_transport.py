"""The transport of a pool, on real Tritons: by value to a Triton that cannot map this
process's shared memory, through shared memory where it can, and following Triton when it
restarts on the other side.

The Triton that cannot map our memory runs in a mount namespace of its own, with a ``/dev/shm``
of its own (``unshare --mount``, as a container without ``--ipc=host``): it opens no region of
ours, exactly as a Triton on another host. Every answer is checked against its input, and every
client is checked to leave nothing behind, in ``/dev/shm`` or in Triton.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _helpers import (
    OWN_DEV_SHM,
    Load,
    free_port_pair,
    free_ports,
    model_repository,
    need_unshare,
    our_regions,
    registered_on,
    wait_for,
)

from ray_triton_shm import (
    InvalidInputError,
    LeaseByValueError,
    ModelNotRegisteredError,
    ModelSpecError,
    SharedMemoryUnreachableError,
    TritonSHMClient,
)
from ray_triton_shm.local._server import LocalTritonServer

#: Sizes the ``identity`` pools are made for.
SHAPES = {"INPUT0": (64,), "OUTPUT0": (64,)}
#: The longest text of the ``upper`` pools.
TEXT_BYTES = {"TEXT": 32, "UPPER": 32}

rng = np.random.default_rng(20261128)


def _leaves_nothing(url: str) -> None:
    """Fails unless this process has no region in ``/dev/shm`` and Triton at ``url`` none
    registered."""
    assert our_regions(os.getpid()) == set(), "a region of this process survived close()"
    assert registered_on(url) == set(), "a region stayed registered in Triton"


def _successes(metrics_url: str, model: str) -> int:
    """The inference requests Triton answered for ``model`` (its metric
    ``nv_inference_request_success``, over every version)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    prefix = f'nv_inference_request_success{{model="{model}",'
    return sum(
        int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines() if line.startswith(prefix)
    )


@pytest.fixture
def far(
    triton_elsewhere: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> TritonSHMClient:
    """A client of the Triton elsewhere, where nothing is registered before it; after the
    test it is closed and nothing of it may be left (:func:`make_client`)."""
    assert registered_on(triton_elsewhere.grpc_url) == set()
    return make_client(triton_elsewhere.grpc_url)


def _identity(client: TritonSHMClient, x: object) -> np.ndarray:
    return client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"]  # type: ignore[dict-item]


# ---------------------------------------------------------------- by value, to a Triton elsewhere


def test_auto_goes_by_value_to_a_triton_with_its_own_dev_shm_and_says_why(
    far: TritonSHMClient, triton_elsewhere: LocalTritonServer
) -> None:
    far.register_shm_model("identity", max_shapes=SHAPES)
    stats = far.shm_stats("identity")
    assert stats.transport == "inline", stats
    reason = stats.transport_reason
    assert "could not open /dev/shm/" in reason and triton_elsewhere.grpc_url in reason, reason
    assert "another /dev/shm" in reason
    # Its region holds the slots' locks, and Triton knows nothing of it.
    assert len(our_regions(os.getpid())) == 1
    assert registered_on(triton_elsewhere.grpc_url) == set()
    # Every size: one row, a full request, one more (2 requests), several (5 requests).
    for rows, width in [(1, 1), (8, 64), (9, 3), (20, 17), (33, 64)]:
        x = rng.standard_normal((rows, width), dtype=np.float32)
        np.testing.assert_array_equal(_identity(far, x), x)
    assert far.shm_stats("identity").in_use == 0


def test_by_value_takes_samples_as_lists_and_arrays_of_any_layout(far: TritonSHMClient) -> None:
    far.register_shm_model("identity", max_shapes=SHAPES)
    base = rng.standard_normal((24, 32), dtype=np.float32)
    for x in (
        base[::2],  # every other row
        base[:, 3:19],  # some columns
        np.asfortranarray(base[:11]),
        base[::-1],
        np.broadcast_to(base[0], (10, 32)),
    ):
        assert not x.flags.c_contiguous
        np.testing.assert_array_equal(_identity(far, x), x)
    samples = [base[i] for i in range(13)]  # a list of rows: 2 requests
    np.testing.assert_array_equal(_identity(far, samples), base[:13])
    with pytest.raises(InvalidInputError, match="INPUT0"):
        _identity(far, base.astype(np.float64))  # refused before anything is sent


def test_strings_by_value_come_back_right(far: TritonSHMClient) -> None:
    far.register_shm_model("upper", max_element_bytes=TEXT_BYTES)
    assert far.shm_stats("upper").transport == "inline"
    words = [b"", b"a", b"hello world", "\u00e9t\u00e9".encode(), b"x" * 32, b"MiXeD 42"]
    texts = np.array([[words[i % len(words)]] for i in range(19)], object)
    texts[5, 0] = b"y" * 32  # as long as its slot allows
    out = far.infer_shm("upper", {"TEXT": texts})  # 3 requests
    assert out["UPPER"].tolist() == [[t.upper()] for t in texts[:, 0]]
    assert out["LENGTH"].tolist() == [[len(t)] for t in texts[:, 0]]
    # Strings given as str are sent as UTF-8, as through shared memory.
    out = far.infer_shm("upper", {"TEXT": np.array([["abc"], ["\u00e9"]], object)})
    assert out["UPPER"].tolist() == [[b"ABC"], ["\u00e9".encode()]]
    with pytest.raises(InvalidInputError, match="33 bytes"):
        far.infer_shm("upper", {"TEXT": np.array([[b"z" * 33]], object)})


def test_a_model_that_does_not_batch_by_value(far: TritonSHMClient) -> None:
    spec = far.register_shm_model("add_nobatch")
    assert spec.max_batch_size == 0 and far.shm_stats("add_nobatch").transport == "inline"
    for _ in range(3):
        a, b = rng.standard_normal(4, np.float32), rng.standard_normal(4, np.float32)
        out = far.infer_shm("add_nobatch", {"INPUT0": a, "INPUT1": b})["OUTPUT0"]
        np.testing.assert_array_equal(out, a + b)
    with pytest.raises(InvalidInputError):
        far.infer_shm("add_nobatch", {"INPUT0": a[None], "INPUT1": b})


def test_requested_outputs_and_request_options_by_value(far: TritonSHMClient) -> None:
    far.register_shm_model("echo_parameters", max_element_bytes={"PARAMETERS": 256})
    far.register_shm_model("upper", max_element_bytes=TEXT_BYTES)
    x = np.array([1.5, -2.0], np.float32)
    parameters: dict[str, str | int | float | bool] = {
        "tag": "by-value",
        "count": 3,
        "flag": True,
        "ratio": 0.25,
    }
    out = far.infer_shm("echo_parameters", {"INPUT0": x}, parameters=parameters, request_id="rid-7")
    assert json.loads(out["PARAMETERS"][0]) == parameters
    np.testing.assert_array_equal(out["DOUBLE"], 2 * x)
    # Only the outputs asked for come back; the options are the call's own.
    out = far.infer_shm("echo_parameters", {"INPUT0": x}, requested_outputs=["DOUBLE"])
    assert set(out) == {"DOUBLE"}
    np.testing.assert_array_equal(out["DOUBLE"], 2 * x)
    out = far.infer_shm("echo_parameters", {"INPUT0": x})
    assert set(out) == {"PARAMETERS", "DOUBLE"} and json.loads(out["PARAMETERS"][0]) == {}
    texts = np.array([[b"abc"], [b"de"]] * 5, object)  # 2 requests
    out = far.infer_shm("upper", {"TEXT": texts}, requested_outputs=["LENGTH"])
    assert set(out) == {"LENGTH"} and out["LENGTH"].tolist() == [[3], [2]] * 5


def test_async_calls_by_value_each_get_their_own_answer(far: TritonSHMClient) -> None:
    far.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
    inputs = [rng.standard_normal((1 + 3 * i, 16), dtype=np.float32) for i in range(12)]

    async def all_of_them() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(
            *(far.infer_shm_async("identity", {"INPUT0": x}) for x in inputs)
        )

    for x, out in zip(inputs, asyncio.run(all_of_them())):
        np.testing.assert_array_equal(out["OUTPUT0"], x)
    assert far.shm_stats("identity").in_use == 0


def test_more_threads_than_slots_by_value_each_get_their_own_answer(far: TritonSHMClient) -> None:
    far.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
    far.register_shm_model("upper", pool_size=1, max_element_bytes=TEXT_BYTES)
    wrong: list[str] = []

    def caller(seed: int) -> None:
        own = np.random.default_rng(seed)
        for call in range(8):
            x = own.standard_normal((int(own.integers(1, 20)), 24), dtype=np.float32)
            if not np.array_equal(_identity(far, x), x):
                wrong.append(f"identity, caller {seed}, call {call}")
            text = np.array([[f"caller {seed} call {call}".encode()]] * (1 + call), object)
            if far.infer_shm("upper", {"TEXT": text})["UPPER"].tolist() != [
                [t.upper()] for t in text[:, 0]
            ]:
                wrong.append(f"upper, caller {seed}, call {call}")

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert wrong == []
    for model in ("identity", "upper"):
        stats = far.shm_stats(model)
        assert stats.transport == "inline" and stats.in_use == stats.waiting == 0


def test_the_reason_says_the_region_it_names_is_gone_and_another_dev_shm_plainly(
    far: TritonSHMClient,
) -> None:
    far.register_shm_model("identity", max_shapes=SHAPES)
    reason = far.shm_stats("identity").transport_reason
    named = reason.split("could not open ", 1)[1].split(" ", 1)[0]
    assert not Path(named).exists() and "removed since" in reason, reason
    assert "it has another /dev/shm than this process" in reason, reason
    assert "as a user" not in reason and "another user" not in reason, reason


def test_a_lease_on_a_pool_by_value_is_refused_saying_why(far: TritonSHMClient) -> None:
    far.register_shm_model("identity", max_shapes=SHAPES)
    with pytest.raises(LeaseByValueError, match="by value") as info:
        far.lease("identity", batch=2)
    assert info.value.model == "identity" and "/dev/shm" in str(info.value)
    assert info.value.reason == far.shm_stats("identity").transport_reason
    assert info.value.node == socket.gethostname() and info.value.actual == "inline"
    assert isinstance(info.value, SharedMemoryUnreachableError)
    assert isinstance(info.value, InvalidInputError)  # caught as it was before
    x = rng.standard_normal((2, 8), dtype=np.float32)
    np.testing.assert_array_equal(_identity(far, x), x)  # the pool is as it was
    assert far.shm_stats("identity").in_use == 0


def test_closing_a_client_by_value_leaves_nothing(triton_elsewhere: LocalTritonServer) -> None:
    client = TritonSHMClient(url=triton_elsewhere.grpc_url)
    try:
        client.register_shm_model("identity", max_shapes=SHAPES)
        client.register_shm_model("upper", max_element_bytes=TEXT_BYTES)
        _identity(client, np.ones((3, 4), np.float32))
        assert len(our_regions(os.getpid())) == 2  # one region of locks per model
    finally:
        client.close()
    _leaves_nothing(triton_elsewhere.grpc_url)


# ---------------------------------------------------------------- asking for a transport


def test_transport_shm_where_triton_cannot_map_raises_naming_model_and_node(
    far: TritonSHMClient, triton_elsewhere: LocalTritonServer
) -> None:
    with pytest.raises(SharedMemoryUnreachableError) as info:
        far.register_shm_model("identity", max_shapes=SHAPES, transport="shm")
    error = info.value
    assert error.model == "identity" and error.node == socket.gethostname()
    assert "could not open /dev/shm/" in error.reason
    message = str(error)
    assert "'identity'" in message and socket.gethostname() in message
    assert triton_elsewhere.grpc_url in message and "transport='auto'" in message
    # One sentence after another, saying plainly what was proven.
    assert ".." not in message and "it has another /dev/shm than this process" in message
    assert "another user" not in message and "same uid" not in message, message
    # Nothing was left behind, and nothing registered.
    assert our_regions(os.getpid()) == set()
    assert registered_on(triton_elsewhere.grpc_url) == set()
    assert "identity" not in far.registered_models
    with pytest.raises(ModelNotRegisteredError):
        _identity(far, np.ones((1, 4), np.float32))


def test_an_unknown_transport_is_refused_naming_model_and_value(client: TritonSHMClient) -> None:
    with pytest.raises(ModelSpecError) as info:
        client.register_shm_model("identity", max_shapes=SHAPES, transport="bogus")
    assert info.value.model == "identity"
    assert "'identity'" in str(info.value) and "'bogus'" in str(info.value)
    assert our_regions(os.getpid()) == set() and client.registered_models == {}


def test_inline_on_a_triton_that_maps_shm_goes_by_value_and_probes_nothing(
    client: TritonSHMClient, triton: LocalTritonServer
) -> None:
    before = _successes(triton.metrics_url, "identity")
    client.register_shm_model("identity", max_shapes=SHAPES, transport="inline")
    stats = client.shm_stats("identity")
    assert stats.transport == "inline" and "transport='inline' was asked for" in (
        stats.transport_reason
    ), stats
    assert our_regions(os.getpid()) & registered_on(triton.grpc_url) == set()
    for rows in (1, 8, 17):  # 1 + 1 + 3 requests
        x = rng.standard_normal((rows, 10), dtype=np.float32)
        np.testing.assert_array_equal(_identity(client, x), x)
    with pytest.raises(InvalidInputError, match="by value"):
        client.lease("identity", batch=1)
    # The registration made no request: Triton answered the calls' five, no probe.
    wait_for(
        lambda: _successes(triton.metrics_url, "identity") - before >= 5,
        timeout_s=10,
        what="Triton counting the 5 requests",
    )
    assert _successes(triton.metrics_url, "identity") - before == 5


def test_auto_on_a_triton_that_maps_shm_proves_it_with_one_probe_per_registration(
    client: TritonSHMClient, triton: LocalTritonServer
) -> None:
    metrics = triton.metrics_url

    def requests_since(start: int, model: str, expected: int) -> int:
        wait_for(
            lambda: _successes(metrics, model) - start >= expected,
            timeout_s=10,
            what=f"Triton counting {expected} requests of {model}",
        )
        return _successes(metrics, model) - start

    start = _successes(metrics, "identity")
    client.register_shm_model("identity", max_shapes=SHAPES)
    stats = client.shm_stats("identity")
    assert stats.transport == "shm", stats
    assert "a probe request's outputs landed in it" in stats.transport_reason
    assert our_regions(os.getpid()) <= registered_on(triton.grpc_url)
    for _ in range(4):
        x = rng.standard_normal((3, 64), dtype=np.float32)
        np.testing.assert_array_equal(_identity(client, x), x)
    assert requests_since(start, "identity", 5) == 5  # the probe, then the 4 calls
    # Registering again (a no-op) probes nothing; a new registration probes once more.
    client.register_shm_model("identity", max_shapes=SHAPES)
    client.unregister_shm_model("identity")
    client.register_shm_model("identity", max_shapes=SHAPES)
    x = rng.standard_normal((1, 5), dtype=np.float32)
    np.testing.assert_array_equal(_identity(client, x), x)
    assert requests_since(start, "identity", 7) == 7
    # A BYTES model's probe sees its number output land in the slot.
    upper = _successes(metrics, "upper")
    client.register_shm_model("upper", max_element_bytes=TEXT_BYTES)
    assert client.shm_stats("upper").transport == "shm"
    assert "landed" in client.shm_stats("upper").transport_reason
    out = client.infer_shm("upper", {"TEXT": np.array([[b"ab"]], object)})
    assert out["UPPER"].tolist() == [[b"AB"]]
    assert requests_since(upper, "upper", 2) == 2


# ---------------------------------------------------------------- Triton moving, and back


def test_a_triton_restarted_elsewhere_flips_the_transport_and_back(tmp_path: Path) -> None:
    """One gRPC port, one client under load: Triton here (shared memory), restarted in a
    namespace of its own (the pool goes by value at its next request), then here again (the
    pool finds shared memory again within a few ``config_check_interval_s``)."""
    need_unshare("--mount")
    grpc_port, http_port = free_port_pair()
    (metrics_port,) = free_ports(1)
    while metrics_port in (grpc_port, http_port):
        (metrics_port,) = free_ports(1)
    repository = model_repository(tmp_path / "models", "identity")

    def server(name: str, launcher: tuple[str, ...]) -> LocalTritonServer:
        return LocalTritonServer(
            repository,
            grpc_port=grpc_port,
            http_port=http_port,
            metrics_port=metrics_port,
            launcher=launcher,
            log_path=tmp_path / f"{name}.log",
        )

    here, there = server("here", ()), server("there", OWN_DEV_SHM)
    interval = 0.5
    outages: list[tuple[float, float]] = []

    def move(stopped: LocalTritonServer, started: LocalTritonServer) -> None:
        down = time.time()
        stopped.kill()
        started.start()
        outages.append((down, time.time()))

    load = None
    try:
        here.start()
        url = here.grpc_url
        with TritonSHMClient(url=url, config_check_interval_s=interval) as client:
            client.register_shm_model("identity", max_shapes={"INPUT0": (16,), "OUTPUT0": (16,)})
            assert client.shm_stats("identity").transport == "shm"
            load = Load(3, lambda x: _identity(client, x))  # up to 11 rows: 2 requests
            load.wait_for_answers(20)

            move(here, there)
            wait_for(
                lambda: client.shm_stats("identity").transport == "inline",
                timeout_s=30,
                what="the pool by value after Triton moved to its own /dev/shm",
            )
            assert "could not open /dev/shm/" in client.shm_stats("identity").transport_reason
            load.wait_for_answers(20)
            assert registered_on(url) == set()  # that Triton maps nothing of ours
            wait_for(
                lambda: len(our_regions(os.getpid())) == 1,
                what="the region in shared memory retired",
            )

            move(there, here)
            back = wait_for(
                lambda: client.shm_stats("identity").transport == "shm" and time.time(),
                timeout_s=10 * interval,
                what="the pool back in shared memory",
            )
            assert "landed" in client.shm_stats("identity").transport_reason
            load.wait_for_answers(20)
            outcomes = load.stop()
            load = None
            wait_for(
                lambda: our_regions(os.getpid()) == registered_on(url),
                what="the region by value retired, the new one registered",
            )
            assert len(our_regions(os.getpid())) == 1
        _leaves_nothing(url)
    finally:
        if load is not None:
            load.stop()
        here.kill()
        there.kill()
        here.close()
        there.close()
    answers = [o for o in outcomes if o.error is None]
    assert [o for o in answers if o.wrong] == []
    # A call may fail only across an outage (a request Triton was killed with).
    failed = [
        o
        for o in outcomes
        if o.error is not None
        and not any(o.started <= up and o.ended >= down for down, up in outages)
    ]
    assert failed == [], [f"{type(o.error).__name__}: {o.error}" for o in failed]
    # Every stretch had its answers: before, by value, and back in shared memory.
    (down1, up1), (down2, up2) = outages
    assert any(o.ended < down1 for o in answers)
    assert any(up1 < o.started and o.ended < down2 for o in answers)
    assert any(o.started > back for o in answers)
