"""ShmPredictor with Ray Data, and deployments/batch_predict.py, on a real Ray and Triton."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pytest.importorskip("pyarrow")


from _helpers import classifier_expected  # noqa: E402

from ray_triton_shm import InvalidInputError  # noqa: E402
from ray_triton_shm.local._server import LocalTritonServer  # noqa: E402
from ray_triton_shm.ray import ShmPredictor, get_node_actor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SHAPE = (3, 224, 224)

# Workers cannot import this test module by name: ship its functions and classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def image_of(row_id: int) -> np.ndarray:
    return np.random.default_rng(1000 + row_id).random(IMAGE_SHAPE, dtype=np.float32)


def add_images(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"id": batch["id"], "pixels": np.stack([image_of(int(i)) for i in batch["id"]])}


class RecordingPredictor(ShmPredictor):
    """Also reports, per row, whether the worker went through shared memory directly."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().__call__(batch)
        out["zero_copy"] = np.full(len(batch["id"]), self.zero_copy)
        return out


@pytest.fixture(scope="module")
def ray_cluster(ray_local: str) -> Iterator[str]:
    """The module's local Ray (see ``ray_local``); yields the GCS address, and shuts the node
    actor down at the end."""
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        actor = get_node_actor()
        ray.get(actor.shutdown.remote())
        ray.kill(actor)


def _predict(ds: ray.data.Dataset, cls: type = ShmPredictor, **kwargs: object) -> ray.data.Dataset:
    return ds.map_batches(
        cls,
        fn_constructor_kwargs={"model_name": "classifier", **kwargs},
        batch_format="numpy",
        batch_size=12,  # more than the model's max_batch_size (8): chunked into two requests
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=0.5,
    )


def test_map_batches_matches_numpy_through_shared_memory(ray_cluster: str) -> None:
    """The job as the README and the deployments build it (``compute=``): every row right,
    zero-copy, and no deprecation from Ray, built or run."""
    rows = 30
    # Ray 2.60 itself warns, once per process, as it creates its DataContext (setting its own
    # deprecated fields): that is Ray's, not the job's.
    ray.data.DataContext.get_current()
    before = ray.get(get_node_actor().stats.remote()).models.get("classifier", {})
    with _ray_deprecations() as deprecations:
        ds = ray.data.range(rows, override_num_blocks=3).map_batches(
            add_images, batch_format="numpy"
        )
        out = _predict(
            ds,
            RecordingPredictor,
            input_columns={"pixels": "INPUT0"},
            output_columns={"OUTPUT0": "scores"},
            keep_columns=["id"],
        )
        taken = out.take_batch(rows, batch_format="numpy")
    assert deprecations == []
    order = np.argsort(taken["id"])  # here, not by another Ray Data job (a sort's)
    batch = {name: column[order] for name, column in taken.items()}

    assert set(batch) == {"id", "scores", "zero_copy"}
    np.testing.assert_array_equal(batch["id"], np.arange(rows))
    expected = classifier_expected(np.stack([image_of(i) for i in range(rows)]))
    np.testing.assert_allclose(batch["scores"], expected, rtol=1e-5, atol=1e-6)
    assert batch["zero_copy"].all()
    after = ray.get(get_node_actor().stats.remote()).models["classifier"]
    assert after["samples"] - before.get("samples", 0) == rows
    assert after["errors"] == before.get("errors", 0)


@contextlib.contextmanager
def _ray_deprecations() -> Iterator[list[str]]:
    """Collects, in the list it yields, what Ray calls deprecated meanwhile: its warnings (of
    a deprecation category, or saying so) and its loggers' records (Ray Data logs some)."""
    found: list[str] = []
    ray_dir = str(Path(ray.__file__).parent)

    class Deprecations(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "deprecat" in record.getMessage().lower():
                found.append(record.getMessage())

    handler = Deprecations(logging.WARNING)
    loggers = [logging.getLogger(name) for name in ("ray", "ray.data")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    kinds = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
    for warning in caught:
        from_ray = warning.filename.startswith(ray_dir) or warning.category.__module__ == "ray"
        from_ray |= warning.category.__module__.startswith("ray.")
        deprecated = issubclass(warning.category, kinds) or "deprecat" in str(warning.message)
        if from_ray and deprecated:
            found.append(f"{warning.category.__name__}: {warning.message}")


def test_the_deprecation_check_catches_a_deprecated_argument(ray_cluster: str) -> None:
    """The check the job above passes catches the deprecated ``concurrency=``."""
    with _ray_deprecations() as deprecations:
        ray.data.range(4).map_batches(
            ShmPredictor, fn_constructor_kwargs={"model_name": "classifier"}, concurrency=2
        )
    assert any("concurrency" in message for message in deprecations), deprecations


def test_default_columns_prefix_and_read_only_ragged_inputs(ray_cluster: str) -> None:
    # Columns named like the inputs; rows given as an object column of per-row arrays (what
    # Ray Data hands over for variable-shaped tensors), read-only like Arrow-backed arrays.
    images = np.stack([image_of(i) for i in range(5)])
    frozen = images.copy()
    frozen.flags.writeable = False
    ragged = np.empty(5, dtype=object)
    ragged[:] = list(frozen)

    predictor = ShmPredictor("classifier", output_columns="pred_", keep_columns=True)
    try:
        out = predictor({"INPUT0": ragged, "id": np.arange(5)})
        assert set(out) == {"INPUT0", "id", "pred_OUTPUT0"}
        np.testing.assert_allclose(
            out["pred_OUTPUT0"], classifier_expected(images), rtol=1e-5, atol=1e-6
        )
        assert predictor.zero_copy

        cast = ShmPredictor("classifier", cast=True)
        np.testing.assert_allclose(
            cast({"INPUT0": images[:2].astype(np.float64)})["OUTPUT0"],
            classifier_expected(images[:2]),
            rtol=1e-5,
            atol=1e-6,
        )
        cast._model.close()
    finally:
        predictor._model.close()


@pytest.mark.soak  # the soak tier (CI runs it after make test): make test stays under 12 min
def test_bad_column_mappings_fail_clearly(ray_cluster: str) -> None:
    with pytest.raises(ValueError, match=r"maps column 'img' to 'INPUT1', which is not an input"):
        ShmPredictor("classifier", input_columns={"img": "INPUT1"})
    with pytest.raises(ValueError, match=r"names \['OUT'\], which are not outputs"):
        ShmPredictor("classifier", output_columns={"OUT": "x"})

    predictor = ShmPredictor("classifier", input_columns={"image": "INPUT0"})
    images = np.stack([image_of(i) for i in range(2)])
    with pytest.raises(InvalidInputError, match=r"column 'image', which the batch does not have"):
        predictor({"pixels": images})
    with pytest.raises(InvalidInputError, match="must have dtype float32"):
        predictor({"image": images.astype(np.float64)})
    ragged = np.empty(2, dtype=object)
    ragged[:] = [images[0], images[1][:, :100]]
    with pytest.raises(InvalidInputError, match="rows of different shapes"):
        predictor({"image": ragged})
    with pytest.raises(TypeError, match="batch_format='numpy'"):
        predictor([images])  # type: ignore[arg-type]
    predictor._model.close()

    # Inside a pipeline the same error reaches the driver. A driver of its own: the failed
    # job's traceback keeps its predictor actors alive as long as its driver keeps the error.
    driver = subprocess.run(
        [sys.executable, "-c", _FAILING_PIPELINE, ray_cluster],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])},
        timeout=180,
    )
    assert driver.returncode == 0, driver.stdout + driver.stderr
    assert "which the batch does not have" in driver.stdout


_FAILING_PIPELINE = """
import sys
import ray
import test_data
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
ds = ray.data.range(4).map_batches(test_data.add_images, batch_format="numpy")
try:
    test_data._predict(ds, input_columns={"image": "INPUT0"}).take_all()
except Exception as exc:
    print(exc)
else:
    sys.exit("the pipeline did not fail")
"""


@pytest.mark.soak  # minutes of make test: CI's soak tier runs it
def test_batch_predict_script(ray_cluster: str, triton: LocalTritonServer, tmp_path: Path) -> None:
    output = tmp_path / "preds"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "deployments" / "batch_predict.py"),
            "--rows",
            "24",
            "--batch-size",
            "8",
            "--output",
            str(output),
            "--url",
            triton.grpc_url,
            "--address",
            ray_cluster,
            "--verify",
            "24",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Classified 24 images" in result.stdout
    assert "Verified against numpy: OK" in result.stdout

    # Read back by pyarrow itself: the script's files, not what Ray Data makes of them (and
    # without another Ray Data job, a sort's, in this process).
    import pyarrow.parquet as pq

    table = pq.read_table(output).to_pydict()
    order = np.argsort(table["id"])
    written = {name: np.array(column)[order] for name, column in table.items()}
    np.testing.assert_array_equal(written["id"], np.arange(24))
    images = np.stack(
        [np.random.default_rng(i).random(IMAGE_SHAPE, dtype=np.float32) for i in range(24)]
    )
    expected = classifier_expected(images)
    np.testing.assert_array_equal(written["top_classes"][:, 0], expected.argmax(axis=1))
    assert written["top_classes"].shape == (24, 5)
