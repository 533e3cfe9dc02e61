"""BYTES (string) tensors through shared memory: the core client, async, chunking, errors, and
the Ray layer (zero-copy, by value, Ray Data), against the real Triton."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import ray
from ray import cloudpickle
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from ray_triton_shm import InvalidInputError, ModelSpecError, TritonServerError, TritonSHMClient
from ray_triton_shm._client import registry_of
from ray_triton_shm._inference._bytes import decode, encode
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES
from ray_triton_shm.ray import ShmModel, ShmPredictor, get_node_actor

cloudpickle.register_pickle_by_value(sys.modules[__name__])

UPPER_MAXIMA = {"TEXT": 70_000, "UPPER": 70_000}
rng = np.random.default_rng(0)


def random_texts(count: int) -> np.ndarray:
    """Random bytes of many lengths, with the cases that break naive code."""
    fixed = [b"", b"\x00", b"a\x00b\x00", b"\xff" * 3, "héllo wörld ✓".encode(), b"x" * 65_536]
    texts = fixed + [
        rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes()
        for _ in range(count - len(fixed))
    ]
    return np.array(texts[:count], dtype=np.object_).reshape(count, 1)


def upper_expected(texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    upper = np.array([[t.upper()] for t in texts[:, 0]], dtype=np.object_)
    return upper, np.array([[len(t)] for t in texts[:, 0]], dtype=np.int32)


def test_serialization_matches_tritonclient_exactly() -> None:
    texts = random_texts(40)
    encoded = encode(texts, 40, model="m", tensor="t", max_element_bytes=70_000)
    assert encoded.data == serialize_byte_tensor(texts).item()
    assert encoded.chunk(3, 7) == serialize_byte_tensor(texts[3:7]).item()
    space = np.frombuffer(encoded.data + b"\x00" * 16, np.uint8)
    decoded = decode(space, 40)
    assert decoded is not None and decoded[1] == len(encoded.data)
    assert decoded[0].tolist() == deserialize_bytes_tensor(encoded.data).tolist()
    assert decode(space[:100], 40) is None  # runs past its space


def test_round_trip_of_random_bytes_exact_with_chunks(client: TritonSHMClient) -> None:
    client.register_shm_model("upper", pool_size=2, max_element_bytes=UPPER_MAXIMA)
    spec = client.registered_models["upper"]
    assert [t.datatype for t in spec.inputs + spec.outputs] == ["BYTES", "BYTES", "INT32"]
    texts = random_texts(21)  # three chunks of at most 8
    out = client.infer_shm("upper", {"TEXT": texts})
    upper, length = upper_expected(texts)
    assert out["UPPER"].dtype == np.object_ and out["UPPER"].shape == (21, 1)
    assert out["UPPER"].tolist() == upper.tolist()
    np.testing.assert_array_equal(out["LENGTH"], length)
    assert client.shm_stats("upper").in_use == 0


def test_str_s_and_u_inputs_are_utf8_bytes(client: TritonSHMClient) -> None:
    client.register_shm_model("strings", max_element_bytes={"INPUT0": 64, "OUTPUT0": 64})
    words = ["", "plain", "héllo wörld", "ümlaut ✓", "a\x00b"]
    as_str = np.array(words, dtype=np.object_).reshape(-1, 1)
    out = client.infer_shm("strings", {"INPUT0": as_str})["OUTPUT0"]
    assert out.ravel().tolist() == [w.encode() for w in words]
    unicode = np.array(words).reshape(-1, 1)  # dtype <U
    assert client.infer_shm("strings", {"INPUT0": unicode})["OUTPUT0"].tolist() == out.tolist()
    fixed = np.array([b"ab", b"c"], dtype="S2").reshape(-1, 1)
    assert client.infer_shm("strings", {"INPUT0": fixed})["OUTPUT0"].ravel().tolist() == [
        b"ab",
        b"c",
    ]
    per_sample = [np.array([b"x"], dtype=np.object_), np.array([b"yz"], dtype=np.object_)]
    out = client.infer_shm("strings", {"INPUT0": per_sample})["OUTPUT0"]
    assert out.ravel().tolist() == [b"x", b"yz"]


def test_async_round_trip(client: TritonSHMClient) -> None:
    client.register_shm_model("upper", pool_size=2, max_element_bytes=UPPER_MAXIMA)
    texts = random_texts(17)

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(
            *(client.infer_shm_async("upper", {"TEXT": texts}) for _ in range(3))
        )

    upper, _ = upper_expected(texts)
    for out in asyncio.run(main()):
        assert out["UPPER"].tolist() == upper.tolist()


def test_too_long_an_element_is_refused_before_anything_is_written(
    client: TritonSHMClient,
) -> None:
    client.register_shm_model("upper", pool_size=1, max_element_bytes={"TEXT": 8, "UPPER": 8})
    pool = registry_of(client).get("upper")
    slots = slice(REGION_HEADER_BYTES, pool.region.size)  # the header counts the failures
    pool.region.buffer[slots] = b"\xab" * (pool.region.size - REGION_HEADER_BYTES)
    before = bytes(pool.region.buffer[slots])
    texts = np.array([[b"short"], [b"just 9 b!"]], dtype=np.object_)
    with pytest.raises(
        InvalidInputError, match=r"'TEXT' element 1 is 9 bytes.*max_element_bytes of 8"
    ):
        client.infer_shm("upper", {"TEXT": texts})
    with pytest.raises(InvalidInputError, match=r"'TEXT'.*bytes or str, got int"):
        client.infer_shm("upper", {"TEXT": np.array([[1]], dtype=np.object_)})
    with pytest.raises(InvalidInputError, match=r"'TEXT' is a BYTES tensor.*float64"):
        client.infer_shm("upper", {"TEXT": np.zeros((1, 1))})
    assert bytes(pool.region.buffer[slots]) == before
    assert client.shm_stats("upper").in_use == 0
    assert pool.header.failures()["bad_input"] == 3


def test_an_output_larger_than_its_slot_says_which_maximum_to_raise(
    client: TritonSHMClient,
) -> None:
    # 8 x 604 bytes of room for OUTPUT0: more than is answered inline, so it is in the slot.
    maxima = {"INPUT0": 2000, "OUTPUT0": 600}
    client.register_shm_model("strings", pool_size=1, max_element_bytes=maxima)
    assert client.registered_models["strings"].inline_outputs == frozenset()
    texts = np.array([[b"x" * 1000]] * 8, dtype=np.object_)  # 8 x 1004 bytes out
    with pytest.raises(
        TritonServerError, match=r"'OUTPUT0' did not fit.*max_element_bytes"
    ) as info:
        client.infer_shm("strings", {"INPUT0": texts})
    assert "should be at least" in info.value.server_message
    assert client.shm_stats("strings").in_use == 0
    out = client.infer_shm("strings", {"INPUT0": texts[:4]})  # 4 x 1004 bytes still fit
    assert out["OUTPUT0"].tolist() == [[b"x" * 1000]] * 4


def test_small_bytes_outputs_come_back_in_the_response(client: TritonSHMClient) -> None:
    client.register_shm_model("upper", pool_size=1, max_element_bytes={"TEXT": 64, "UPPER": 64})
    assert client.registered_models["upper"].inline_outputs == frozenset({"UPPER"})
    short = [t for t in random_texts(6)[:, 0] if len(t) <= 64]  # the awkward ones: "", NULs
    texts = np.array(short * 3, dtype=np.object_).reshape(-1, 1)  # two chunks
    out = client.infer_shm("upper", {"TEXT": texts})
    upper, length = upper_expected(texts)
    assert out["UPPER"].tolist() == upper.tolist()
    np.testing.assert_array_equal(out["LENGTH"], length)


def test_a_bytes_spec_from_np_bytes_needs_its_maximum(client: TritonSHMClient) -> None:
    with pytest.raises(ModelSpecError, match=r"'TEXT'.*max_element_bytes=\{'TEXT'"):
        client.register_shm_model(
            "upper",
            inputs=[("TEXT", (1,), np.bytes_)],
            outputs=[("UPPER", (1,), np.object_), ("LENGTH", (1,), np.int32)],
            max_batch_size=8,
        )


# --------------------------------------------------------------------------------------
# The Ray layer
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_with_actor(ray_local: str) -> Iterator[str]:
    actor = get_node_actor(url=ray_local, slots=4)
    try:
        yield ray_local
    finally:
        ray.get(actor.shutdown.remote())
        ray.kill(actor)


@ray.remote(num_cpus=0)
def _infer_upper(texts: np.ndarray, zero_copy: bool) -> tuple[bool, dict[str, np.ndarray]]:
    model = ShmModel("upper", max_element_bytes=UPPER_MAXIMA, zero_copy=zero_copy)
    try:
        return model.zero_copy, model.infer({"TEXT": texts})
    finally:
        model.close()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero-copy", "by-value"])
def test_shm_model_carries_bytes(ray_with_actor: str, zero_copy: bool) -> None:
    texts = random_texts(19)
    used_zero_copy, out = ray.get(_infer_upper.remote(texts, zero_copy))
    assert used_zero_copy is zero_copy
    upper, length = upper_expected(texts)
    assert out["UPPER"].tolist() == upper.tolist()
    np.testing.assert_array_equal(out["LENGTH"], length)


def test_ray_data_string_column(ray_with_actor: str) -> None:
    words = [f"row {i} héllo" for i in range(50)] + [""]
    ds = ray.data.from_items([{"text": w, "id": i} for i, w in enumerate(words)])
    result = ds.map_batches(
        ShmPredictor,
        fn_constructor_kwargs={
            "model_name": "upper",
            "max_element_bytes": UPPER_MAXIMA,
            "input_columns": {"text": "TEXT"},
            "keep_columns": ["id"],
        },
        batch_size=16,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=1),
    ).take_all()
    by_id = {row["id"]: row for row in result}
    assert len(by_id) == len(words)
    for i, word in enumerate(words):
        assert np.asarray(by_id[i]["UPPER"]).tolist() == [word.encode().upper()]
        assert np.asarray(by_id[i]["LENGTH"]).tolist() == [len(word.encode())]
