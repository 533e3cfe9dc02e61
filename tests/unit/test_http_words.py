"""The HTTP route's words, without a server: a prepared request as Triton's JSON, and Triton's
answers (whole, in pieces, chunked, with binary outputs) as the engine's outputs."""

from __future__ import annotations

import json
import pickle

import grpc
import pytest
from tritonclient.grpc import service_pb2

from ray_triton_shm._inference._options import RequestOptions
from ray_triton_shm._wire._http import (
    HttpError,
    _parse,
    http_body,
    http_headers,
    http_path,
    http_url_for,
)


def _request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="m", id="req-1")
    entry = request.inputs.add(name="X", datatype="FP32", shape=[2, 3])
    entry.parameters["shared_memory_region"].string_param = "region@0"
    entry.parameters["shared_memory_offset"].int64_param = 128
    entry.parameters["shared_memory_byte_size"].int64_param = 24
    out = request.outputs.add(name="Y")
    out.parameters["shared_memory_region"].string_param = "region@0"
    out.parameters["shared_memory_offset"].int64_param = 256
    out.parameters["shared_memory_byte_size"].int64_param = 24
    request.outputs.add(name="TEXT")  # answered in the response
    return request


def test_a_prepared_request_as_tritons_json() -> None:
    options = RequestOptions(
        priority=2, sequence_id="s", sequence_start=True, parameters=(("k", 1.5),)
    )
    document = json.loads(http_body(options.apply(_request())) or b"")
    assert document["id"] == "req-1"
    assert document["parameters"] == {
        "priority": 2,
        "sequence_id": "s",
        "sequence_start": True,
        "sequence_end": False,
        "k": 1.5,
    }
    assert document["inputs"] == [
        {
            "name": "X",
            "datatype": "FP32",
            "shape": [2, 3],
            "parameters": {
                "shared_memory_region": "region@0",
                "shared_memory_offset": 128,
                "shared_memory_byte_size": 24,
            },
        }
    ]
    assert document["outputs"][0]["parameters"]["shared_memory_offset"] == 256
    assert document["outputs"][1] == {"name": "TEXT", "parameters": {"binary_data": True}}


def test_a_request_with_tensors_inline_stays_on_grpc() -> None:
    request = _request()
    request.raw_input_contents.append(b"\0" * 24)
    assert http_body(request) is None


def test_paths_and_addresses() -> None:
    assert http_path("m", "") == b"/v2/models/m/infer"
    assert http_path("m", "3") == b"/v2/models/m/versions/3/infer"
    assert http_path("a b", "") is None  # Triton does not decode an escaped path
    assert http_url_for("localhost:8001") == "localhost:8000"
    assert http_url_for("[::1]:8001") == "[::1]:8000"
    with pytest.raises(ValueError, match="cannot derive"):
        http_url_for("localhost")
    assert http_headers([("triton-grpc-protocol-infer-key", "v"), ("x-other", "w")]) == [
        ("infer-key", "v"),
        ("x-other", "w"),
    ]


_ANSWER = b'{"outputs":[{"name":"Y","datatype":"FP32","shape":[2,3]},' + (
    b'{"name":"TEXT","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":7}}]}'
)


def test_an_answer_with_binary_outputs_in_pieces() -> None:
    body = _ANSWER + b"\3\0\0\0abc"
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (len(_ANSWER), len(body))
    )
    whole = head + body
    for cut in (10, len(head) - 2, len(whole) - 1):
        assert _parse(whole[:cut]) is None
    response = _parse(whole)
    assert response is not None and not response.close
    assert response.answer() == [
        ("Y", "FP32", (2, 3), b""),
        ("TEXT", "BYTES", (1,), b"\3\0\0\0abc"),
    ]


def test_a_chunked_answer_and_a_closing_connection() -> None:
    body = b'{"outputs":[]}'
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    chunked += b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (5, body[:5], len(body) - 5, body[5:])
    assert _parse(chunked[:-3]) is None
    response = _parse(chunked)
    assert response is not None and response.close and response.answer() == []


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (404, grpc.StatusCode.NOT_FOUND),
        (500, grpc.StatusCode.INTERNAL),
        (503, grpc.StatusCode.UNAVAILABLE),
        (418, grpc.StatusCode.UNKNOWN),
    ],
)
def test_a_refusal_is_an_answered_error_in_grpcs_terms(status: int, code: grpc.StatusCode) -> None:
    body = b'{"error":"Unable to find shared memory region: \'r\'"}'
    head = b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n" % (status, len(body))
    response = _parse(head + body)
    assert response is not None
    with pytest.raises(HttpError) as refused:
        response.answer()
    assert refused.value.code() is code and refused.value.answered
    assert refused.value.details() == "Unable to find shared memory region: 'r'"
    copy = pickle.loads(pickle.dumps(refused.value))
    assert (copy.code(), copy.details(), copy.answered) == (code, refused.value.details(), True)
