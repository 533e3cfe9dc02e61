"""Triton elsewhere, as a newcomer meets it: requests by value over Triton's HTTP endpoint
once it proves to be the same Triton, its HTTP port found on either side of gRPC's, the log
line of a transport switch as the docs quote it, and a stop of the embedded Triton that
answers what is in flight without waiting for its models to unload.

Against real Tritons; the one that cannot map this process's memory runs in a mount
namespace of its own (``triton_elsewhere``, or one of the test's own), as a container
without ``--ipc=host``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _helpers import (
    OWN_DEV_SHM,
    free_ports,
    local_triton,
    model_repository,
    need_unshare,
    port_is_free,
    registered_on,
    runs_in_triton,
    wait_for,
)

from ray_triton_shm import TritonSHMClient
from ray_triton_shm.local._process import group_alive
from ray_triton_shm.local._server import LocalTritonServer

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"INPUT0": (64,), "OUTPUT0": (64,)}
TEXT_BYTES = {"TEXT": 32, "UPPER": 32}

rng = np.random.default_rng(64)


@pytest.fixture
def far(
    triton_elsewhere: LocalTritonServer, make_client: Callable[..., TritonSHMClient]
) -> TritonSHMClient:
    """A client of the Triton elsewhere, where nothing is registered before it."""
    assert registered_on(triton_elsewhere.grpc_url) == set()
    return make_client(triton_elsewhere.grpc_url)


def _identity(client: TritonSHMClient, x: np.ndarray, **options: object) -> np.ndarray:
    return client.infer_shm("identity", {"INPUT0": x}, **options)["OUTPUT0"]  # type: ignore[arg-type]


def _went_over_http(client: TritonSHMClient) -> bool:
    """Whether the client's HTTP route holds a connection a request went over."""
    route = client._triton.http
    return route is not None and len(route._idle) > 0


# ---------------------------------------------------------------- by value, over HTTP


def test_requests_by_value_go_over_http_once_one_ran_and_every_answer_is_its_own(
    far: TritonSHMClient, triton_elsewhere: LocalTritonServer
) -> None:
    far.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
    far.register_shm_model("upper", max_element_bytes=TEXT_BYTES)
    far.register_shm_model("echo_parameters", max_element_bytes={"PARAMETERS": 256})
    before = far.shm_stats("identity")
    assert (before.transport, before.protocol) == ("inline", "grpc"), before
    x = rng.standard_normal((2, 16), dtype=np.float32)
    np.testing.assert_array_equal(_identity(far, x), x)  # over gRPC: then the proof
    stats = far.shm_stats("identity")
    assert stats.protocol == "http", stats.protocol_reason
    assert f"{triton_elsewhere.http_url}, proven the same" in stats.protocol_reason
    assert "statistics of model 'identity'" in stats.protocol_reason
    # Shapes, sizes and ids change between calls: each slot's JSON is written again.
    for index, (rows, width) in enumerate([(1, 16), (1, 16), (3, 8), (8, 64), (2, 1)]):
        x = rng.standard_normal((rows, width), dtype=np.float32)
        np.testing.assert_array_equal(_identity(far, x, request_id=f"r{index % 2}"), x)
    assert _went_over_http(far)
    # Strings, of every length, and the outputs asked for.
    texts = np.array([[b"a"], [b""], [b"mixed Case 64"], [b"x" * 32]], object)
    out = far.infer_shm("upper", {"TEXT": texts})
    assert out["UPPER"].tolist() == [[t.upper()] for t in texts[:, 0]]
    assert out["LENGTH"].tolist() == [[len(t)] for t in texts[:, 0]]
    out = far.infer_shm("upper", {"TEXT": texts}, requested_outputs=["LENGTH"])
    assert set(out) == {"LENGTH"}
    # Request options travel in the JSON.
    parameters: dict[str, str | int | float | bool] = {"tag": "http", "count": 3, "flag": True}
    y = np.array([1.5, -2.0], np.float32)
    out = far.infer_shm("echo_parameters", {"INPUT0": y}, parameters=parameters, request_id="p")
    assert json.loads(out["PARAMETERS"][0]) == parameters
    np.testing.assert_array_equal(out["DOUBLE"], 2 * y)
    # Several requests (gRPC futures) and a deadline (a gRPC future) still answer right.
    x = rng.standard_normal((20, 64), dtype=np.float32)
    np.testing.assert_array_equal(_identity(far, x), x)
    np.testing.assert_array_equal(_identity(far, x[:3], client_timeout_s=30.0), x[:3])

    async def many() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(far.infer_shm_async("identity", {"INPUT0": b}) for b in xs))

    xs = [rng.standard_normal((1 + i % 8, 16), dtype=np.float32) for i in range(24)]
    for batch, answer in zip(xs, asyncio.run(many()), strict=True):
        np.testing.assert_array_equal(answer["OUTPUT0"], batch)
    assert far.shm_stats("identity").in_use == 0


def test_threads_by_value_over_http_each_get_their_own_answer(far: TritonSHMClient) -> None:
    far.register_shm_model("identity", pool_size=2, max_shapes=SHAPES)
    wrong: list[str] = []

    def caller(seed: int) -> None:
        own = np.random.default_rng(seed)
        for call in range(20):
            x = own.standard_normal((int(own.integers(1, 9)), 24), dtype=np.float32)
            if not np.array_equal(_identity(far, x), x):
                wrong.append(f"caller {seed}, call {call}")

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert wrong == []
    stats = far.shm_stats("identity")
    assert stats.protocol == "http" and stats.in_use == stats.waiting == 0, stats


def test_an_http_url_of_another_triton_by_value_stays_on_grpc_saying_why(
    triton_elsewhere: LocalTritonServer,
    triton: LocalTritonServer,
    make_client: Callable[..., TritonSHMClient],
) -> None:
    """Given explicitly, the HTTP endpoint of another Triton that serves the same model: its
    statistics of the model are not this Triton's, so nothing goes there."""
    client = make_client(triton_elsewhere.grpc_url, http_url=triton.http_url)
    client.register_shm_model("identity", max_shapes=SHAPES)
    for rows in (1, 4, 8):
        x = rng.standard_normal((rows, 16), dtype=np.float32)
        np.testing.assert_array_equal(_identity(client, x), x)
    stats = client.shm_stats("identity")
    assert stats.protocol == "grpc", stats
    assert f"{triton.http_url} is not this Triton's HTTP endpoint" in stats.protocol_reason
    assert "statistics of model 'identity'" in stats.protocol_reason


# ---------------------------------------------------------------- HTTP on either side of gRPC


def _ports(http_above: bool) -> tuple[int, int, int]:
    """Free ports for a Triton, both ports next to its gRPC port free (nothing answers there
    but Triton's HTTP endpoint, if ``http_above``, on the one above): ``(grpc, http,
    metrics)``."""
    while True:
        grpc_port, far_http, metrics = free_ports(3)
        neighbours = (grpc_port - 1, grpc_port + 1)
        if all(port_is_free("127.0.0.1", p) for p in neighbours) and not {
            far_http,
            metrics,
        }.intersection(neighbours):
            return grpc_port, grpc_port + 1 if http_above else far_http, metrics


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_http_at_the_grpc_port_plus_one_is_found(where: str, tmp_path: Path) -> None:
    """``http_url="auto"`` tries the port below gRPC's, then the one above: found there, it is
    proven the same Triton (by a region in shared memory, or by value by its statistics)."""
    options: dict[str, object] = {}
    if where == "elsewhere":
        need_unshare("--mount")
        options["launcher"] = OWN_DEV_SHM
    grpc_port, http_port, metrics_port = _ports(http_above=True)
    with (
        local_triton(
            model_repository(tmp_path / "models", "identity"),
            grpc_port=grpc_port,
            http_port=http_port,
            metrics_port=metrics_port,
            log_path=tmp_path / "tritonserver.log",
            **options,
        ) as server,
        TritonSHMClient(url=server.grpc_url) as client,
    ):
        client.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)
        for rows in (1, 8):
            x = rng.standard_normal((rows, 16), dtype=np.float32)
            np.testing.assert_array_equal(_identity(client, x), x)
        stats = client.shm_stats("identity")
        assert stats.transport == ("shm" if where == "here" else "inline"), stats
        assert stats.protocol == "http", stats.protocol_reason
        assert f"127.0.0.1:{grpc_port + 1}, proven the same" in stats.protocol_reason


def test_with_neither_neighbour_the_reason_names_both(tmp_path: Path) -> None:
    grpc_port, far_http, metrics_port = _ports(http_above=False)
    with (
        local_triton(
            model_repository(tmp_path / "models", "identity"),
            grpc_port=grpc_port,
            http_port=far_http,
            metrics_port=metrics_port,
            log_path=tmp_path / "tritonserver.log",
        ) as server,
        TritonSHMClient(url=server.grpc_url) as client,
    ):
        client.register_shm_model("identity", pool_size=1, max_shapes=SHAPES)
        reason = client.shm_stats("identity").protocol_reason
    assert f"no Triton HTTP endpoint at 127.0.0.1:{grpc_port - 1}" in reason, reason
    assert f"no Triton HTTP endpoint at 127.0.0.1:{grpc_port + 1}" in reason, reason
    assert reason.endswith("(both ports next to gRPC's tried)"), reason


# ---------------------------------------------------------------- the switch, in the log


def test_the_switch_to_by_value_is_one_info_line_as_the_docs_quote_it(
    far: TritonSHMClient, triton_elsewhere: LocalTritonServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ray_triton_shm")
    far.register_shm_model("identity", max_shapes=SHAPES)
    switches = [r for r in caplog.records if "sends its tensors" in r.getMessage()]
    assert len(switches) == 1, [r.getMessage() for r in caplog.records]
    record = switches[0]
    assert (record.name, record.levelno) == ("ray_triton_shm._pools._registry", logging.INFO)
    reason = far.shm_stats("identity").transport_reason
    assert (
        record.getMessage()
        == f"ray-triton-shm: model 'identity' sends its tensors by value: {reason}"
    )
    # The docs quote it as logging.basicConfig() prints it, for a model 'classifier' of a
    # Triton at triton:8001: the same words up to the region's name.
    shown = logging.Formatter(logging.BASIC_FORMAT).format(record)
    head = shown.split("/dev/shm/", 1)[0]
    quoted = head.replace("'identity'", "'classifier'").replace(
        triton_elsewhere.grpc_url, "triton:8001"
    )
    assert quoted in (ROOT / "docs" / "concepts" / "transport.md").read_text()


# ---------------------------------------------------------------- stopping the embedded Triton


def test_a_stop_answers_what_is_in_flight_and_ends_once_every_model_is_unloaded(
    tmp_path: Path,
) -> None:
    """SIGINT, then the process group ends once Triton logs every model of the run unloaded,
    not at its own next look (once a second) and exit: the request running then is answered
    first, every model was unloaded, and nothing of the group is left."""
    import tritonclient.grpc as grpcclient

    log = tmp_path / "tritonserver.log"
    server = LocalTritonServer(
        model_repository(tmp_path / "models", "delay_echo", "upper"), log_path=log
    )
    answers: list[object] = []

    def in_flight() -> None:
        with grpcclient.InferenceServerClient(server.grpc_url) as plain:
            delay = grpcclient.InferInput("DELAY_MS", [1], "INT32")
            delay.set_data_from_numpy(np.array([2000], np.int32))  # the load: in flight
            data = grpcclient.InferInput("DATA", [3], "FP32")
            data.set_data_from_numpy(np.arange(3, dtype=np.float32))
            try:
                answers.append(plain.infer("delay_echo", [delay, data]).as_numpy("ECHO"))
            except Exception as exc:  # the test fails below, saying what it got
                answers.append(exc)

    try:
        server.start()
        pid = server.pid
        assert pid is not None
        caller = threading.Thread(target=in_flight)
        with runs_in_triton(server, "delay_echo") as runs:
            caller.start()
            wait_for(lambda: runs() == 1, what="the request running in Triton")
        server.stop()
        caller.join(timeout=60)
        assert len(answers) == 1, answers
        np.testing.assert_array_equal(answers[0], np.arange(3, dtype=np.float32))
        stopped = log.read_bytes().rsplit(b"Signal (2) received", 1)[1]
        for model in (b"delay_echo", b"upper"):
            assert b"successfully unloaded '" + model + b"'" in stopped, stopped[-2000:]
        assert server.pid is None and not server.is_running
        assert not group_alive(pid)
    finally:
        server.close()
