"""Slot leases in the Ray layer, on a real local Ray and a real Triton: ``ShmModel.lease`` in a
task and in an async Serve replica, and ``ShmPredictor`` writing a batch's columns straight into
a leased slot (per-row arrays stacked there, cast there)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from ray_triton_shm import InvalidInputError  # noqa: E402
from ray_triton_shm.ray import BlockingCallError, ShmModel, ShmPredictor  # noqa: E402


def test_a_lease_in_a_task_and_in_an_async_serve_replica_answers_exactly(ray_local: str) -> None:
    model = ShmModel("classifier")
    images = np.random.default_rng(3).random((6, 3, 224, 224), dtype=np.float32)
    expected = model.infer({"INPUT0": images})["OUTPUT0"]

    @ray.remote
    def leased(images: np.ndarray) -> np.ndarray:
        with model.lease(batch=len(images)) as lease:
            lease.inputs["INPUT0"][:] = images
            return np.array(lease.infer()["OUTPUT0"])

    np.testing.assert_array_equal(ray.get(leased.remote(images)), expected)

    @serve.deployment
    class Replica:
        def __init__(self) -> None:
            self.model = ShmModel("classifier")

        async def __call__(self, images: np.ndarray) -> np.ndarray:
            async with self.model.lease(batch=len(images)) as lease:
                np.copyto(lease.inputs["INPUT0"], images)
                return np.array((await lease.infer_async())["OUTPUT0"])

        async def blocking(self, images: np.ndarray) -> np.ndarray:
            return self.model.infer({"INPUT0": images})["OUTPUT0"]

        async def blocking_lease(self, images: np.ndarray) -> None:
            with self.model.lease(batch=len(images)):
                pass

        def in_a_thread(self, images: np.ndarray) -> np.ndarray:
            return self.model.infer({"INPUT0": images})["OUTPUT0"]

    try:
        handle = serve.run(Replica.bind(), name="lease", route_prefix=None)
        answers = [handle.remote(images[i : i + 2]) for i in range(0, 6, 2)]
        got = np.concatenate([answer.result(timeout_s=120) for answer in answers])
        np.testing.assert_array_equal(got, expected)
        # A blocking call on the replica's event loop is refused, naming its async twin; a
        # plain def method runs in a thread of Serve's own, where it is right.
        with pytest.raises(BlockingCallError, match=r"await infer_async\(\)"):
            handle.blocking.remote(images[:2]).result(timeout_s=120)
        with pytest.raises(BlockingCallError, match=r"async with lease\(\)"):
            handle.blocking_lease.remote(images[:2]).result(timeout_s=120)
        got = handle.in_a_thread.remote(images[2:4]).result(timeout_s=120)
        np.testing.assert_array_equal(got, expected[2:4])
    finally:
        serve.shutdown()


def test_shm_predictor_stacks_and_casts_columns_in_the_slot(ray_local: str) -> None:
    rng = np.random.default_rng(5)
    rows = np.empty(4, dtype=object)
    for i in range(len(rows)):
        rows[i] = rng.random((3, 224, 224))  # float64: cast to float32 in the slot
    expected = ShmModel("classifier").infer({"INPUT0": np.stack(list(rows)).astype(np.float32)})

    @ray.remote
    def predict(batch: dict[str, Any], plain: bool) -> dict[str, np.ndarray]:
        predictor = ShmPredictor("classifier", input_columns={"image": "INPUT0"}, cast=True)
        if not plain:

            def no_plain_path(inputs: Any) -> Any:
                raise AssertionError("the batch took the plain path, not the lease")

            predictor._infer = no_plain_path  # type: ignore[method-assign]
        return predictor(batch)

    out = ray.get(predict.remote({"image": rows}, plain=False))
    np.testing.assert_array_equal(out["OUTPUT0"], expected["OUTPUT0"])
    # A ragged column cannot go in place: the plain path says what is wrong.
    ragged = rows.copy()
    ragged[1] = rng.random((3, 224, 223))
    with pytest.raises(InvalidInputError, match="rows of different shapes"):
        try:
            ray.get(predict.remote({"image": ragged}, plain=True))
        except ray.exceptions.RayTaskError as exc:
            raise exc.cause from None
