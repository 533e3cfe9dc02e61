"""Input validation and BYTES serialization, alone: errors before any write, chunk offsets."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import serialize_byte_tensor

from ray_triton_shm import InvalidInputError
from ray_triton_shm._inference._inputs import prepare_batch
from ray_triton_shm._slots._specs import ModelSpec, TensorSpec

SPEC = ModelSpec(
    name="m",
    version="",
    inputs=(
        TensorSpec("X", (2,), np.dtype(np.float32)),
        TensorSpec("T", (1,), np.dtype(object), max_element_bytes=8),
    ),
    outputs=(TensorSpec("Y", (2,), np.dtype(np.float32)),),
    max_batch_size=4,
)


def test_a_good_batch_is_chunked_and_its_strings_serialized() -> None:
    texts = np.array([[b"a"], ["é"], [b""], [b"12345678"], [b"\x00"]], dtype=object)
    batch = prepare_batch(SPEC, {"X": np.zeros((5, 2), np.float32), "T": texts})
    assert batch.size == 5 and batch.chunks() == [(0, 4), (4, 5)]
    encoded = batch.encoded["T"]
    utf8 = np.array([[t.encode() if isinstance(t, str) else t] for t in texts[:, 0]], object)
    assert encoded.data == serialize_byte_tensor(utf8).item()
    assert bytes(encoded.chunk(4, 5)) == serialize_byte_tensor(utf8[4:]).item()


@pytest.mark.parametrize(
    ("inputs", "tensor", "pattern"),
    [
        ({"X": np.zeros((1, 2), np.float64), "T": np.array([[b"a"]], object)}, "X", "float32"),
        ({"X": np.zeros((1, 3), np.float32), "T": np.array([[b"a"]], object)}, "X", r"\(1, 3\)"),
        ({"X": np.zeros((1, 2), np.float32), "T": np.array([[b"a" * 9]], object)}, "T", "9 bytes"),
        ({"X": np.zeros((1, 2), np.float32), "T": np.array([[1]], object)}, "T", "bytes or str"),
        ({"X": np.zeros((1, 2), np.float32), "T": np.zeros((1, 1))}, "T", "BYTES tensor"),
        ({"X": np.zeros((2, 2), np.float32), "T": np.array([[b"a"]], object)}, "T", "lengths"),
        ({"X": np.zeros((1, 2), np.float32)}, "T", "missing input 'T'"),
    ],
)
def test_bad_inputs_name_the_tensor(inputs: dict, tensor: str, pattern: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidInputError, match=pattern) as info:
        prepare_batch(SPEC, inputs)
    assert info.value.model == "m" and info.value.tensor == tensor
