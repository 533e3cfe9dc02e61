"""Node batching in one process, against the session's Triton: calls of a few rows merged into
one Triton request, each caller answered exactly its own rows (``batch_affine``: Y = 2 X + 1),
only calls that can share a request merged, and a caller alone never waiting for company.
The processes of a node, and the faults of each, are in tests/test_ray_node_batching.py and
tests/test_board.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _helpers import in_threads, our_regions, wait_for

from ray_triton_shm import (
    LocalTritonServer,
    ModelSpecError,
    NodeBatching,
    TritonServerError,
    TritonSHMClient,
)
from ray_triton_shm._client import registry_of

MODEL = "batch_affine"
MAX_SHAPES = {"X": (16,), "Y": (16,)}


@pytest.fixture(params=[0.05])
def batching_client(
    triton: LocalTritonServer, request: pytest.FixtureRequest
) -> Iterator[TritonSHMClient]:
    """A client of ``batch_affine`` batched on the node, waiting at most ``param`` s for
    company."""
    before = our_regions()
    policy = NodeBatching(max_delay_s=request.param, max_in_triton=1)
    with TritonSHMClient(triton.grpc_url) as client:
        client.register_shm_model(MODEL, max_shapes=MAX_SHAPES, pool_size=4, node_batching=policy)
        yield client
    assert our_regions() - before == set()


def _call(client: TritonSHMClient, x: np.ndarray, delay_us: int = 0, **options: Any) -> None:
    delay = np.full((len(x), 1), delay_us, np.int32)
    y = client.infer_shm(MODEL, {"X": x, "DELAY_US": delay}, **options)["Y"]
    np.testing.assert_array_equal(y, 2 * x + 1)


def _header(client: TritonSHMClient) -> Any:
    return registry_of(client).get(MODEL).header


def test_every_caller_gets_exactly_its_own_rows_of_the_merged_requests(
    batching_client: TritonSHMClient,
) -> None:
    """16 threads, 1 to 3 rows a call, each row its own values: every answer is the model's
    arithmetic on the caller's rows, and Triton saw fewer requests than calls."""
    calls = 120

    def caller(worker: int) -> None:
        rng = np.random.default_rng(worker)
        for n in range(calls):
            rows = 1 + n % 3
            x = rng.standard_normal((rows, 4)).astype(np.float32) + worker * 1000 + n
            _call(batching_client, x, delay_us=300)

    in_threads(caller, range(16))
    totals = _header(batching_client).totals()
    assert totals.samples == 16 * calls * 2  # rows 1, 2, 3 in turn: 2 a call
    assert totals.requests < 16 * calls, "no call was merged with another"
    assert _header(batching_client).rows_histogram()[1:].sum() > 0


def test_only_calls_of_the_same_shapes_and_options_join_each_other(
    batching_client: TritonSHMClient,
) -> None:
    """Rows 4 and 8 wide, with and without a priority, from 12 threads at once: had two
    kinds shared a request, Triton would refuse it or answer other rows."""

    def caller(worker: int) -> None:
        width = 4 if worker % 2 else 8
        options = {"priority": 1} if worker % 3 == 0 else {}
        for n in range(60):
            x = np.full((1, width), worker * 100 + n, np.float32)
            _call(batching_client, x, delay_us=200, **options)

    in_threads(caller, range(12))
    assert _header(batching_client).rows_histogram()[1:].sum() > 0


def test_a_caller_alone_never_waits_for_company(batching_client: TritonSHMClient) -> None:
    """With nothing of the model in Triton a call goes out at once: no batch waited (the
    header counts each wait), however long max_delay_s is."""
    for n in range(50):
        _call(batching_client, np.full((1, 4), n, np.float32))
    assert _header(batching_client).company_waits() == (0, 0)
    assert _header(batching_client).rows_histogram()[0] == 50


@pytest.mark.parametrize("batching_client", [30.0], indirect=True)
def test_a_triton_error_for_the_batch_reaches_every_member_with_its_message(
    batching_client: TritonSHMClient,
) -> None:
    """A batch forms behind one in Triton: a caller with a negative DELAY_US (the model fails
    the whole request) and one without; both get Triton's error, with its words."""
    pool = registry_of(batching_client).get(MODEL)
    board, size = pool.board, pool.slots.size
    assert board is not None
    outcomes: dict[str, BaseException | None] = {}

    def send(name: str, delay_us: int) -> None:
        try:
            _call(batching_client, np.full((1, 4), 7, np.float32), delay_us)
            outcomes[name] = None
        except BaseException as exc:
            outcomes[name] = exc

    threads = {}
    for name, delay_us, ready in (
        ("first", 400_000, lambda: pool.header.in_triton(size) == 1),
        ("failing", -1, lambda: len(board.forming(size)) == 1),
        ("member", 0, lambda: [members for _, _, members in board.forming(size)] == [1]),
    ):
        threads[name] = threading.Thread(target=send, args=(name, delay_us))
        threads[name].start()
        wait_for(ready, what=f"{name} in place")
    for thread in threads.values():
        thread.join(30)
    assert outcomes["first"] is None
    for name in ("failing", "member"):
        error = outcomes[name]
        assert isinstance(error, TritonServerError), error
        assert "DELAY_US must be >= 0" in str(error) and MODEL in str(error)
    _call(batching_client, np.zeros((1, 4), np.float32))  # every slot free again
    assert pool.slots.stats().in_use == 0


@pytest.mark.parametrize(
    ("model", "options", "words"),
    [
        ("identity", {"max_shapes": {"INPUT0": (8,), "OUTPUT0": (8,)}}, "dynamic_batching"),
        ("add_nobatch", {}, "max_batch_size is 0"),
        ("upper", {"max_element_bytes": {"TEXT": 64, "UPPER": 64}}, "BYTES"),
    ],
)
def test_a_model_that_cannot_be_batched_is_refused_saying_why(
    triton: LocalTritonServer, model: str, options: dict[str, Any], words: str
) -> None:
    before = our_regions()
    with TritonSHMClient(triton.grpc_url) as client:
        with pytest.raises(ModelSpecError) as info:
            client.register_shm_model(model, node_batching=True, **options)
        assert words in str(info.value) and model in str(info.value)
        if model == "identity":  # its rows are independent: force says so
            forced = NodeBatching(force=True)
            client.register_shm_model(model, node_batching=forced, **options)
            x = np.arange(8, dtype=np.float32).reshape(2, 4)
            out = client.infer_shm(model, {"INPUT0": x})["OUTPUT0"]
            np.testing.assert_array_equal(out, x)
    assert our_regions() - before == set()


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"max_delay_s": -1.0}, "max_delay_s"),
        ({"max_rows": 0}, "max_rows"),
        ({"max_in_triton": 0}, "max_in_triton"),
        ({"max_delay_s": float("nan")}, "max_delay_s"),
    ],
)
def test_node_batching_out_of_range_is_refused_by_name(value: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        NodeBatching(**value)


def test_node_batching_of_another_type_is_refused_before_anything_is_made(
    triton: LocalTritonServer,
) -> None:
    before = our_regions()
    with (
        TritonSHMClient(triton.grpc_url) as client,
        pytest.raises(ModelSpecError, match="node_batching must be"),
    ):
        client.register_shm_model(MODEL, max_shapes=MAX_SHAPES, node_batching="yes")  # type: ignore[arg-type]
    assert our_regions() - before == set()


def test_calls_that_cannot_join_go_alone_and_right(batching_client: TritonSHMClient) -> None:
    """More rows than a batch takes (chunked as ever), and calls in threads beside them."""
    big = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)
    stop = threading.Event()

    def small(worker: int) -> None:
        n = 0
        while not stop.is_set() and n < 200:
            _call(batching_client, np.full((1, 4), worker * 1000 + n, np.float32))
            n += 1

    def large(worker: int) -> None:
        try:
            for _ in range(10):
                _call(batching_client, big)
        finally:
            stop.set()

    in_threads(lambda w: large(w) if w == 0 else small(w), range(5))


def test_by_value_a_batch_gathers_its_rows_in_the_node_slots_and_goes_out_once(
    triton_elsewhere: LocalTritonServer,
) -> None:
    """A Triton that cannot map our /dev/shm: the slots gather the batch's rows, which go to
    Triton in one request by value; every caller still gets exactly its own rows."""
    before = our_regions()
    shapes = {"INPUT0": (8,), "OUTPUT0": (8,)}
    with TritonSHMClient(triton_elsewhere.grpc_url) as client:
        forced = NodeBatching(force=True, max_delay_s=0.05)
        client.register_shm_model("identity", max_shapes=shapes, pool_size=4, node_batching=forced)
        assert client.shm_stats("identity").transport == "inline"

        def caller(worker: int) -> None:
            for n in range(60):
                x = np.full((1 + n % 2, 8), worker * 1000 + n, np.float32)
                x[:, 0] = np.arange(len(x))
                out = client.infer_shm("identity", {"INPUT0": x})["OUTPUT0"]
                np.testing.assert_array_equal(out, x)

        in_threads(caller, range(12))
        header = registry_of(client).get("identity").header
        assert header.totals().samples == 12 * 90
        assert header.rows_histogram()[1:].sum() > 0, "no call was merged with another"
    assert our_regions() - before == set()


def test_coroutines_on_one_loop_join_each_other_and_get_their_own_rows(
    batching_client: TritonSHMClient,
) -> None:
    """``infer_shm_async``: a batch's members wait for its answer on a thread, never on the
    event loop, whose other coroutines go on joining and sending."""
    import asyncio

    async def caller(worker: int) -> None:
        for n in range(40):
            x = np.full((1, 4), worker * 100 + n, np.float32)
            delay = np.full((1, 1), 300, np.int32)
            out = await batching_client.infer_shm_async(MODEL, {"X": x, "DELAY_US": delay})
            np.testing.assert_array_equal(out["Y"], 2 * x + 1)

    async def main() -> None:
        await asyncio.gather(*(caller(worker) for worker in range(12)))

    asyncio.run(main())
    assert _header(batching_client).rows_histogram()[1:].sum() > 0
