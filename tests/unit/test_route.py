"""How a pool's tensors reach Triton, alone (no server): the memories each ``transport=``
tries, the checks of ``transport=``, and the bytes a request by value puts on the wire."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from ray_triton_shm import ModelSpecError, SharedMemoryUnreachableError
from ray_triton_shm._inference._inputs import Batch, prepare_batch
from ray_triton_shm._inference._options import REQUEST_OPTIONS, RequestOptions
from ray_triton_shm._inference._options import request_options as checked_options
from ray_triton_shm._inference._requests import ValueRequests
from ray_triton_shm._inference._transport import (
    AUTO_TRANSPORT,
    INLINE,
    SHM,
    TRANSPORTS,
    Transport,
    attempts,
    check_transport,
    node_name,
    unreachable_error,
)
from ray_triton_shm._slots._header import RegionHeader
from ray_triton_shm._slots._memory import BY_VALUE, CUDA, SYSTEM
from ray_triton_shm._slots._specs import REGION_HEADER_BYTES, ModelSpec, TensorSpec

#: A batching model: a float tensor of variable length and a string, two outputs.
SPEC = ModelSpec(
    name="m",
    version="3",
    inputs=(
        TensorSpec("X", (-1,), np.dtype(np.float32), max_shape=(4096,)),
        TensorSpec("T", (1,), np.dtype(object), max_element_bytes=8),
    ),
    outputs=(
        TensorSpec("Y", (-1,), np.dtype(np.float32), max_shape=(4096,)),
        TensorSpec("N", (1,), np.dtype(np.int32)),
    ),
    max_batch_size=4,
)
#: A model that does not batch.
NOBATCH = ModelSpec(
    name="flat",
    version="",
    inputs=(
        TensorSpec("A", (2, 3), np.dtype(np.int64)),
        TensorSpec("B", (4,), np.dtype(np.float32)),
    ),
    outputs=(TensorSpec("C", (4,), np.dtype(np.float32)),),
    max_batch_size=0,
)
#: A batching model of fixed-size float rows.
ROWS = ModelSpec(
    name="rows",
    version="",
    inputs=(TensorSpec("X", (3,), np.dtype(np.float32)),),
    outputs=(TensorSpec("Y", (3,), np.dtype(np.float32)),),
    max_batch_size=2,
)


def request_options(model: str, **given: Any) -> RequestOptions | None:
    """The request options ``given``, checked, the others at their defaults."""
    return checked_options(model, **{o.name: o.default for o in REQUEST_OPTIONS} | given)


def _parse(wire: bytes) -> service_pb2.ModelInferRequest:
    return service_pb2.ModelInferRequest.FromString(wire)


def _texts(n: int) -> np.ndarray:
    return np.array([[f"t{i}".encode() * (i % 4)] for i in range(n)], dtype=object)


# ---------------------------------------------------------------- the memories tried


@pytest.mark.parametrize(
    ("transport", "memory", "expected"),
    [
        (AUTO_TRANSPORT, SYSTEM, (SYSTEM, BY_VALUE)),
        (AUTO_TRANSPORT, CUDA, (CUDA, SYSTEM, BY_VALUE)),
        (SHM, SYSTEM, (SYSTEM,)),
        (SHM, CUDA, (CUDA, SYSTEM)),
        (INLINE, SYSTEM, (BY_VALUE,)),
        (INLINE, CUDA, (BY_VALUE,)),
    ],
)
def test_attempts_try_shared_memory_first_and_by_value_only_where_allowed(
    transport: str, memory: str, expected: tuple[str, ...]
) -> None:
    assert attempts(transport, memory) == expected


def test_every_transport_and_memory_is_covered_above() -> None:
    assert set(TRANSPORTS) == {AUTO_TRANSPORT, SHM, INLINE}
    for memory in (SYSTEM, CUDA):
        assert BY_VALUE not in attempts(SHM, memory)  # "shm" never falls back to by value
        assert attempts(AUTO_TRANSPORT, memory)[-1] == BY_VALUE  # "auto" always ends there
        assert attempts(AUTO_TRANSPORT, memory)[:-1] == attempts(SHM, memory)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_check_transport_takes_the_three_values(transport: str) -> None:
    check_transport("m", transport)


@pytest.mark.parametrize("transport", ["bogus", "SHM", "", "system", "cuda"])
def test_check_transport_refuses_anything_else_naming_model_and_value(transport: str) -> None:
    with pytest.raises(ModelSpecError) as info:
        check_transport("my_model", transport)
    assert info.value.model == "my_model"
    message = str(info.value)
    assert "'my_model'" in message and f"got {transport!r}" in message
    assert all(repr(value) in message for value in TRANSPORTS)


def test_a_transport_by_value_says_so() -> None:
    assert Transport(INLINE, "why").by_value and not Transport(SHM, "why").by_value
    assert Transport(SHM, "why").asked == AUTO_TRANSPORT


def test_a_pool_by_value_stores_and_reports_the_word_of_its_transport() -> None:
    """Headers of other versions store the memory kind by its index, and stats, metrics and
    ``status`` say ``"inline"`` for a pool by value: the memory's word is the transport's."""
    buffer = bytearray(REGION_HEADER_BYTES)
    RegionHeader(buffer, 0).set_memory(BY_VALUE)
    assert memoryview(buffer).cast("q")[3] == 2  # the header word of the memory kind
    assert RegionHeader(bytes(buffer), 0).memory == INLINE == "inline"


def test_the_unreachable_error_names_model_node_and_reasons() -> None:
    error = unreachable_error("m", "triton:8001", ["first reason", "second reason"])
    assert isinstance(error, SharedMemoryUnreachableError)
    assert (error.model, error.node) == ("m", node_name())
    assert error.reason == "first reason; second reason"
    message = str(error)
    assert "'m'" in message and "triton:8001" in message and node_name() in message
    assert "first reason; second reason" in message and "transport='auto'" in message


# ---------------------------------------------------------------- the request by value


def test_a_request_by_value_carries_each_input_s_bytes_shape_and_id() -> None:
    requests = ValueRequests(SPEC, slot_count=2)
    x = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    texts = _texts(6)
    batch = prepare_batch(SPEC, {"X": x, "T": texts})
    wire, written = requests.write(0, None, batch, 4, 6, "req-1", None)  # type: ignore[arg-type]
    request = _parse(wire)
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "req-1")
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [
        ("X", "FP32", [2, 5]),
        ("T", "BYTES", [2, 1]),
    ]
    assert [o.name for o in request.outputs] == ["Y", "N"]
    assert not any(i.parameters for i in request.inputs)  # no shared memory named
    assert not any(o.parameters for o in request.outputs)
    expected = [x[4:6].tobytes(), serialize_byte_tensor(texts[4:6]).item()]
    assert list(request.raw_input_contents) == expected
    assert written == [len(b) for b in expected]
    assert not request.parameters


def test_a_request_by_value_follows_shape_id_and_data_from_call_to_call() -> None:
    """The request without its tensors is kept per slot; whatever changes is written anew."""
    requests = ValueRequests(SPEC, slot_count=2)
    first = prepare_batch(SPEC, {"X": np.ones((3, 5), np.float32), "T": _texts(3)})
    requests.write(1, None, first, 0, 3, "a", None)  # type: ignore[arg-type]
    # Same shapes and id, other values: the values are the new ones.
    again = prepare_batch(SPEC, {"X": np.full((3, 5), 7, np.float32), "T": _texts(3)})
    request = _parse(requests.write(1, None, again, 0, 3, "a", None)[0])  # type: ignore[arg-type]
    assert request.id == "a" and list(request.inputs[0].shape) == [3, 5]
    assert request.raw_input_contents[0] == np.full((3, 5), 7, np.float32).tobytes()
    # Another shape and id on the same slot.
    longer = np.arange(2 * 9, dtype=np.float32).reshape(2, 9)
    other = prepare_batch(SPEC, {"X": longer, "T": _texts(2)})
    request = _parse(requests.write(1, None, other, 0, 2, "b", None)[0])  # type: ignore[arg-type]
    assert request.id == "b" and list(request.inputs[0].shape) == [2, 9]
    assert list(request.inputs[1].shape) == [2, 1]
    assert request.raw_input_contents[0] == longer.tobytes()
    # The other slot is untouched by either: its first request has the empty id.
    request = _parse(requests.write(0, None, first, 0, 1, "", None)[0])  # type: ignore[arg-type]
    assert request.id == "" and list(request.inputs[0].shape) == [1, 5]


def test_a_request_by_value_carries_its_options() -> None:
    requests = ValueRequests(SPEC, slot_count=1)
    batch = prepare_batch(SPEC, {"X": np.ones((1, 2), np.float32), "T": _texts(1)})
    options = request_options(
        "m",
        priority=2,
        queue_timeout_s=0.25,
        parameters={"flag": True, "count": 3, "ratio": 0.5, "tag": "x"},
        requested_outputs=["N"],
    )
    request = _parse(requests.write(0, None, batch, 0, 1, "opt", options)[0])  # type: ignore[arg-type]
    assert [o.name for o in request.outputs] == ["N"]
    parameters = request.parameters
    assert parameters["priority"].uint64_param == 2
    assert parameters["timeout"].int64_param == 250_000
    assert parameters["flag"].bool_param is True
    assert parameters["count"].int64_param == 3
    assert parameters["ratio"].double_param == 0.5
    assert parameters["tag"].string_param == "x"
    assert request.id == "opt" and len(request.raw_input_contents) == 2
    # The options are the call's own: the next call without them asks for every output.
    plain = _parse(requests.write(0, None, batch, 0, 1, "opt", None)[0])  # type: ignore[arg-type]
    assert [o.name for o in plain.outputs] == ["Y", "N"] and not plain.parameters


def test_a_shape_first_sent_with_options_is_the_shape_sent_without_them() -> None:
    requests = ValueRequests(SPEC, slot_count=1)
    one = prepare_batch(SPEC, {"X": np.ones((1, 2), np.float32), "T": _texts(1)})
    three = prepare_batch(SPEC, {"X": np.ones((3, 2), np.float32), "T": _texts(3)})
    requests.write(0, None, one, 0, 1, "", None)  # type: ignore[arg-type]
    options = request_options("m", priority=1)
    with_options = _parse(requests.write(0, None, three, 0, 3, "", options)[0])  # type: ignore[arg-type]
    assert list(with_options.inputs[0].shape) == [3, 2]
    plain = _parse(requests.write(0, None, three, 0, 3, "", None)[0])  # type: ignore[arg-type]
    assert list(plain.inputs[0].shape) == [3, 2] and not plain.parameters


def test_a_request_by_value_of_a_sequence_step_says_its_sequence() -> None:
    requests = ValueRequests(SPEC, slot_count=1)
    batch = prepare_batch(SPEC, {"X": np.ones((1, 2), np.float32), "T": _texts(1)})
    options = request_options("m", sequence_id="s-1", sequence_start=True)
    request = _parse(requests.write(0, None, batch, 0, 1, "", options)[0])  # type: ignore[arg-type]
    assert request.parameters["sequence_id"].string_param == "s-1"
    assert request.parameters["sequence_start"].bool_param is True
    assert request.parameters["sequence_end"].bool_param is False


@pytest.mark.parametrize("rows", [1, 4])
def test_large_inputs_by_value_get_multi_byte_lengths(rows: int) -> None:
    """A raw input's length is a varint: 2 bytes from 128, 3 from 16 KiB."""
    x = np.random.default_rng(rows).standard_normal((rows, 4096), dtype=np.float32)
    batch = prepare_batch(SPEC, {"X": x, "T": _texts(rows)})
    request = _parse(ValueRequests(SPEC, 1).write(0, None, batch, 0, rows, "", None)[0])  # type: ignore[arg-type]
    assert request.raw_input_contents[0] == x.tobytes()
    assert request.raw_input_contents[1] == serialize_byte_tensor(_texts(rows)).item()


def test_a_request_by_value_of_a_model_that_does_not_batch_has_no_batch_dim() -> None:
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.array([1.5, 2.5, 3.5, 4.5], np.float32)
    batch = prepare_batch(NOBATCH, {"A": a, "B": b})
    wire, written = ValueRequests(NOBATCH, 1).write(0, None, batch, 0, 1, "", None)  # type: ignore[arg-type]
    request = _parse(wire)
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [
        ("A", "INT64", [2, 3]),
        ("B", "FP32", [4]),
    ]
    assert list(request.raw_input_contents) == [a.tobytes(), b.tobytes()]
    assert written == [48, 16] and request.model_version == ""


# ---------------------------------------------------------------- a chunk's bytes


def _chunks(batch: Batch) -> list[bytes]:
    return [b"".join(bytes(v) for v in batch.chunk_values(a, b)) for a, b in batch.chunks()]


def test_chunk_values_of_a_contiguous_array_are_views_of_it() -> None:
    x = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    batch = prepare_batch(ROWS, {"X": x})
    assert _chunks(batch) == [x[0:2].tobytes(), x[2:4].tobytes(), x[4:5].tobytes()]
    for start, stop in batch.chunks():
        (value,) = batch.chunk_values(start, stop)
        assert np.shares_memory(np.frombuffer(value, np.float32), x)  # no copy


def test_chunk_values_of_a_list_of_samples_are_the_rows_stacked() -> None:
    samples = [np.full(3, i, np.float32) for i in range(5)]
    batch = prepare_batch(ROWS, {"X": samples})
    assert _chunks(batch) == [np.stack(samples[a:b]).tobytes() for a, b in batch.chunks()]
    assert batch.size == 5 and len(batch.chunks()) == 3


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x[::2],  # every other row
        lambda x: np.asfortranarray(x),  # column-major
        lambda x: np.arange(6 * 10, dtype=np.float32).reshape(6, 10)[:, 2:5],  # columns
        lambda x: x[::-1],  # negative strides
        lambda x: np.broadcast_to(np.arange(3, dtype=np.float32), (6, 3)),  # stride 0
    ],
    ids=["rows-strided", "fortran", "columns", "reversed", "broadcast"],
)
def test_chunk_values_of_a_non_contiguous_array_are_its_rows_in_c_order(make) -> None:  # type: ignore[no-untyped-def]
    x = make(np.arange(12 * 3, dtype=np.float32).reshape(12, 3))
    batch = prepare_batch(ROWS, {"X": x})
    assert _chunks(batch) == [np.ascontiguousarray(x[a:b]).tobytes() for a, b in batch.chunks()]


def test_chunk_values_of_a_model_that_does_not_batch_are_the_whole_arrays() -> None:
    a = np.arange(12, dtype=np.int64).reshape(3, 4)[:2, :3]  # non-contiguous
    b = np.arange(8, dtype=np.float32)[::2]
    batch = prepare_batch(NOBATCH, {"A": a, "B": b})
    assert batch.chunks() == [(0, 1)]
    assert [bytes(v) for v in batch.chunk_values(0, 1)] == [
        np.ascontiguousarray(a).tobytes(),
        np.ascontiguousarray(b).tobytes(),
    ]


def test_chunk_values_of_an_empty_tensor_are_empty() -> None:
    x = np.zeros((3, 0), np.float32)
    batch = prepare_batch(SPEC, {"X": x, "T": _texts(3)})
    first, _ = batch.chunk_values(0, 3)
    assert bytes(first) == b""
