"""The Serve classifier app (deployments/classifier.py) on a real local Ray and a real Triton."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

#: The repository root, where ``deployments/`` lives (not part of the installed package).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _helpers import classifier_expected, free_ports  # noqa: E402

from deployments.classifier import (  # noqa: E402
    BadRequest,
    ClassifierDeployment,
    _parse_npy,
    synthetic_images,
)
from ray_triton_shm.ray import get_node_actor  # noqa: E402

ROUTE = "/classify"


@pytest.fixture(scope="module")
def ray_cluster(ray_local: str) -> None:
    """The shared local Ray, whose node actor talks to the session's Triton."""


@pytest.fixture(scope="module")
def classifier_url(ray_cluster: None) -> Iterator[str]:
    """The classifier app served on a free port; its base URL."""
    (port,) = free_ports(1)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(
            ClassifierDeployment.options(ray_actor_options={"num_cpus": 0.5}).bind(top_k=5),
            name="classifier",
            route_prefix=ROUTE,
        )
        yield f"http://127.0.0.1:{port}{ROUTE}"
    finally:
        serve.shutdown()


def _classifier_stats() -> dict[str, int]:
    return ray.get(get_node_actor().stats.remote()).models.get("classifier", {})


def _check_top_k(answer: list[list[dict[str, Any]]], images: np.ndarray, k: int) -> None:
    expected = classifier_expected(images)
    assert len(answer) == len(images)
    for row, scores in zip(answer, expected):
        classes = [entry["class"] for entry in row]
        assert classes == list(np.argsort(-scores, kind="stable")[:k])
        np.testing.assert_allclose(
            [entry["score"] for entry in row], scores[classes], rtol=1e-5, atol=1e-6
        )


def test_concurrent_requests_match_numpy_and_use_zero_copy(classifier_url: str) -> None:
    before = _classifier_stats()
    payloads = [{"seed": seed, "batch": 1 + seed % 3} for seed in range(12)]

    def post(payload: dict[str, int]) -> requests.Response:
        return requests.post(classifier_url, json=payload, timeout=120)

    with ThreadPoolExecutor(max_workers=6) as pool:
        responses = list(pool.map(post, payloads))

    for payload, response in zip(payloads, responses):
        assert response.status_code == 200, response.text
        images = synthetic_images(payload["seed"], payload["batch"])
        _check_top_k(response.json()["top_k"], images, 5)

    after = _classifier_stats()
    images_sent = sum(p["batch"] for p in payloads)
    assert after["samples"] - before.get("samples", 0) == images_sent
    # Served in Triton requests of several images: batching across concurrent requests.
    requests_made = after["requests"] - before.get("requests", 0)
    assert 0 < requests_made <= images_sent
    assert after["errors"] == before.get("errors", 0)
    # The replica sent every request through the node's shared memory, none by value.
    assert after["transport"] == "shm", after["transport_reason"]
    assert after["in_use"] == after["waiting"] == 0


def test_npy_body_and_top_k_query(classifier_url: str) -> None:
    images = np.random.default_rng(7).random((3, 3, 224, 224), dtype=np.float32)
    buffer = io.BytesIO()
    np.save(buffer, images)
    response = requests.post(
        f"{classifier_url}?top_k=3",
        data=buffer.getvalue(),
        headers={"Content-Type": "application/x-npy"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    _check_top_k(response.json()["top_k"], images, 3)


def test_raw_bytes_with_shape_header_single_image(classifier_url: str) -> None:
    image = np.random.default_rng(8).random((3, 224, 224), dtype=np.float32)
    response = requests.post(
        classifier_url,
        data=image.astype("<f4").tobytes(),
        headers={"Content-Type": "application/octet-stream", "X-Shape": "3,224,224"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    _check_top_k(response.json()["top_k"], image[np.newaxis], 5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"json": {"seed": 0, "batch": 2, "top_k": 0}}, "top_k must be at least 1"),
        ({"json": {"inputs": [[1.0, 2.0]]}}, "(N, 3, 224, 224)"),
        ({"json": {"seed": "x"}}, "'seed' and 'batch' must be integers"),
        (
            {"data": b"\0" * 12, "headers": {"X-Shape": "3,224,224"}},
            "needs 602112 bytes, the body has 12",
        ),
        ({"data": b"hello"}, "send JSON"),
    ],
)
def test_bad_requests_get_400(classifier_url: str, kwargs: dict[str, Any], message: str) -> None:
    response = requests.post(classifier_url, timeout=60, **kwargs)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_empty_batch(classifier_url: str) -> None:
    response = requests.post(classifier_url, json={"seed": 0, "batch": 0}, timeout=60)
    assert response.status_code == 200
    assert response.json() == {"top_k": []}


def _npy(array: np.ndarray, **options: Any) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, **options)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.asfortranarray(np.arange(24, dtype=np.float64).reshape(2, 3, 4)),
        np.arange(6, dtype=">f4").reshape(2, 3),
        np.arange(5, dtype=np.uint8),
    ],
    ids=["C order", "Fortran order", "big-endian", "uint8"],
)
def test_npy_bodies_are_read_in_place_as_numpy_reads_them(array: np.ndarray) -> None:
    for version in ((1, 0), (2, 0)):
        body = _npy(array, version=version)
        parsed = _parse_npy(body)
        expected = np.load(io.BytesIO(body))
        assert parsed.dtype == expected.dtype and parsed.shape == expected.shape
        np.testing.assert_array_equal(parsed, expected)
        # A view of the body, not a copy of it.
        assert np.shares_memory(parsed, np.frombuffer(body, np.uint8))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_npy(np.zeros(10, np.float32))[:-4], "needs 40 bytes of data, it has 36"),
        (_npy(np.zeros(10, np.float32)) + b"\0", "needs 40 bytes of data, it has 41"),
        (_npy(np.array([{}, 1], dtype=object), allow_pickle=True), "object arrays"),
        (b"\x93NUMPY\x01\x00\x08\x00{'a': 1}", "'descr'"),
        (b"\x93NUMPY", "no .npy header"),
    ],
    ids=["truncated", "trailing bytes", "object dtype", "no descr", "cut header"],
)
def test_bad_npy_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match="not a valid .npy array") as caught:
        _parse_npy(body)
    assert message in str(caught.value)


def test_the_grpc_and_noop_backends_answer_like_the_app(classifier_url: str) -> None:
    """The same app class on plain gRPC answers as on shared memory; the no-op one answers
    zeros; each replica says where its requests' time went."""
    images = np.random.default_rng(9).random((3, 3, 224, 224), dtype=np.float32)
    body = _npy(images)
    base = classifier_url.rsplit(ROUTE, 1)[0]
    handles = {}
    for backend in ("grpc", "noop"):
        handles[backend] = serve.run(
            ClassifierDeployment.options(
                name=f"classifier-{backend}", ray_actor_options={"num_cpus": 0.5}
            ).bind(backend=backend),
            name=f"classifier-{backend}",
            route_prefix=f"{ROUTE}-{backend}",
        )
    try:
        answers = {}
        for backend in ("", "-grpc", "-noop"):
            response = requests.post(
                f"{base}{ROUTE}{backend}",
                data=body,
                headers={"Content-Type": "application/x-npy"},
                timeout=120,
            )
            assert response.status_code == 200, response.text
            answers[backend] = response.json()["top_k"]
        _check_top_k(answers[""], images, 5)
        _check_top_k(answers["-grpc"], images, 5)
        assert [[c["class"] for c in row] for row in answers["-noop"]] == [[0, 1, 2, 3, 4]] * 3
        assert {c["score"] for row in answers["-noop"] for c in row} == {0.0}

        times = handles["grpc"].stage_times.remote(reset=True).result()
        stages = times["stages"]
        assert stages["request"]["calls"] == 1 and times["images"] == 3
        assert set(stages) == {"request", "body", "parse", "batched", "model", "top_k", "json"}
        inner = sum(stages[s]["seconds"] for s in ("body", "parse", "batched", "top_k", "json"))
        assert 0 < inner <= stages["request"]["seconds"]
        assert handles["grpc"].stage_times.remote().result()["stages"] == {}  # reset
    finally:
        for backend in handles:  # their replicas' graceful ends, seconds each, not waited on
            serve.delete(f"classifier-{backend}", _blocking=False)
    with pytest.raises(ValueError, match="backend must be one of"):
        ClassifierDeployment.func_or_class(backend="carrier-pigeon")
