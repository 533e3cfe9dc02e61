"""ONNX models and the embedded Triton, which has only the Python backend.

A native ONNX model (platform ``onnxruntime_onnx``) fails at once, before any tritonserver
starts, saying which model, which backend, what the server has and the two ways forward; with
``onnx_via_python`` (``serve-local --onnx-via-python``) the same model answers through a
generated Python-backend model running onnxruntime. The ONNX models are made here, with the
``onnx`` package's helpers (the dev extra); onnxruntime goes into the server environment
(``setup-server --with onnxruntime``, as ``make test`` does).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from _helpers import local_triton, model_repository

from ray_triton_shm import TritonSHMClient
from ray_triton_shm.local._install import add_server_packages, find_tritonserver
from ray_triton_shm.local._onnx import onnx_signature
from ray_triton_shm.local._repository import TRITON_CONTAINER_IMAGE
from ray_triton_shm.local._server import LocalServerError, LocalTritonServer

REPO_ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = (np.arange(12, dtype=np.float32).reshape(4, 3) - 6.0) / 4.0
BIAS = np.array([0.5, -1.0, 2.0], np.float32)

NATIVE_CONFIG = """name: "affine"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [
  { name: "Y", data_type: TYPE_FP32, dims: [ 3 ] },
  { name: "R", data_type: TYPE_FP32, dims: [ 3 ] }
]
dynamic_batching { max_queue_delay_microseconds: 10000 }
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""


def _affine_model(path: Path) -> None:
    """Y = X @ W + B and R = relu(Y), with a variable batch dimension."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["XW"]),
            helper.make_node("Add", ["XW", "B"], ["Y"]),
            helper.make_node("Relu", ["Y"], ["R"]),
        ],
        "affine",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("R", TensorProto.FLOAT, ["batch", 3]),
        ],
        [numpy_helper.from_array(WEIGHTS, "W"), numpy_helper.from_array(BIAS, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # read by older onnxruntime releases too
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _scale_model(path: Path) -> None:
    """OUT = 2 * IN, int64, a fixed shape [2, 3] and no batch: a model without a config."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["IN", "TWO"], ["OUT"])],
        "scale",
        [helper.make_tensor_value_info("IN", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("OUT", TensorProto.INT64, [2, 3])],
        [numpy_helper.from_array(np.array(2, np.int64), "TWO")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _onnx_repository(directory: Path) -> Path:
    """``affine`` (a native ONNX model with its config), ``scale`` (an ONNX model without
    one) and ``identity`` (a Python-backend model)."""
    model_repository(directory, "identity")
    _affine_model(directory / "affine" / "1" / "model.onnx")
    (directory / "affine" / "config.pbtxt").write_text(NATIVE_CONFIG)
    _scale_model(directory / "scale" / "1" / "model.onnx")
    return directory


@pytest.fixture(scope="module")
def onnxruntime_on_the_server() -> None:
    """onnxruntime in the server environment (a no-op where ``make test`` installed it)."""
    add_server_packages(["onnxruntime"], quiet=True)


def test_a_native_onnx_model_fails_at_once_saying_the_ways_forward(tmp_path: Path) -> None:
    repository = _onnx_repository(tmp_path / "models")
    log = tmp_path / "tritonserver.log"
    server = LocalTritonServer(repository, log_path=log)
    try:
        with pytest.raises(LocalServerError) as caught:
            server.start()
        assert server.pid is None and not log.exists()  # no tritonserver was started
    finally:
        server.close()
    message = str(caught.value)
    assert "model 'affine'" in message and 'platform "onnxruntime_onnx"' in message
    assert "model 'scale'" in message and "model.onnx" in message
    assert "backend 'onnxruntime'" in message
    assert "the backend(s) 'python' only" in message
    assert "identity" not in message  # a Python-backend model is served
    assert (
        "docker run --rm --ipc=host" in message
        and f"-v {repository.resolve()}:/models:ro" in message
        and f"{TRITON_CONTAINER_IMAGE} tritonserver --model-repository=/models" in message
    )
    assert "ray-triton-shm setup-server --with onnxruntime" in message
    assert "serve-local --onnx-via-python" in message


def test_serve_local_refuses_a_native_onnx_model_before_starting_triton(tmp_path: Path) -> None:
    repository = _onnx_repository(tmp_path / "models")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "ray_triton_shm", "serve-local", "--model-repository", repository],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Triton is ready" not in done.stdout
    assert "serve-local: error: the embedded Triton cannot serve 2 model(s)" in done.stderr
    assert "docker run" in done.stderr and "--onnx-via-python" in done.stderr
    assert "log:" not in done.stderr  # nothing ran, so there is no log to name


def test_onnx_models_answer_through_the_python_backend(
    tmp_path: Path, onnxruntime_on_the_server: None
) -> None:
    repository = _onnx_repository(tmp_path / "models")
    rng = np.random.default_rng(7)
    with local_triton(
        repository, log_path=tmp_path / "tritonserver.log", onnx_via_python=True
    ) as server:
        with TritonSHMClient(server.grpc_url) as client:
            client.register_shm_model("affine", pool_size=4)  # specs from the config
            client.register_shm_model("scale", pool_size=1)  # specs from the graph
            client.register_shm_model(
                "identity", pool_size=1, max_shapes={"INPUT0": (3,), "OUTPUT0": (3,)}
            )  # linked in unchanged
            for batch in (1, 5, 16):
                x = rng.standard_normal((batch, 4)).astype(np.float32)
                answer = client.infer_shm("affine", {"X": x})
                expected = x @ WEIGHTS + BIAS
                np.testing.assert_allclose(answer["Y"], expected, rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(answer["R"], np.maximum(expected, 0), atol=1e-5)
            # Requests at once: Triton's dynamic batcher hands them over together, and the
            # adapter runs them as one batch, each answer its own rows.
            inputs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(64)]
            with ThreadPoolExecutor(4) as callers:
                answers = list(callers.map(lambda x: client.infer_shm("affine", {"X": x}), inputs))
            for x, answer in zip(inputs, answers):
                np.testing.assert_allclose(answer["Y"], x @ WEIGHTS + BIAS, rtol=1e-5, atol=1e-5)
            numbers = rng.integers(-1000, 1000, (2, 3), dtype=np.int64)
            np.testing.assert_array_equal(
                client.infer_shm("scale", {"IN": numbers})["OUT"], 2 * numbers
            )
            ones = np.ones((1, 3), np.float32)
            np.testing.assert_array_equal(
                client.infer_shm("identity", {"INPUT0": ones})["OUTPUT0"], ones
            )
        triton = grpcclient.InferenceServerClient(server.grpc_url)
        configs = {
            m: triton.get_model_config(m, as_json=True)["config"] for m in ("affine", "scale")
        }
        stats = triton.get_inference_statistics("affine", as_json=True)["model_stats"][0]
        triton.close()
        requests = int(stats["inference_stats"]["success"]["count"])
        assert int(stats["execution_count"]) < requests  # some ran together, as one batch
        assert configs["affine"]["backend"] == "python"
        assert configs["affine"]["max_batch_size"] == 16  # the config's
        assert "dynamic_batching" in configs["affine"]
        assert configs["scale"].get("max_batch_size", 0) == 0  # the graph's: no batch dimension
        assert [i["dims"] for i in configs["scale"]["input"]] == [["2", "3"]]


def test_a_server_environment_without_onnxruntime_says_how_to_install_it(tmp_path: Path) -> None:
    _affine_model(tmp_path / "model.onnx")
    shadow = tmp_path / "shadow" / "onnxruntime"  # a Python where onnxruntime cannot import
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named onnxruntime')\n")
    install = find_tritonserver()
    python = install.python()
    assert python is not None
    env = {**install.environ(), "PYTHONPATH": str(shadow.parent)}
    with pytest.raises(LocalServerError, match=r"setup-server --with onnxruntime"):
        onnx_signature(tmp_path / "model.onnx", python=python, env=env)


def test_the_guides_commands_are_the_command_lines() -> None:
    """The own-model guide and the command-line page show commands the parser takes, and the
    container of the error's command line."""
    from ray_triton_shm._cli import build_parser

    for page in ("docs/guide/own-model.md", "docs/cli.md"):
        text = (REPO_ROOT / page).read_text()
        lines = [
            line
            for block in re.findall(r"```bash\n(.*?)```", text, re.S)
            if "--onnx-via-python" in block
            for line in block.splitlines()
        ]
        commands = [shlex.split(line)[1:] for line in lines if line.startswith("ray-triton-shm ")]
        parsed = [build_parser().parse_args(words) for words in commands]
        assert [p.command for p in parsed] == ["setup-server", "serve-local"], page
        assert parsed[0].packages == ["onnxruntime"] and parsed[1].onnx_via_python, page
    assert TRITON_CONTAINER_IMAGE in (REPO_ROOT / "docs/guide/own-model.md").read_text()
