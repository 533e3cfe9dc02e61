"""Turning Triton's answers into the library's errors, alone."""

from __future__ import annotations

import numpy as np
from tritonclient.utils import InferenceServerException

from ray_triton_shm import SharedMemoryNotAllowedError, TritonServerError
from ray_triton_shm._inference._outputs import overflow_message
from ray_triton_shm._slots._specs import ModelSpec, TensorSpec
from ray_triton_shm._wire._triton_errors import (
    is_missing_region,
    is_restart_symptom,
    is_unreachable,
    translate_error,
)


def answer(status: str, message: str) -> InferenceServerException:
    return InferenceServerException(msg=message, status=f"StatusCode.{status}")


def test_errors_keep_triton_status_and_message() -> None:
    error = translate_error(answer("INTERNAL", "boom"), model="m", action="inference")
    assert type(error) is TritonServerError
    assert (error.status, error.server_message, error.model) == ("StatusCode.INTERNAL", "boom", "m")
    assert "inference for model 'm' failed" in str(error)
    refused = translate_error(answer("UNAVAILABLE", "shared memory is not allowed"))
    assert isinstance(refused, SharedMemoryNotAllowedError)


def test_which_answers_are_a_restart() -> None:
    assert is_unreachable(answer("UNAVAILABLE", "failed to connect to all addresses"))
    assert is_restart_symptom(answer("NOT_FOUND", "model 'm' has no available versions"))
    assert not is_restart_symptom(answer("NOT_FOUND", "Request for unknown model: 'x'"))
    assert not is_restart_symptom(answer("INVALID_ARG", "bad"))
    assert is_missing_region(answer("INVALID_ARG", "Unable to find shared memory region 'r'"))


def test_an_output_overflow_says_which_maximum_to_raise() -> None:
    spec = ModelSpec(
        "m",
        "",
        (TensorSpec("X", (1,), np.dtype(np.float32)),),
        (
            TensorSpec("S", (1,), np.dtype(object), max_element_bytes=4),
            TensorSpec("V", (-1,), np.dtype(np.float32), max_shape=(3,)),
        ),
        8,
    )
    message = "shared memory size specified with the request for output '{}' (10 bytes) "
    message += "should be at least 20 bytes to hold the results"
    assert "max_element_bytes={'S': ...} (now 4" in str(overflow_message(spec, message.format("S")))
    assert "max_shapes={'V': ...}" in str(overflow_message(spec, message.format("V")))
    assert overflow_message(spec, "something else") is None
