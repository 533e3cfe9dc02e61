"""Callers' inputs into a real Triton's ``identity``, ``upper`` and ``add_nobatch``: every
dtype, shape, stride and order, 0 rows, too many rows, NaN, object arrays, strings that are
not UTF-8, lists. Each gives the right answer, or an :class:`InvalidInputError` raised before
anything was written (no request counted, no byte in); every slot is free after."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from _counts import examples, tried
from _helpers import our_regions
from hypothesis import example, given
from hypothesis import strategies as st

from ray_triton_shm import InvalidInputError, TritonSHMClient
from ray_triton_shm._client import registry_of
from ray_triton_shm.local._server import LocalTritonServer

MAX_ROWS, MAX_K, MAX_TEXT = 8, 16, 48


@pytest.fixture(scope="module")
def shm(triton: LocalTritonServer) -> Iterator[TritonSHMClient]:
    """One client for every example (a client per example would time registration), with the
    three models; closed with nothing left."""
    client = TritonSHMClient(triton.grpc_url)
    client.register_shm_model(
        "identity", pool_size=2, max_shapes={"INPUT0": (MAX_K,), "OUTPUT0": (MAX_K,)}
    )
    lengths = {"TEXT": MAX_TEXT, "UPPER": MAX_TEXT}
    client.register_shm_model("upper", pool_size=2, max_element_bytes=lengths)
    client.register_shm_model("add_nobatch", pool_size=2)
    yield client
    client.close()
    assert our_regions(os.getpid()) == set()


def _call(client: TritonSHMClient, model: str, inputs: Any) -> dict[str, np.ndarray] | None:
    """The answer, or ``None`` after an InvalidInputError that wrote nothing."""
    header = registry_of(client).get(model).header
    before = header.totals()
    try:
        answer = client.infer_shm(model, inputs)
    except InvalidInputError as exc:
        assert exc.model == model
        after = header.totals()
        assert (after.requests, after.bytes_in) == (before.requests, before.bytes_in)
        answer = None
    assert client.shm_stats(model).in_use == 0
    return answer


floats = st.floats(width=32, allow_nan=True, allow_infinity=True)
good_rows = st.tuples(st.integers(1, 3 * MAX_ROWS + 1), st.integers(1, MAX_K))
any_dtype = st.one_of(hnp.scalar_dtypes(), st.just(np.dtype(object)))


@st.composite
def laid_out(draw: st.DrawFn, array: np.ndarray) -> np.ndarray:
    """``array``'s values in another layout: Fortran order, strided, reversed, read-only."""
    how = draw(st.sampled_from(["c", "f", "strided", "reversed", "readonly"]))
    if how == "f":
        return np.asfortranarray(array)
    if how == "strided":
        wide = np.repeat(array, 2, axis=-1) if array.ndim else array
        return wide[..., ::2] if array.ndim else wide
    if how == "reversed":
        return np.ascontiguousarray(array[::-1])[::-1] if array.ndim else array
    if how == "readonly":
        array = array.copy()
        array.flags.writeable = False
    return array


good_identity = good_rows.flatmap(lambda s: hnp.arrays(np.float32, s, elements=floats)).flatmap(
    laid_out
)
bad_identity = st.one_of(
    hnp.arrays(any_dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=MAX_K + 2)),
    hnp.arrays(np.float32, st.tuples(st.just(0), st.integers(0, MAX_K))),  # 0 rows
    hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.just(MAX_K + 1))),  # too wide
    st.lists(st.lists(floats, min_size=2, max_size=2), max_size=4),  # nested lists
    st.lists(hnp.arrays(np.float32, st.just((3,)), elements=floats), max_size=4),  # samples
    st.one_of(st.none(), st.text(max_size=5), st.binary(max_size=5), st.integers()),
)


@given(value=st.one_of(good_identity, bad_identity), good=st.just(False))
@example(value=np.full((9, 3), np.nan, np.float32), good=True)  # NaN, two chunks
@example(value=np.zeros((0, 4), np.float32), good=False)
@example(value=np.ones((2, 3), np.float64), good=False)
@example(value=np.array([[1.0, "a"]], dtype=object), good=False)
@examples(420, soak=7000)
def test_identity_answers_right_or_refuses_by_name(
    shm: TritonSHMClient, value: Any, good: bool
) -> None:
    tried("inputs: identity")
    is_good = isinstance(value, np.ndarray) and value.dtype == np.float32 and value.ndim == 2
    is_good = is_good and 1 <= value.shape[1] <= MAX_K and value.shape[0] >= 1
    answer = _call(shm, "identity", {"INPUT0": value})
    if is_good or good:
        assert answer is not None, "a good input was refused"
    if answer is not None:
        expected = np.asarray(value)
        if expected.shape[0] == 0:  # an empty batch's outputs: each variable dim 0
            assert answer["OUTPUT0"].shape == (0, 0)
            return
        assert answer["OUTPUT0"].shape == expected.shape
        np.testing.assert_array_equal(answer["OUTPUT0"], expected.astype(np.float32))


texts = st.one_of(
    st.binary(max_size=MAX_TEXT + 4),  # not UTF-8, too long
    st.text(max_size=MAX_TEXT // 4),
    st.integers(),
    st.none(),
)


@st.composite
def text_inputs(draw: st.DrawFn) -> Any:
    rows = draw(st.integers(0, MAX_ROWS + 3))
    elements = draw(st.lists(texts, min_size=rows, max_size=rows))
    kind = draw(st.sampled_from(["object", "bytes", "str", "flat", "list"]))
    if kind == "list":
        return elements
    if kind == "bytes" and all(isinstance(e, bytes) for e in elements):
        return np.array(elements, dtype=np.bytes_).reshape(rows, 1)
    if kind == "str" and all(isinstance(e, str) for e in elements):
        return np.array(elements, dtype=np.str_).reshape(rows, 1)
    array = np.empty(rows, dtype=object)
    array[:] = elements
    return array if kind == "flat" else array.reshape(rows, 1)


def _utf8(element: Any) -> bytes:
    return element.encode() if isinstance(element, str) else bytes(element)


@given(value=text_inputs())
@example(value=np.array([[b"\xff\xfeabc"], ["\u00e9t\u00e9"]], dtype=object))
@examples(300, soak=5000)
def test_upper_answers_right_or_refuses_by_name(shm: TritonSHMClient, value: Any) -> None:
    tried("inputs: upper")
    answer = _call(shm, "upper", {"TEXT": value})
    if answer is not None:
        given_ = [_utf8(e) for e in np.asarray(value, dtype=object).reshape(-1)]
        assert [bytes(e) for e in answer["UPPER"].reshape(-1)] == [e.upper() for e in given_]
        assert answer["LENGTH"].reshape(-1).tolist() == [len(e) for e in given_]


pairs = st.one_of(
    st.tuples(*(hnp.arrays(np.float32, (4,), elements=floats).flatmap(laid_out),) * 2),
    st.tuples(
        hnp.arrays(any_dtype, hnp.array_shapes(min_dims=0, max_dims=2, max_side=5)),
        hnp.arrays(np.float32, (4,)),
    ),
    st.tuples(st.lists(floats, min_size=4, max_size=4), hnp.arrays(np.float32, (4,))),
    st.tuples(hnp.arrays(np.float32, (1, 4)), hnp.arrays(np.float32, (4,))),  # a batch dim
)


@given(pair=pairs)
@examples(240, soak=4000)
def test_add_nobatch_answers_right_or_refuses_by_name(
    shm: TritonSHMClient, pair: tuple[Any, Any]
) -> None:
    tried("inputs: add_nobatch")
    a, b = pair
    answer = _call(shm, "add_nobatch", {"INPUT0": a, "INPUT1": b})
    good = all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in pair)
    if good and all(v.shape == (4,) for v in pair):
        assert answer is not None, "a good input was refused"
    if answer is not None:
        with np.errstate(all="ignore"):
            expected = np.asarray(a, np.float32) + np.asarray(b, np.float32)
        np.testing.assert_array_equal(answer["OUTPUT0"], expected)
