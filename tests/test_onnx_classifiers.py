"""Classifiers as ONNX converters make them, served by the embedded Triton (``onnx_via_python``).

scikit-learn's ``MLPClassifier`` on ``load_digits``, converted with skl2onnx (the dev extra):
two outputs, ``label`` (one per row: the graph's shape ``[None]``) and ``probabilities``
(``[None, 10]``, with ``zipmap=False``). The label is ``[1]`` per sample in Triton, as Triton's
own ONNX backend has it with ``reshape: { shape: [] }``: from the graph, with that reshape in
the config, and with ``dims: [1]`` alone. Every answer is compared with onnxruntime called
directly on the same rows (in the server environment, which has it).
"""

from __future__ import annotations

import json
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from _helpers import end_node_actor, local_triton

from ray_triton_shm import TritonSHMClient
from ray_triton_shm.local._install import add_server_packages, find_tritonserver
from ray_triton_shm.local._onnx import onnx_via_python_repository
from ray_triton_shm.local._server import LocalServerError, LocalTritonServer

pytest.importorskip("skl2onnx", reason="the dev extra's skl2onnx makes the models")

_LABEL_AS_TRITON_HAS_IT = """
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [
  { name: "label", data_type: TYPE_INT64, dims: [ 1 ]%s },
  { name: "probabilities", data_type: TYPE_FP32, dims: [ 10 ] }
]
"""
#: Model name -> (string labels, config.pbtxt or None: from the graph).
MODELS = {
    "digits": (False, None),
    "digits_reshape": (False, _LABEL_AS_TRITON_HAS_IT % ", reshape: { shape: [ ] }"),
    "digits_dims": (False, _LABEL_AS_TRITON_HAS_IT % ""),
    # As skl2onnx's users write it: the reshape fixes the -1 at one value (issue 63).
    "digits_reshape_variable": (
        False,
        _LABEL_AS_TRITON_HAS_IT.replace("dims: [ 1 ]", "dims: [ -1 ]")
        % ", reshape: { shape: [ ] }",
    ),
    "digits_names": (True, None),
}

#: Run by the server environment's Python: onnxruntime on the rows, every output, as .npy.
_REFERENCE_SCRIPT = """
import json, sys
import numpy as np, onnxruntime
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.load(sys.argv[2])
names = [o.name for o in session.get_outputs()]
for name, value in zip(names, session.run(names, {"X": x})):
    np.save(f"{sys.argv[3]}-{name}.npy", value.astype(str) if value.dtype == object else value)
print(json.dumps(names))
"""


def _classifier(names: bool, *, zipmap: bool = False) -> bytes:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    labels = np.array([f"digit-{v}" for v in y]) if names else y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 40 iterations do not converge: no matter here
        model = MLPClassifier(hidden_layer_sizes=(16,), max_iter=40, random_state=0)
        model.fit(x.astype(np.float32), labels)
    onx = to_onnx(model, x[:1].astype(np.float32), options={"zipmap": zipmap}, target_opset=17)
    return onx.SerializeToString()  # type: ignore[no-any-return]


def _repository(directory: Path) -> Path:
    for name, (names, config) in MODELS.items():
        (directory / name / "1").mkdir(parents=True)
        (directory / name / "1" / "model.onnx").write_bytes(_classifier(names))
        if config is not None:
            (directory / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    return directory


def _reference(model_file: Path, x: np.ndarray, tmp: Path) -> dict[str, np.ndarray]:
    """onnxruntime's own answer to ``x``, in the server environment."""
    install = find_tritonserver()
    python = install.python()
    assert python is not None
    np.save(tmp / "x.npy", x)
    out = tmp / "out"
    done = subprocess.run(
        [str(python), "-c", _REFERENCE_SCRIPT, str(model_file), str(tmp / "x.npy"), str(out)],
        capture_output=True,
        text=True,
        env=install.environ(),
        check=True,
    )
    names = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: np.load(tmp / f"out-{name}.npy") for name in names}


@pytest.fixture(scope="module")
def classifiers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalTritonServer, Path]]:
    """The embedded Triton serving :data:`MODELS`, and their repository."""
    add_server_packages(["onnxruntime"], quiet=True)  # a no-op where make test installed it
    directory = tmp_path_factory.mktemp("classifiers")
    with local_triton(
        _repository(directory / "models"),
        log_path=directory / "tritonserver.log",
        onnx_via_python=True,
    ) as server:
        yield server, directory / "models"


def _rows(count: int, seed: int) -> np.ndarray:
    from sklearn.datasets import load_digits

    x = load_digits().data.astype(np.float32)
    return x[np.random.default_rng(seed).choice(len(x), count, replace=False)]


def _check(answer: dict[str, np.ndarray], expected: dict[str, np.ndarray], names: bool) -> None:
    """The answer is onnxruntime's: the label one per row as ``[1]``, the probabilities."""
    rows = len(expected["label"])
    label = answer["label"]
    assert label.shape == (rows, 1)
    if names:
        assert [v.decode() for v in label[:, 0]] == list(expected["label"])
    else:
        assert label.dtype == np.int64
        np.testing.assert_array_equal(label[:, 0], expected["label"])
    np.testing.assert_allclose(answer["probabilities"], expected["probabilities"], rtol=1e-6)


def test_classifiers_answer_through_the_core_client(
    classifiers: tuple[LocalTritonServer, Path],
    tmp_path: Path,
    make_client: Callable[..., TritonSHMClient],
) -> None:
    server, models = classifiers
    x = _rows(32, seed=1)
    client = make_client(server.grpc_url)
    for model, (names, _) in MODELS.items():
        # Specs from Triton's config; a string's longest is the caller's to say.
        longest = {"label": 16} if names else None
        spec = client.register_shm_model(model, pool_size=2, max_element_bytes=longest)
        assert {t.name: t.shape for t in spec.outputs}["label"] == (1,), model
        expected = _reference(models / model / "1" / "model.onnx", x, tmp_path)
        batch = spec.batch_capacity
        for start in range(0, len(x), batch):
            answer = client.infer_shm(model, {"X": x[start : start + batch]})
            part = {k: v[start : start + batch] for k, v in expected.items()}
            _check(answer, part, names)


@pytest.mark.usefixtures("ray_local")
def test_a_classifier_answers_through_shm_model_in_ray_tasks(
    classifiers: tuple[LocalTritonServer, Path], tmp_path: Path
) -> None:
    import ray

    from ray_triton_shm.ray import ShmModel

    server, models = classifiers
    url = server.grpc_url

    @ray.remote
    def predict(rows: np.ndarray) -> dict[str, np.ndarray]:
        model = ShmModel("digits_names", url=url, pool_size=2, max_element_bytes={"label": 16})
        try:
            return dict(model.infer({"X": rows}))
        finally:
            model.close()

    x = _rows(16, seed=2)
    expected = _reference(models / "digits_names" / "1" / "model.onnx", x, tmp_path)
    try:
        answers = ray.get([predict.remote(x[i : i + 4]) for i in range(0, 16, 4)])
    finally:
        end_node_actor()
    for i, answer in enumerate(answers):
        _check(answer, {k: v[4 * i : 4 * i + 4] for k, v in expected.items()}, names=True)


def test_a_zipmap_output_says_how_to_convert_without_it(tmp_path: Path) -> None:
    (tmp_path / "models" / "zipped" / "1").mkdir(parents=True)
    (tmp_path / "models" / "zipped" / "1" / "model.onnx").write_bytes(
        _classifier(False, zipmap=True)
    )
    install = find_tritonserver()
    python = install.python()
    assert python is not None
    add_server_packages(["onnxruntime"], quiet=True)
    with pytest.raises(LocalServerError) as caught:
        onnx_via_python_repository(
            tmp_path / "models", tmp_path / "made", python=python, env=install.environ()
        )
    message = str(caught.value)
    assert "'output_probability' is a seq(map(int64,tensor(float)))" in message
    assert "options={'zipmap': False}" in message
