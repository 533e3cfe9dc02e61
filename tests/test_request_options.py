"""Triton's request options through shared memory: sequences, priorities, Triton's own queue
timeout, parameters and a subset of the outputs, in the core client and in the Ray layer."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import numpy as np
import pytest
from _helpers import queued_in_triton, request_sent, runs_in_triton, wait_for

from ray_triton_shm import InvalidInputError, TritonServerError, TritonSHMClient
from ray_triton_shm._client import registry_of
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES
from ray_triton_shm.local import LocalTritonServer


def _drive_sequences(url: str, first_id: int, steps: int) -> list[str]:
    """Drives two interleaved sequences through shared memory; returns what was wrong."""
    rng = np.random.default_rng(first_id)
    wrong = []
    with TritonSHMClient(url) as client:
        client.register_shm_model("sequence_sum", pool_size=2)
        totals = {first_id: 0, first_id + 1: 0}
        for step in range(steps):
            for sequence in totals:
                value = int(rng.integers(-50, 50))
                totals[sequence] += value
                out = client.infer_shm(
                    "sequence_sum",
                    {"VALUE": np.array([[value]], np.int32)},
                    sequence_id=sequence,
                    sequence_start=step == 0,
                    sequence_end=step == steps - 1,
                )["SUM"]
                if int(out[0, 0]) != totals[sequence]:
                    wrong.append(
                        f"sequence {sequence} step {step}: {out[0, 0]} != {totals[sequence]}"
                    )
    return wrong


def test_interleaved_sequences_from_several_processes_are_exact(grpc_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(3) as pool:
        results = pool.starmap(_drive_sequences, [(grpc_url, 1000 + 10 * i, 25) for i in range(3)])
    assert [w for wrong in results for w in wrong] == []


def test_a_sequence_step_is_never_split(client: TritonSHMClient) -> None:
    client.register_shm_model("sequence_sum", pool_size=2)
    pool = registry_of(client).get("sequence_sum")
    pool.region.buffer[REGION_HEADER_BYTES:] = b"\xab" * (pool.region.size - REGION_HEADER_BYTES)
    before = bytes(pool.region.buffer[REGION_HEADER_BYTES:])
    with pytest.raises(InvalidInputError, match=r"sequence 7.*5 samples.*max_batch_size 4") as info:
        client.infer_shm(
            "sequence_sum", {"VALUE": np.ones((5, 1), np.int32)}, sequence_id=7, sequence_start=True
        )
    assert info.value.actual == 5
    assert bytes(pool.region.buffer[REGION_HEADER_BYTES:]) == before
    assert client.shm_stats("sequence_sum").in_use == 0


def _queued(delay_ms: int, value: float) -> dict[str, np.ndarray]:
    return {
        "DELAY_MS": np.array([[delay_ms]], np.int32),
        "DATA": np.full((1, 4), value, np.float32),
    }


def test_a_high_priority_request_overtakes_a_queue_of_low_ones(
    client: TritonSHMClient, triton: LocalTritonServer
) -> None:
    client.register_shm_model("queued", pool_size=8)
    done: list[str] = []
    lock = threading.Lock()

    def call(name: str, delay_ms: int, priority: int) -> None:
        out = client.infer_shm("queued", _queued(delay_ms, len(name)), priority=priority)
        assert out["ECHO"][0, 0] == len(name)
        with lock:
            done.append(name)

    threads = [threading.Thread(target=call, args=("blocker", 800, 2))]
    threads[0].start()
    pool = registry_of(client).get("queued")
    wait_for(lambda: request_sent(pool), what="the blocker's request sent")
    for i in range(4):
        threads.append(threading.Thread(target=call, args=(f"low{i}", 50, 2)))
        threads[-1].start()
    # One instance: four queued means the blocker, sent first on the channel, runs.
    wait_for(lambda: queued_in_triton(triton.metrics_url, "queued") == 4, what="4 queued")
    threads.append(threading.Thread(target=call, args=("high", 50, 1)))
    threads[-1].start()
    for thread in threads:
        thread.join(30)
    assert done[:2] == ["blocker", "high"], done
    assert sorted(done[2:]) == ["low0", "low1", "low2", "low3"]


def test_tritons_queue_timeout_rejects_and_frees_the_slot_at_once(
    client: TritonSHMClient, triton: LocalTritonServer
) -> None:
    client.register_shm_model("queued", pool_size=3)
    pool = registry_of(client).get("queued")
    blocker = threading.Thread(target=client.infer_shm, args=("queued", _queued(1500, 1.0)))
    blocker.start()
    wait_for(lambda: request_sent(pool), what="the blocker's request sent")
    # A second request queued behind it: then the blocker runs (one instance).
    second = threading.Thread(target=client.infer_shm, args=("queued", _queued(10, 3.0)))
    second.start()
    wait_for(lambda: queued_in_triton(triton.metrics_url, "queued") == 1, what="one queued")
    started = time.monotonic()
    with pytest.raises(TritonServerError, match="timeout") as info:
        client.infer_shm("queued", _queued(10, 2.0), queue_timeout_s=0.1)
    waited = time.monotonic() - started
    assert info.value.status == "StatusCode.UNAVAILABLE"
    assert "Request timeout expired" in info.value.server_message
    # Triton never ran it: its slot is free at once (the blocker and the second hold theirs).
    assert client.shm_stats("queued").in_use == 2
    assert client.shm_stats("queued").abandoned == 0
    blocker.join(30)
    second.join(30)
    assert client.shm_stats("queued").in_use == 0
    assert waited < 10  # refused by Triton, not waited out as an unreachable server


def test_parameters_reach_the_model(client: TritonSHMClient) -> None:
    client.register_shm_model("echo_parameters", max_element_bytes={"PARAMETERS": 1024})
    parameters = {"text": "héllo", "count": 3, "ratio": 0.5, "flag": True}
    out = client.infer_shm(
        "echo_parameters", {"INPUT0": np.array([1.0, 2.0], np.float32)}, parameters=parameters
    )
    assert json.loads(out["PARAMETERS"][0]) == parameters
    np.testing.assert_array_equal(out["DOUBLE"], [2.0, 4.0])


@pytest.mark.parametrize(
    "name", ["shared_memory_region", "sequence_id", "priority", "timeout", "triton_x"]
)
def test_reserved_parameter_names_are_refused(client: TritonSHMClient, name: str) -> None:
    client.register_shm_model("echo_parameters", max_element_bytes={"PARAMETERS": 1024})
    with pytest.raises(InvalidInputError, match=rf"parameters\[{name!r}\].*not") as info:
        client.infer_shm(
            "echo_parameters", {"INPUT0": np.ones(2, np.float32)}, parameters={name: 1}
        )
    assert info.value.actual == name
    assert client.shm_stats("echo_parameters").in_use == 0


def test_only_the_outputs_asked_for(client: TritonSHMClient) -> None:
    client.register_shm_model("echo_parameters", max_element_bytes={"PARAMETERS": 1024})
    x = {"INPUT0": np.array([3.0, 4.0], np.float32)}
    out = client.infer_shm("echo_parameters", x, requested_outputs=["DOUBLE"])
    assert list(out) == ["DOUBLE"]
    np.testing.assert_array_equal(out["DOUBLE"], [6.0, 8.0])
    with pytest.raises(InvalidInputError, match=r"'NOPE'.*outputs: \['PARAMETERS', 'DOUBLE'\]"):
        client.infer_shm("echo_parameters", x, requested_outputs=["NOPE"])
    assert set(client.infer_shm("echo_parameters", x)) == {"PARAMETERS", "DOUBLE"}


def test_options_in_async_calls(client: TritonSHMClient) -> None:
    import asyncio

    client.register_shm_model("echo_parameters", max_element_bytes={"PARAMETERS": 1024})
    out = asyncio.run(
        client.infer_shm_async(
            "echo_parameters",
            {"INPUT0": np.ones(2, np.float32)},
            parameters={"k": "v"},
            requested_outputs=["PARAMETERS"],
            priority=1,
        )
    )
    assert list(out) == ["PARAMETERS"]
    assert json.loads(out["PARAMETERS"][0]) == {"k": "v"}


def test_every_option_in_the_ray_layer(ray_local: str, triton: LocalTritonServer) -> None:
    import ray

    from ray_triton_shm.ray import ShmModel

    model = ShmModel("echo_parameters", max_element_bytes={"PARAMETERS": 1024},
                     parameters={"who": "handle"}, requested_outputs=["PARAMETERS"])  # fmt: skip
    sequence = ShmModel("sequence_sum")
    queued = ShmModel("queued", queue_timeout_s=0.1)

    @ray.remote(num_cpus=0)
    class Queued:
        """``queued`` through the handle in a worker: a long request in a thread of its own,
        then one of the highest priority whose queue timeout expires behind it."""

        def __init__(self) -> None:
            self.long: threading.Thread | None = None

        @staticmethod
        def inputs(delay_ms: int, value: float) -> dict[str, np.ndarray]:
            return {
                "DELAY_MS": np.array([[delay_ms]], np.int32),
                "DATA": np.full((1, 4), value, np.float32),
            }

        def bind(self) -> None:
            queued.infer(self.inputs(0, 0.0))

        def block(self, delay_ms: int) -> None:
            self.long = threading.Thread(target=queued.infer, args=(self.inputs(delay_ms, 1.0),))
            self.long.start()

        def rejected(self) -> str:
            """How Triton refused the call behind the long one (``""``: it did not)."""
            from ray_triton_shm import TritonServerError

            assert self.long is not None
            try:
                queued.infer(self.inputs(10, 2.0), priority=1)
                return ""
            except TritonServerError as exc:
                return exc.server_message
            finally:
                self.long.join()

    @ray.remote
    def use() -> dict:
        # Only what this function defines or imports reaches the worker (not this module).
        import asyncio

        x = {"INPUT0": np.ones(2, np.float32)}
        by_default = model.infer(x)
        merged = model.infer(x, parameters={"call": 1}, requested_outputs=["DOUBLE", "PARAMETERS"])
        awaited = asyncio.run(
            model.infer_async(x, parameters={"call": 2}, requested_outputs=["DOUBLE"])
        )
        sums = [
            int(sequence.infer({"VALUE": np.array([[v]], np.int32)}, sequence_id=77,
                               sequence_start=i == 0, sequence_end=i == 2)["SUM"][0, 0])
            for i, v in enumerate((5, 7, -2))
        ]  # fmt: skip
        return {
            "default": {k: v.tolist() for k, v in by_default.items()},
            "merged": {k: v.tolist() for k, v in merged.items()},
            "awaited": {k: v.tolist() for k, v in awaited.items()},
            "zero_copy": model.zero_copy,
            "sums": sums,
        }

    queuer = Queued.remote()
    try:
        bound = queuer.bind.remote()  # its probe and first call, before Triton is watched
        result = ray.get(use.remote())
        ray.get(bound)
        with runs_in_triton(triton, "queued") as runs:
            ray.get(queuer.block.remote(1200))
            wait_for(runs, what="the long request running in Triton (one instance)")
            result["rejected"] = ray.get(queuer.rejected.remote())
    finally:
        ray.kill(queuer)
    assert result["zero_copy"]
    assert list(result["default"]) == ["PARAMETERS"]
    assert json.loads(result["default"]["PARAMETERS"][0]) == {"who": "handle"}
    assert list(result["merged"]) == ["PARAMETERS", "DOUBLE"]
    assert json.loads(result["merged"]["PARAMETERS"][0]) == {"who": "handle", "call": 1}
    assert result["awaited"] == {"DOUBLE": [2.0, 2.0]}
    assert result["sums"] == [5, 12, 10]
    assert "Request timeout expired" in result["rejected"]


def test_options_make_a_handle_with_other_defaults_by_value_too(ray_local: str) -> None:
    import ray

    from ray_triton_shm.ray import ShmModel

    model = ShmModel("echo_parameters", max_element_bytes={"PARAMETERS": 1024},
                     parameters={"who": "handle"}, requested_outputs=["PARAMETERS"])  # fmt: skip
    other = model.options(parameters={"who": "options"}, requested_outputs=None, priority=1)
    by_value = ShmModel("echo_parameters", max_element_bytes={"PARAMETERS": 1024},
                        zero_copy=False, parameters={"who": "by value"})  # fmt: skip
    x = {"INPUT0": np.array([1.0, 2.0], np.float32)}
    assert list(model.infer(x)) == ["PARAMETERS"]  # the first handle keeps its defaults
    answer = other.infer(x)
    assert set(answer) == {"PARAMETERS", "DOUBLE"}
    assert json.loads(answer["PARAMETERS"][0]) == {"who": "options"}
    assert other._here is model._here  # one binding in this process, shared

    @ray.remote
    def use(handle: ShmModel) -> dict:
        x = {"INPUT0": np.array([3.0, 4.0], np.float32)}
        answer = handle.infer(x, parameters={"call": 1}, priority=0)
        return {"parameters": json.loads(answer["PARAMETERS"][0]), "outputs": sorted(answer),
                "zero_copy": handle.zero_copy}  # fmt: skip

    assert ray.get(use.remote(other)) == {
        "parameters": {"who": "options", "call": 1},
        "outputs": ["DOUBLE", "PARAMETERS"],
        "zero_copy": True,
    }
    # By value, through the node actor: the same options, checked once in the caller.
    answer = by_value.infer(x, parameters={"call": 2}, requested_outputs=["PARAMETERS"])
    assert not by_value.zero_copy
    assert json.loads(answer["PARAMETERS"][0]) == {"who": "by value", "call": 2}
    with pytest.raises(InvalidInputError, match="priority must be"):
        model.options(priority=-1)
