"""The Serve classifier app (deployments/classifier.py) on a real local Ray and a real Triton."""

from __future__ import annotations

import io
import os
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

from _helpers import classifier_expected, free_ports, init_ray  # noqa: E402

from deployments.classifier import ClassifierDeployment, synthetic_images  # noqa: E402
from ray_triton_shm.local._server import LocalTritonServer  # noqa: E402
from ray_triton_shm.ray import URL_ENV_VAR, get_node_actor  # noqa: E402

ROUTE = "/classify"


@pytest.fixture(scope="module")
def ray_cluster(triton: LocalTritonServer) -> Iterator[None]:
    """A local Ray whose node actor talks to the session's Triton; torn down with its actor."""
    # Set before ray.init so the raylet, and every worker and actor it starts, inherit it.
    # PYTHONPATH too: replicas unpickle deployments.classifier by reference.
    saved = {name: os.environ.get(name) for name in (URL_ENV_VAR, "PYTHONPATH")}
    os.environ[URL_ENV_VAR] = triton.grpc_url
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    init_ray(num_cpus=4, include_dashboard=False)
    try:
        yield
    finally:
        try:
            actor = get_node_actor()
            ray.get(actor.shutdown.remote())
            ray.kill(actor)
        finally:
            ray.shutdown()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


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
    # The replica sent every request straight to Triton on the node's slots: none by value.
    assert after["by_value"] == before.get("by_value", 0)
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
