"""A model repository's backends, read before Triton starts, alone: configs, files, the error."""

from __future__ import annotations

from pathlib import Path

import pytest

from ray_triton_shm.local import EXAMPLE_MODEL_REPOSITORY
from ray_triton_shm.local._repository import (
    TRITON_CONTAINER_IMAGE,
    available_backends,
    container_command,
    model_backend,
    model_backends,
    needs_auto_complete,
    unsupported_message,
)


def _model(repo: Path, name: str, config: str | None = None, file: str | None = None) -> Path:
    directory = repo / name
    (directory / "1").mkdir(parents=True)
    if config is not None:
        (directory / "config.pbtxt").write_text(config)
    if file is not None:
        (directory / "1" / file).write_bytes(b"")
    return directory


@pytest.mark.parametrize(
    ("platform", "backend"),
    [
        ("onnxruntime_onnx", "onnxruntime"),
        ("tensorrt_plan", "tensorrt"),
        ("pytorch_libtorch", "pytorch"),
        ("tensorflow_savedmodel", "tensorflow"),
        ("tensorflow_graphdef", "tensorflow"),
        ("openvino_xml", "openvino_xml"),  # unknown: named as it is
    ],
)
def test_a_platform_names_its_backend(tmp_path: Path, platform: str, backend: str) -> None:
    found = model_backend(_model(tmp_path, "m", f'name: "m"\nplatform: "{platform}"\n'))
    assert (found.backend, found.platform, found.source) == (backend, platform, "platform")


def test_the_backend_field_wins_and_comments_do_not_count(tmp_path: Path) -> None:
    config = '# backend: "onnxruntime"\nbackend: "python"\nplatform: "onnxruntime_onnx"\n'
    assert model_backend(_model(tmp_path, "m", config)).backend == "python"
    commented = model_backend(_model(tmp_path, "c", '# platform: "tensorrt_plan"\n'))
    assert commented.backend is None


@pytest.mark.parametrize(
    ("file", "backend"),
    [
        ("model.onnx", "onnxruntime"),
        ("model.plan", "tensorrt"),
        ("model.pt", "pytorch"),
        ("model.graphdef", "tensorflow"),
        ("model.py", "python"),
    ],
)
def test_without_a_config_the_model_file_says(tmp_path: Path, file: str, backend: str) -> None:
    found = model_backend(_model(tmp_path, "m", file=file))
    assert (found.backend, found.source) == (backend, file)


def test_a_config_without_backend_or_platform_falls_back_to_the_file(tmp_path: Path) -> None:
    found = model_backend(_model(tmp_path, "m", "max_batch_size: 8\n", file="model.onnx"))
    assert found.backend == "onnxruntime"


def test_an_ensemble_or_an_empty_model_needs_no_backend(tmp_path: Path) -> None:
    assert model_backend(_model(tmp_path, "e", 'platform: "ensemble"\n')).backend is None
    assert model_backend(_model(tmp_path, "x")).backend is None


def test_the_example_models_are_all_python() -> None:
    models = model_backends(EXAMPLE_MODEL_REPOSITORY)
    assert models and {m.backend for m in models} == {"python"}


def test_auto_complete_is_needed_only_where_it_would_change_a_config(tmp_path: Path) -> None:
    python = 'backend: "python"\nmax_batch_size: 8\n'
    complete = tmp_path / "complete"
    _model(complete, "a", python, "model.py")
    _model(complete, "b", python, "model.py")
    assert not needs_auto_complete([complete, EXAMPLE_MODEL_REPOSITORY])
    # A model.py that completes its own config.
    completes = _model(tmp_path / "completes", "c", python, "model.py")
    (completes / "1" / "model.py").write_text("def auto_complete_config(config):\n")
    # No config at all; another backend, whose file gives inputs and outputs.
    _model(tmp_path / "bare", "d", None, "model.py")
    _model(tmp_path / "onnx", "e", 'platform: "onnxruntime_onnx"\n', "model.onnx")
    for repository in ("completes", "bare", "onnx"):
        assert needs_auto_complete([complete, tmp_path / repository]), repository


def test_a_linked_model_is_named_by_its_link(tmp_path: Path) -> None:
    original = _model(tmp_path / "elsewhere", "real", 'platform: "onnxruntime_onnx"\n')
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "served").symlink_to(original, target_is_directory=True)
    (found,) = model_backends(tmp_path / "repo")
    assert (found.name, found.directory) == ("served", original.resolve())


def test_available_backends_are_the_folders(tmp_path: Path) -> None:
    (tmp_path / "python").mkdir()
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "README").write_text("")
    assert available_backends(tmp_path) == ("onnxruntime", "python")
    assert available_backends(tmp_path / "missing") == ()


def test_the_container_command_shares_dev_shm_and_mounts_each_repository() -> None:
    one = container_command([Path("/data/models")])
    assert one.startswith("docker run --rm --ipc=host ")
    assert "-p 8001:8001" in one and "-v /data/models:/models:ro" in one
    assert one.endswith(f"{TRITON_CONTAINER_IMAGE} tritonserver --model-repository=/models")
    two = container_command([Path("/a"), Path("/b c")])
    assert "-v /a:/models0:ro -v '/b c:/models1:ro'" in two
    assert two.endswith("--model-repository=/models0 --model-repository=/models1")


def test_the_message_names_each_model_what_the_server_has_and_the_ways_forward(
    tmp_path: Path,
) -> None:
    onnx = model_backend(_model(tmp_path, "digits", 'platform: "onnxruntime_onnx"\n'))
    plan = model_backend(_model(tmp_path, "detector", file="model.plan"))
    message = unsupported_message([onnx, plan], ("python",), [tmp_path])
    assert "the backend(s) 'python' only" in message
    assert (
        f"model 'digits' (platform \"onnxruntime_onnx\": backend 'onnxruntime') in {tmp_path}"
        in message
    )
    assert "model 'detector' (its file model.plan: backend 'tensorrt')" in message
    assert "Three ways forward:\n  1. NVIDIA's Triton container" in message
    assert "docker run" in message
    assert "2. Serve the ONNX model(s) (digits)" in message
    assert "setup-server --with onnxruntime" in message and "--onnx-via-python" in message
    assert "3. Serve detector through the Python backend" in message
    only_plan = unsupported_message([plan], ("python",), [tmp_path])
    assert "--onnx-via-python" not in only_plan and "2. Serve detector" in only_plan
    assert "Two ways forward" in only_plan
