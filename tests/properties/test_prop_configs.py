"""Model configurations the library reads: Triton's JSON (``resolve_model_spec``), and the
``config.pbtxt`` and ONNX graphs of ``local/`` (the ONNX adapter's config): a spec (with a
slot layout) or a named error, never a crash."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from _counts import examples, tried
from hypothesis import example, given
from hypothesis import strategies as st

from ray_triton_shm import LocalServerError, ModelSpecError
from ray_triton_shm._slots._specs import SlotLayout, resolve_model_spec
from ray_triton_shm.local._onnx import _TRITON_TYPES, _adapter_config
from ray_triton_shm.local._repository import model_backend

DATATYPES = [
    *(f"TYPE_{t}" for t in ("BOOL", "UINT8", "INT32", "INT64", "FP16", "FP32", "FP64")),
    *("TYPE_STRING", "BYTES", "FP32", "TYPE_BF16", "TYPE_INVALID", "TYPE_FP128", "", "float32"),
]
dim = st.one_of(
    st.integers(-1, 9), st.just(-1), st.just(0), st.integers(-5, -2), st.integers(2**31, 2**62)
)
# gRPC's JSON writes int64s as strings; a stray writer may write anything.
json_dim = st.one_of(dim, dim.map(str), st.sampled_from(["x", None, 1.5, []]))
dims = st.lists(dim, max_size=4)
tensor = st.fixed_dictionaries(
    {"name": st.text(max_size=8), "data_type": st.sampled_from(DATATYPES)},
    optional={
        "dims": st.one_of(dims, st.lists(json_dim, max_size=3)),
        "reshape": st.one_of(st.fixed_dictionaries({"shape": dims}), st.just({})),
    },
)
tensors = st.one_of(
    st.lists(tensor, min_size=1, max_size=3), st.lists(st.integers() | st.text(), max_size=2)
)
config = st.fixed_dictionaries(
    {},
    optional={
        "max_batch_size": st.one_of(st.integers(-2, 2**40), st.just("8"), st.just("eight")),
        "input": tensors,
        "output": tensors,
        "model_transaction_policy": st.fixed_dictionaries({"decoupled": st.booleans()}),
    },
)
#: skl2onnx's classifier, as its users write the label (issue 63).
SKL2ONNX = {
    "max_batch_size": 8,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": ["64"]}],
    "output": [
        {"name": "label", "data_type": "TYPE_INT64", "dims": ["-1"], "reshape": {"shape": []}},
        {"name": "probabilities", "data_type": "TYPE_FP32", "dims": ["10"]},
    ],
}


@given(config=config, max_shapes=st.none() | st.dictionaries(st.text(max_size=3), dims))
@example(config=SKL2ONNX, max_shapes=None)
@example(config={"max_batch_size": "eight"}, max_shapes=None)  # was a bare ValueError
@example(  # a streaming model's outputs keep their -1: they come back by value
    config={
        "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "0", "data_type": "TYPE_BOOL"}],
        "output": [{"name": "0", "data_type": "TYPE_BOOL", "dims": [-1]}],
    },
    max_shapes=None,
)
@examples(720, soak=30_000)
def test_triton_json_gives_a_spec_or_a_named_error(
    config: dict[str, Any], max_shapes: dict[str, list[int]] | None
) -> None:
    tried("configs: Triton's JSON")
    try:
        spec = resolve_model_spec(
            "m",
            inputs=None,
            outputs=None,
            max_batch_size=None,
            model_version="",
            max_shapes=max_shapes,
            load_config=lambda: config,
            max_element_bytes=None,
        )
        layout = SlotLayout.for_model(spec)
    except ModelSpecError as exc:
        assert exc.model == "m"
        return
    assert spec.max_batch_size >= 0 and spec.inputs and spec.outputs
    assert layout.slot_bytes >= 0
    # A streaming model's outputs come back by value, so they need no maxima.
    sized = spec.inputs if spec.decoupled else (*spec.inputs, *spec.outputs)
    for t in sized:
        assert all(d >= 0 for d in t.max_shape), t
    if config is SKL2ONNX:
        assert {t.name: t.max_shape for t in spec.outputs}["label"] == (1,)


def test_the_skl2onnx_label_is_inferred_from_its_reshape() -> None:
    """``dims: [ -1 ] reshape: { shape: [ ] }`` holds one value per sample: ``(1,)``, with no
    ``max_shapes``; a reshape that varies infers nothing."""
    spec = resolve_model_spec(
        "clf",
        inputs=None,
        outputs=None,
        max_batch_size=None,
        model_version="",
        max_shapes=None,
        load_config=lambda: SKL2ONNX,
    )
    label = spec.outputs_by_name["label"]
    assert label.shape == (-1,) and label.max_shape == (1,)
    varying = {**SKL2ONNX, "output": [{**SKL2ONNX["output"][0], "reshape": {"shape": [-1]}}]}
    try:
        resolve_model_spec(
            "clf",
            inputs=None,
            outputs=None,
            max_batch_size=None,
            model_version="",
            max_shapes=None,
            load_config=lambda: varying,
        )
    except ModelSpecError as exc:
        assert "max_shapes" in str(exc)
    else:
        raise AssertionError("a reshape that varies fixed nothing")


graph_tensor = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["X", "Y", "label", "probabilities"]),
        "type": st.sampled_from([*_TRITON_TYPES, "seq(map(int64,tensor(float)))", "tensor(bad)"]),
        "shape": st.lists(st.none() | st.integers(0, 12), max_size=3),
    }
)
signature = st.fixed_dictionaries(
    {"inputs": st.lists(graph_tensor, max_size=2), "outputs": st.lists(graph_tensor, max_size=2)}
)
pbtxt = st.one_of(
    st.none(),
    st.text(max_size=200),
    st.builds(
        lambda mbs, name, dims, reshape: (
            f"max_batch_size: {mbs}\n"
            f'output [ {{ name: "{name}", data_type: TYPE_INT64, dims: {dims}{reshape} }} ]\n'
        ),
        st.integers(-1, 9),
        st.sampled_from(["label", "Y", "nope"]),
        dims.map(lambda d: f"[ {', '.join(map(str, d))} ]"),
        st.sampled_from(["", " reshape: { shape: [ ] }", " reshape: { shape: [ 2, -1 ] }"]),
    ),
)


@given(signature=signature, text=pbtxt)
@example(
    signature={
        "inputs": [{"name": "X", "type": "tensor(float)", "shape": [None, 4]}],
        "outputs": [{"name": "label", "type": "tensor(int64)", "shape": [None]}],
    },
    text='max_batch_size: 8\noutput [ { name: "label", data_type: TYPE_INT64, dims: [ -1 ] '
    "reshape: { shape: [ ] } } ]\n",
)
@examples(720, soak=14_400)
def test_onnx_configs_give_a_config_or_a_named_error(
    signature: dict[str, Any], text: str | None
) -> None:
    """An ONNX model's ``config.pbtxt`` and graph, as ``local/`` reads them: the adapter's
    config, or a :class:`LocalServerError` naming the model."""
    tried("configs: pbtxt and ONNX")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "model"
        directory.mkdir()
        if text is not None:
            (directory / "config.pbtxt").write_text(text, errors="surrogatepass")
        try:
            model_backend(directory)
            served = _adapter_config(directory, signature, "model.onnx")
        except LocalServerError as exc:
            assert "model" in str(exc)
            return
    assert 'backend: "python"' in served
    if text is not None and "dims: [ -1 ] reshape: { shape: [ ] }" in text:
        assert "dims: 1\n" in served and "reshape {" not in served
