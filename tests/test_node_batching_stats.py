"""Node batching, seen: ``shm_stats()`` of a model batched on the node, against the session's
Triton (``batch_affine``: Y = 2 X + 1), says that it batches, its rows per Triton request (the
mean and the histogram) and its batches that waited for company; ``status --ray`` says the same.
The node actor's ``stats()`` under many task processes: tests/test_ray_node_batching.py; the
metrics and the dashboard: tests/test_grafana_dashboard.py."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from _helpers import in_threads, our_regions

from ray_triton_shm import LocalTritonServer, NodeBatching, PoolStats, TritonSHMClient
from ray_triton_shm._client import registry_of
from ray_triton_shm._pools._snapshot import PoolSnapshot
from ray_triton_shm._slots._header import ROWS_BUCKET_BOUNDS

MODEL = "batch_affine"
MAX_SHAPES = {"X": (16,), "Y": (16,)}
#: How long a batch may wait for company: long enough to fill under 16 callers.
MAX_DELAY_S = 0.05


def _client(triton: LocalTritonServer, policy: NodeBatching | None) -> Iterator[TritonSHMClient]:
    before = our_regions()
    with TritonSHMClient(triton.grpc_url) as client:
        client.register_shm_model(MODEL, max_shapes=MAX_SHAPES, pool_size=4, node_batching=policy)
        yield client
    assert our_regions() - before == set()


@pytest.fixture
def batched(triton: LocalTritonServer) -> Iterator[TritonSHMClient]:
    """A client of ``batch_affine`` batched on the node."""
    yield from _client(triton, NodeBatching(max_delay_s=MAX_DELAY_S))


@pytest.fixture
def unbatched(triton: LocalTritonServer) -> Iterator[TritonSHMClient]:
    """A client of ``batch_affine`` whose calls each go alone."""
    yield from _client(triton, None)


def _call(client: TritonSHMClient, x: np.ndarray, delay_us: int = 0) -> None:
    delay = np.full((len(x), 1), delay_us, np.int32)
    y = client.infer_shm(MODEL, {"X": x, "DELAY_US": delay})["Y"]
    np.testing.assert_array_equal(y, 2 * x + 1)


def _check_consistent(stats: PoolStats, client: TritonSHMClient) -> None:
    """The stats agree with the region's header: the histogram counts every answered request,
    and the mean is its samples over its requests."""
    totals = registry_of(client).get(MODEL).header.totals()
    assert tuple(stats.rows_histogram) == ROWS_BUCKET_BOUNDS
    assert sum(stats.rows_histogram.values()) == totals.requests
    assert stats.rows_per_request == pytest.approx(totals.samples / totals.requests)


def test_shm_stats_shows_rows_per_request_above_one_under_concurrent_callers(
    batched: TritonSHMClient,
) -> None:
    """16 threads of one row a call, each call held 300 µs in Triton: the batches that formed
    meanwhile carried several calls' rows, and shm_stats() says so."""
    calls = 60

    def caller(worker: int) -> None:
        for n in range(calls):
            _call(batched, np.full((1, 4), worker * 1000 + n, np.float32), delay_us=300)

    in_threads(caller, range(16))
    stats = batched.shm_stats(MODEL)
    assert stats.node_batching
    _check_consistent(stats, batched)
    assert stats.rows_per_request > 1, stats
    assert sum(n for bound, n in stats.rows_histogram.items() if bound > 1) > 0, stats
    # Batches formed behind one in Triton: their senders waited for company.
    assert stats.company_waits > 0, stats
    waits, wait_ns = registry_of(batched).get(MODEL).header.company_waits()
    assert stats.company_wait_mean_us == pytest.approx(wait_ns / waits / 1e3)
    assert stats.company_wait_mean_us > 0


def test_a_caller_alone_makes_requests_of_its_own_rows_and_waits_for_nobody(
    batched: TritonSHMClient,
) -> None:
    for n in range(20):
        _call(batched, np.full((1, 4), n, np.float32))
    stats = batched.shm_stats(MODEL)
    _check_consistent(stats, batched)
    assert stats.node_batching and stats.rows_per_request == 1.0
    assert stats.rows_histogram[1] == 20
    assert (stats.company_waits, stats.company_wait_mean_us) == (0, 0.0)


def test_a_model_not_batched_on_the_node_says_so_and_still_counts_its_rows(
    unbatched: TritonSHMClient,
) -> None:
    """Calls of 3 rows, each its own request: the bucket of 3 to 4 rows counts them."""
    fresh = unbatched.shm_stats(MODEL)
    assert not fresh.node_batching and fresh.rows_per_request == 0.0
    assert fresh.rows_histogram == dict.fromkeys(ROWS_BUCKET_BOUNDS, 0)
    for n in range(5):
        _call(unbatched, np.full((3, 4), n, np.float32))
    stats = unbatched.shm_stats(MODEL)
    _check_consistent(stats, unbatched)
    assert not stats.node_batching and stats.rows_per_request == 3.0
    assert stats.rows_histogram[4] == 5 and stats.company_waits == 0


def test_pool_stats_made_the_old_way_read_no_batching() -> None:
    """Its new fields have defaults: positional constructions of before still work."""
    stats = PoolStats(4, 1, 0)
    assert not stats.node_batching
    assert (stats.rows_per_request, stats.company_waits, stats.company_wait_mean_us) == (0, 0, 0)
    assert stats.rows_histogram == dict.fromkeys(ROWS_BUCKET_BOUNDS, 0)
    assert list(stats.rows_histogram)[-1] == math.inf
    assert stats.rows_histogram is not PoolStats(4, 1, 0).rows_histogram  # not shared


def test_a_snapshot_reads_rows_per_request_and_company_waits(batched: TritonSHMClient) -> None:
    pool = registry_of(batched).get(MODEL)
    empty = PoolSnapshot.of(pool)
    assert empty.node_batching and empty.rows_per_request == 0.0
    assert empty.company_wait_mean_us == 0.0
    for rows in (1, 2, 3, 5):
        _call(batched, np.ones((rows, 4), np.float32))
    pool.header.count_company_wait(0, 3_000)
    pool.header.count_company_wait(1, 1_000)
    now = PoolSnapshot.of(pool)
    assert now.rows_by_bound == {**dict.fromkeys(ROWS_BUCKET_BOUNDS, 0), 1: 1, 2: 1, 4: 1, 8: 1}
    assert now.rows_per_request == pytest.approx(11 / 4)
    assert (now.company_waits, now.company_wait_ns, now.company_wait_mean_us) == (2, 4_000, 2.0)


def test_status_says_how_node_batching_does() -> None:
    pytest.importorskip("ray")
    from ray_triton_shm.ray._config import NodeStats
    from ray_triton_shm.ray._status import COLUMNS, format_node_actors

    plain = {**dict.fromkeys(COLUMNS, 0), "limited_by": "", "transport": "shm"}
    batched = plain | {
        "node_batching": True,
        "rows_per_request": 6.25,
        "company_waits": 12,
        "company_wait_mean_us": 830.0,
    }
    stats = NodeStats("n1", "t:8001", 7, "i1", {"a": plain, "b": batched})
    text, _ = format_node_actors([{"name": "x", "stats": stats}], "ns")
    lines = text.splitlines()
    assert (
        "    b: node batching: 6.25 rows per Triton request; 12 batches waited for company, "
        "0.83 ms on average"
    ) in lines
    assert not any(line.startswith("    a: node batching") for line in lines)
