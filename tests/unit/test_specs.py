"""Spec resolution and slot layout, alone: from a model config, with maxima, aligned."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ray_triton_shm import ModelSpecError, TritonServerError
from ray_triton_shm._slots._specs import (
    REGION_HEADER_BYTES,
    SLOT_ALIGNMENT,
    TENSOR_ALIGNMENT,
    SlotLayout,
    resolve_model_spec,
)

CONFIG = {
    "max_batch_size": 8,
    "input": [
        {"name": "TEXT", "data_type": "TYPE_STRING", "dims": ["1"]},
        {"name": "IDS", "data_type": "TYPE_INT32", "dims": ["-1"]},
    ],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": ["3"]}],
}


def resolve(**kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "inputs": None,
        "outputs": None,
        "max_batch_size": None,
        "model_version": "",
        "max_shapes": {"IDS": (5,)},
        "max_element_bytes": {"TEXT": 100},
        "load_config": lambda: CONFIG,
    }
    return resolve_model_spec("m", **(options | kwargs))


def test_from_the_model_config_with_maxima() -> None:
    spec = resolve()
    text, ids = spec.inputs
    assert (text.dtype, text.is_bytes, text.max_element_bytes) == (np.dtype(object), True, 100)
    assert text.datatype == "BYTES" and text.max_sample_bytes == 104
    assert (ids.shape, ids.max_shape, ids.max_sample_bytes) == ((-1,), (5,), 20)
    assert spec.max_batch_size == 8 and spec.has_bytes and spec.bytes_outputs == frozenset()


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"max_shapes": {}}, r"'IDS'.*variable dims.*max_shapes="),
        ({"max_element_bytes": {}}, r"'TEXT'.*BYTES.*max_element_bytes="),
        ({"max_element_bytes": {"TEXT": 1, "IDS": 1}}, r"\['IDS'\], which are not BYTES"),
        ({"max_element_bytes": {"TEXT": -1}}, r"'TEXT'.*int >= 0"),
        ({"max_shapes": {"IDS": (5,), "NOPE": (1,)}}, r"unknown tensors \['NOPE'\]"),
        ({"max_batch_size": -1}, r"max_batch_size must be >= 0"),
    ],
)
def test_unusable_specs_name_what_is_wrong(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ModelSpecError, match=pattern):
        resolve(**kwargs)


def test_config_given_whole_is_read_for_the_transaction_policy_alone() -> None:
    """Specs given whole: the config is read only to know whether the model streams, and a
    config that cannot be read (a restricted protocol, no such model yet) is no error."""

    def refused() -> Any:
        raise TritonServerError("model configuration refused", model="m")

    for config, decoupled in (
        (refused, False),
        (lambda: {"model_transaction_policy": {"decoupled": True}}, True),
        (lambda: {"name": "m"}, False),
    ):
        spec = resolve(
            inputs=[("X", (2,), np.float32)],
            outputs=[("Y", (-1,), "FP32")] if decoupled else [("Y", (2,), "FP32")],
            max_batch_size=4,
            max_shapes=None,
            max_element_bytes=None,
            load_config=config,
        )
        assert [t.name for t in spec.inputs] == ["X"] and spec.outputs[0].dtype == np.float32
        assert spec.decoupled is decoupled


def test_a_streaming_model_s_outputs_take_no_room_and_need_no_maximum() -> None:
    """Its outputs come back in the responses: variable dims and BYTES without a maximum."""
    spec = resolve(
        inputs=[("X", (2,), np.float32)],
        outputs=[("TOKENS", (-1,), "INT32"), ("TEXT", (1,), "BYTES")],
        max_batch_size=0,
        max_shapes=None,
        max_element_bytes=None,
        load_config=lambda: {"model_transaction_policy": {"decoupled": True}},
    )
    layout = SlotLayout.for_model(spec)
    assert spec.inline_outputs == {"TOKENS", "TEXT"}
    assert layout.output_offsets == {} and set(layout.capacities) == {"in:X"}


def test_layout_aligns_tensors_and_slots_after_the_header() -> None:
    spec = resolve()
    layout = SlotLayout.for_model(spec)
    offsets = [*layout.input_offsets.values(), *layout.output_offsets.values()]
    assert offsets == sorted(offsets) and all(o % TENSOR_ALIGNMENT == 0 for o in offsets)
    assert layout.capacities["in:TEXT"] == 8 * 104 and layout.capacities["in:IDS"] == 8 * 20
    assert layout.slot_bytes % SLOT_ALIGNMENT == 0
    assert layout.slot_offset(0) == REGION_HEADER_BYTES
    assert layout.region_bytes(3) == REGION_HEADER_BYTES + 3 * layout.slot_bytes
