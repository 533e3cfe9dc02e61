"""Bytes written over a region header the Ray node actor owns (issue 63): the actor lives on
(the same process) and its stats answer; a caller bound before the write and one that binds
after it (a Ray task: another process) answer right where the stamp survived, else are
refused by name (``ForeignRegionError`` naming the region and the model): never an internal
error, a hang or a wrong answer; and the actor's shutdown leaves no region of its own in
``/dev/shm`` and none registered in Triton. Each test has a node actor of its own (the
region written over is no other test's), ended with it.

The header's readers and writers alone, under generated words: tests/properties/
test_prop_header.py; a core client's region: test_region_header.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from _helpers import end_node_actor, our_regions, registered_on
from ray import cloudpickle

from ray_triton_shm import ForeignRegionError
from ray_triton_shm._slots._header import _MAGIC, _MEMORY, _RETIRED, _VERSION
from ray_triton_shm._slots._shm import SHM_DIR
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES
from ray_triton_shm.ray import ShmModel, get_node_actor

# Ship this module's task by value (workers cannot import the test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SHAPES = {"INPUT0": (16,), "OUTPUT0": (16,)}
#: The handles' settings: whatever the header says, no caller waits past these.
HANDLE: dict[str, Any] = {
    "max_shapes": SHAPES,
    "pool_size": 2,
    "slot_timeout_s": 2.0,
    "client_timeout_s": 10.0,
}
X = np.arange(32, dtype=np.float32).reshape(2, 16)
#: The header's words that matter most for 2 slots: settings, failures, seats, the slots'.
HOT_WORDS = 32 + 64 + 2 * 130
ANSWER = "answer"


@pytest.fixture
def node_actor(ray_local: str) -> Iterator[Any]:
    """A node actor of this test's own."""
    end_node_actor()
    try:
        yield get_node_actor(slots=4)
    finally:
        end_node_actor()


def _overwrite(region: str, writes: list[tuple[int, bytes]]) -> None:
    fd = os.open(SHM_DIR / region, os.O_RDWR)
    try:
        for offset, data in writes:
            os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _outcome(model: ShmModel) -> tuple[str, Any]:
    """One call: ``("answer", whether it is right)`` or ``(error type, (region, model,
    message))``; any error, ours or not, is the test's to judge."""
    try:
        return ANSWER, bool(np.array_equal(model.infer({"INPUT0": X})["OUTPUT0"], X))
    except Exception as exc:
        named = (getattr(exc, "region", None), getattr(exc, "model", None), str(exc))
        return type(exc).__name__, named


@ray.remote(num_cpus=0)
def _call_elsewhere() -> tuple[str, Any]:
    """:func:`_outcome` of a process that binds to the model now."""
    model = ShmModel("identity", **HANDLE)
    try:
        return _outcome(model)
    finally:
        model.close()


def _written_over(
    actor: Any, url: str, writes: list[tuple[int, bytes]]
) -> tuple[str, list[tuple[str, Any]], dict[str, Any]]:
    """``identity`` registered through the node actor and answering right, then ``writes``
    over its region: the region, what a caller bound before and one binding after get, and
    the actor's stats of the model after them. Checks that the actor lives on (the same
    process), that its stats answer, and that its shutdown leaves nothing of its own
    behind."""
    registered = ray.get(actor.register.remote("identity", pool_size=2, max_shapes=SHAPES))
    region = registered.region_name
    before = ray.get(actor.stats.remote(), timeout=30)
    model = ShmModel("identity", **HANDLE)
    try:
        assert _outcome(model) == (ANSWER, True)
        _overwrite(region, writes)
        outcomes = [_outcome(model), ray.get(_call_elsewhere.remote(), timeout=60)]
    finally:
        model.close()
    stats = ray.get(actor.stats.remote(), timeout=30)
    assert (stats.pid, stats.incarnation) == (before.pid, before.incarnation)
    assert stats.models["identity"]["generation"] == 0
    ray.get(actor.shutdown.remote(), timeout=60)
    assert our_regions(stats.pid) == set()
    assert {r for r in registered_on(url) if r.startswith(f"rtshm_{stats.pid}-")} == set()
    return region, outcomes, stats.models["identity"]


def _refused_by_name(outcome: tuple[str, Any], region: str) -> None:
    kind, detail = outcome
    assert kind == ForeignRegionError.__name__, detail
    named, model, message = detail
    assert (named, model) == (region, "identity") and region in message


# Seed 0 in make test (its bytes found the overloaded-before-stamp bug); the rest in the soak.
@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.soak) for s in (1, 2, 3))])
def test_random_bytes_over_the_whole_header_are_refused_by_name_on_every_side(
    node_actor: Any, ray_local: str, seed: int
) -> None:
    """Seeds 0 and 1 leave the caller bound before no slot it may take (each looks
    abandoned) and a ``max_waiting`` word of 0: it used to be refused as overloaded ("0
    callers already wait", naming no region) before anything checked the stamp. The actor's
    stats read none of the written-over words: zeros, not garbage."""
    writes = [(0, np.random.default_rng(seed).bytes(REGION_HEADER_BYTES))]
    region, outcomes, stats = _written_over(node_actor, ray_local, writes)
    for outcome in outcomes:
        _refused_by_name(outcome, region)
    assert stats["slots"] == stats["abandoned"] == stats["requests"] == stats["overloads"] == 0
    assert set(stats["failures"].values()) == {0} and stats["latency_p99_us"] == 0
    assert stats["max_slots"] == 2 and stats["in_use"] == stats["waiting"] == 0


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.soak)])
def test_random_words_with_the_stamp_kept_still_answer_right(
    node_actor: Any, ray_local: str, seed: int
) -> None:
    """Twelve random words of the settings, failures, seats and slots (the stamp, the
    ``retired`` and the memory word aside: their own tests below): sizes and indices read
    within their bounds, and every call answers right."""
    rng = np.random.default_rng(seed)
    kept = {_MAGIC, _VERSION, _RETIRED, _MEMORY}
    words = rng.choice([w for w in range(HOT_WORDS) if w not in kept], 12, replace=False)
    writes = [(8 * int(word), rng.bytes(8)) for word in words]
    _, outcomes, _ = _written_over(node_actor, ray_local, writes)
    assert outcomes == [(ANSWER, True), (ANSWER, True)]


def test_a_retired_word_its_owner_never_wrote_is_refused_by_name(
    node_actor: Any, ray_local: str
) -> None:
    """The node actor knows no layout that replaced the region its written-over ``retired``
    word says was: the call is refused by name (it used to raise the internal
    ``PoolRetired``, from ``_pools/_retry.follow_model``)."""
    writes = [(8 * _RETIRED, np.int64(1).tobytes())]
    region, outcomes, _ = _written_over(node_actor, ray_local, writes)
    for outcome in outcomes:
        _refused_by_name(outcome, region)


def test_a_memory_word_out_of_range_is_refused_by_name_where_it_is_read(
    node_actor: Any, ray_local: str
) -> None:
    """The caller bound before read the memory word when it bound: it answers right; one
    that binds after is refused by name (it used to be refused with neither the region's
    nor the model's name: ``_slots/_memory.open_memory`` read an unnamed header)."""
    writes = [(8 * _MEMORY, np.int64(2**63 - 1).tobytes())]
    region, (here, elsewhere), _ = _written_over(node_actor, ray_local, writes)
    assert here == (ANSWER, True)
    _refused_by_name(elsewhere, region)
