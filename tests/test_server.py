"""Tests of the embedded Triton server and the example / test model repositories."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as sysshm
from _helpers import FRESH_MODELS
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from ray_triton_shm.local import _install
from ray_triton_shm.local._install import ensure_server_env, find_tritonserver, server_env_dir
from ray_triton_shm.local._server import (
    EXAMPLE_MODEL_REPOSITORY,
    LocalServerError,
    LocalTritonServer,
)

TEST_MODEL_REPOSITORY = Path(__file__).resolve().parent / "models"
EXAMPLE_MODELS = {
    "identity",
    "identity_dynamic",
    "classifier",
    "classifier_dynamic",
    "my_model",
    "large_image",
    "add_nobatch",
    "upper",
    "captioner",
}
TEST_MODELS = {
    "slow_identity",
    "fail_on_negative",
    "strings",
    "variable_output",
    "mixed_io",
    "delay_echo",
    "sequence_sum",
    "queued",
    "echo_parameters",
    "whoami",
    "batch_affine",
}


def _infer(
    url: str, model: str, inputs: dict[str, np.ndarray], outputs: list[str]
) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(url)
    try:
        infer_inputs = []
        for name, array in inputs.items():
            inp = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            inp.set_data_from_numpy(array)
            infer_inputs.append(inp)
        result = client.infer(
            model,
            infer_inputs,
            outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
        )
        return {n: result.as_numpy(n) for n in outputs}
    finally:
        client.close()


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields: state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _one_model_repo(tmp_path: Path, model: str = "identity") -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_MODEL_REPOSITORY / model, repo / model)
    return repo


# ---- the session server ---------------------------------------------------------------


def test_server_is_live_and_all_models_ready(triton: LocalTritonServer) -> None:
    assert triton.is_running
    assert triton.pid is not None
    assert triton.grpc_url == f"127.0.0.1:{triton.grpc_port}"
    assert triton.http_url == f"127.0.0.1:{triton.http_port}"
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        index = client.get_model_repository_index(as_json=True)["models"]
        states = {m["name"]: m.get("state") for m in index}
        assert set(states) == EXAMPLE_MODELS | TEST_MODELS
        assert set(states.values()) == {"READY"}
        for model in EXAMPLE_MODELS | TEST_MODELS:
            assert client.is_model_ready(model)
    finally:
        client.close()


def test_http_endpoint_and_metrics(triton: LocalTritonServer) -> None:
    import urllib.request

    with urllib.request.urlopen(f"http://{triton.http_url}/v2/health/ready", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(triton.metrics_url, timeout=5) as r:
        assert b"nv_inference_count" in r.read()


def test_identity(grpc_url: str) -> None:
    x = np.arange(2 * 7, dtype=np.float32).reshape(2, 7) - 3.5
    out = _infer(grpc_url, "identity", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x)


def test_classifier(grpc_url: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 3, 224, 224), dtype=np.float32)
    out = _infer(grpc_url, "classifier", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    expected = x.reshape(3, -1)[:, :150000].reshape(3, 1000, 150).mean(axis=2)
    assert out.shape == (3, 1000)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_my_model(grpc_url: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 224, 224), dtype=np.float32)
    f = rng.integers(-100, 100, size=(2, 10), dtype=np.int32)
    out = _infer(grpc_url, "my_model", {"INPUT0": x, "INPUT1": f}, ["OUTPUT0", "OUTPUT1"])
    expected0 = x.reshape(2, -1)[:, :512] + f.sum(axis=1, keepdims=True).astype(np.float32)
    assert out["OUTPUT0"].shape == (2, 512)
    assert out["OUTPUT0"].dtype == np.float32
    np.testing.assert_allclose(out["OUTPUT0"], expected0, rtol=1e-6)
    assert out["OUTPUT1"].dtype == np.int32
    np.testing.assert_array_equal(out["OUTPUT1"], f[:, :5] * 2)


def test_large_image_full_batch(grpc_url: str) -> None:
    rng = np.random.default_rng(2)
    x = rng.random((2, 3, 1024, 1024), dtype=np.float32)
    out = _infer(grpc_url, "large_image", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert out.shape == x.shape
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.float32(1.0) - x)


def test_large_image_batch_limit(grpc_url: str) -> None:
    x = np.zeros((3, 3, 1024, 1024), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="batch"):
        _infer(grpc_url, "large_image", {"INPUT0": x}, ["OUTPUT0"])


def test_add_nobatch(grpc_url: str) -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    b = np.array([0.5, -2.0, 10.0, 0.25], dtype=np.float32)
    out = _infer(grpc_url, "add_nobatch", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])["OUTPUT0"]
    assert out.shape == (4,)
    np.testing.assert_array_equal(out, a + b)


def test_fail_on_negative(grpc_url: str) -> None:
    ok = np.array([[0.0, 1.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(
        _infer(grpc_url, "fail_on_negative", {"INPUT0": ok}, ["OUTPUT0"])["OUTPUT0"], ok
    )
    bad = np.array([[0.0, -1.0, 2.0]], dtype=np.float32)
    with pytest.raises(InferenceServerException, match="negative input"):
        _infer(grpc_url, "fail_on_negative", {"INPUT0": bad}, ["OUTPUT0"])


def test_strings(grpc_url: str) -> None:
    x = np.array([[b"hello"], ["wörld".encode()], [b""]], dtype=np.object_)
    out = _infer(grpc_url, "strings", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    assert out.shape == (3, 1)
    assert out.tolist() == x.tolist()


def test_variable_output(grpc_url: str) -> None:
    for counts in ([[3]], [[1], [6], [2]], [[0]]):
        n_in = np.array(counts, dtype=np.int32)
        out = _infer(grpc_url, "variable_output", {"INPUT0": n_in}, ["OUTPUT0"])["OUTPUT0"]
        n = int(n_in.max())
        assert out.dtype == np.float32
        assert out.shape == (len(counts), n)
        np.testing.assert_array_equal(
            out, np.tile(np.arange(n, dtype=np.float32), (len(counts), 1))
        )


# ---- lifecycle --------------------------------------------------------------------------


def test_stop_is_idempotent_and_frees_the_process_group(fresh_triton: LocalTritonServer) -> None:
    pid = fresh_triton.pid
    assert pid is not None
    members = _group_members(pid)
    # tritonserver plus one Python-backend stub per model instance.
    assert len(members) >= 1 + len(FRESH_MODELS)
    fresh_triton.stop()
    assert not fresh_triton.is_running
    assert fresh_triton.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _group_members(pid) == []
    fresh_triton.stop()  # idempotent
    assert not fresh_triton.is_running
    # The ports are free again.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", fresh_triton.grpc_port))


def test_restart_keeps_ports_and_forgets_shm_registrations(
    fresh_triton: LocalTritonServer,
) -> None:
    grpc_url, http_url, old_pid = fresh_triton.grpc_url, fresh_triton.http_url, fresh_triton.pid
    key = f"/rtshm_test_{os.getpid()}"
    handle = sysshm.create_shared_memory_region("test_region", key, 64)
    try:
        client = grpcclient.InferenceServerClient(grpc_url)
        client.register_system_shared_memory("test_region", key, 64)
        status = client.get_system_shared_memory_status(as_json=True)
        assert [r["name"] for r in status.get("regions", {}).values()] == ["test_region"]
        client.close()

        assert fresh_triton.restart() is fresh_triton
        assert fresh_triton.grpc_url == grpc_url
        assert fresh_triton.http_url == http_url
        assert fresh_triton.pid not in (None, old_pid)

        client = grpcclient.InferenceServerClient(grpc_url)
        assert client.is_server_ready()
        assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
        client.close()
        x = np.ones((1, 3), dtype=np.float32)
        np.testing.assert_array_equal(
            _infer(grpc_url, "identity", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x
        )
    finally:
        sysshm.destroy_shared_memory_region(handle)


def test_two_servers_at_once(triton: LocalTritonServer, tmp_path: Path) -> None:
    with LocalTritonServer(_one_model_repo(tmp_path)) as other:
        assert other.is_running and triton.is_running
        assert other.grpc_port not in (triton.grpc_port, triton.http_port, triton.metrics_port)
        assert other.pid != triton.pid
        x = np.full((1, 4), 2.5, dtype=np.float32)
        for url in (triton.grpc_url, other.grpc_url):
            np.testing.assert_array_equal(
                _infer(url, "identity", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x
            )
        client = grpcclient.InferenceServerClient(other.grpc_url)
        names = {m["name"] for m in client.get_model_repository_index(as_json=True)["models"]}
        client.close()
        assert names == {"identity"}
    assert not other.is_running
    assert triton.is_running


_COMPLETES_ITS_CONFIG = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


def _argv(pid: int | None) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_auto_complete_runs_only_where_a_model_needs_it(
    triton: LocalTritonServer, tmp_path: Path
) -> None:
    # Every model of the session's server has its whole config: no auto-complete, whose stub
    # process per model costs a second at each load.
    assert "--disable-auto-complete-config" in _argv(triton.pid)
    repo = _one_model_repo(tmp_path)
    model = repo / "completes"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 8\n')
    (model / "1" / "model.py").write_text(_COMPLETES_ITS_CONFIG)
    with LocalTritonServer(repo, log_path=tmp_path / "t.log") as server:
        assert "--disable-auto-complete-config" not in _argv(server.pid)
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        out = _infer(server.grpc_url, "completes", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
        np.testing.assert_array_equal(out, x)


def test_context_manager_and_close(tmp_path: Path) -> None:
    server = LocalTritonServer(_one_model_repo(tmp_path), log_path=tmp_path / "t.log")
    with server as s:
        assert s is server
        pid = s.pid
        assert pid is not None
    assert not server.is_running
    assert _group_members(pid) == []
    assert "Started GRPCInferenceService" in (tmp_path / "t.log").read_text()
    server.close()
    server.close()
    with pytest.raises(LocalServerError):
        server.start()


def test_bad_model_repository_gives_log_tail(tmp_path: Path) -> None:
    repo = tmp_path / "bad_repo"
    (repo / "broken_model" / "1").mkdir(parents=True)
    (repo / "broken_model" / "config.pbtxt").write_text(
        'name: "broken_model"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    (repo / "broken_model" / "1" / "model.py").write_text(
        "raise RuntimeError('this model is broken on purpose')\n"
    )
    server = LocalTritonServer(repo, startup_timeout_s=60)
    try:
        with pytest.raises(LocalServerError) as info:
            server.start()
        message = str(info.value)
        assert "exited with code" in message
        assert "broken_model" in message
        assert "this model is broken on purpose" in message
        assert not server.is_running
    finally:
        server.close()


def test_the_python_backends_abort_while_loading_is_retried(tmp_path: Path) -> None:
    """The Python backend now and then aborts the whole server while it loads models
    (``boost::interprocess::lock_exception``, Triton's issue 8882): seen here at startup. The
    model's stub aborts its server that way once; the second start serves it."""
    repo = _one_model_repo(tmp_path)
    marker = tmp_path / "aborted-once"
    model_py = repo / "identity" / "1" / "model.py"
    model_py.write_text(
        "import os, signal, sys\n"
        f"if not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        '    sys.stderr.write("terminate called after throwing an instance of "\n'
        "                     \"'boost::interprocess::lock_exception'\\n\")\n"
        "    sys.stderr.flush()\n"
        "    os.kill(os.getppid(), signal.SIGABRT)\n" + model_py.read_text()
    )
    server = LocalTritonServer(repo, startup_timeout_s=60)
    try:
        server.start()
        assert marker.exists()  # it did abort once
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            assert client.is_model_ready("identity")
        finally:
            client.close()
    finally:
        server.close()


def test_missing_model_repository(tmp_path: Path) -> None:
    server = LocalTritonServer(tmp_path / "does-not-exist")
    try:
        with pytest.raises(LocalServerError, match="not a directory"):
            server.start()
    finally:
        server.close()


def test_fixed_port_in_use_is_reported(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        server = LocalTritonServer(_one_model_repo(tmp_path), grpc_port=port)
        try:
            with pytest.raises(LocalServerError, match=f"in use.*grpc {port}"):
                server.start()
            assert not server.is_running
        finally:
            server.close()


def test_child_does_not_outlive_the_python_process(tmp_path: Path) -> None:
    repo = _one_model_repo(tmp_path)
    code = (
        "from ray_triton_shm.local._server import LocalTritonServer\n"
        f"s = LocalTritonServer({str(repo)!r}).start()\n"
        "print(s.pid, flush=True)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180
    )
    assert result.returncode == 0, result.stderr
    pid = int(result.stdout.split()[-1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _group_members(pid) == []


# ---- locating / installing the binary ---------------------------------------------------


def test_server_env_dir_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAY_TRITON_SHM_SERVER_ENV", str(tmp_path / "env"))
    assert server_env_dir() == tmp_path / "env"
    monkeypatch.delenv("RAY_TRITON_SHM_SERVER_ENV")
    major, minor = sys.version_info[:2]
    assert server_env_dir() == (
        Path.home() / ".cache" / "ray-triton-shm" / f"server-env-py{major}{minor}"
    )


def test_ensure_server_env_is_a_no_op_when_ready(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env_dir = tmp_path / "env"
    binary = env_dir / "lib" / "python3.11" / "site-packages" / "pytriton" / "tritonserver"
    (binary / "bin").mkdir(parents=True)
    (binary / "bin" / "tritonserver").write_text("#!/bin/sh\n")
    import json

    (env_dir / _install._MARKER_NAME).write_text(
        json.dumps({"requirements": list(_install.SERVER_ENV_REQUIREMENTS)})
    )
    monkeypatch.setenv("RAY_TRITON_SHM_SERVER_ENV", str(env_dir))

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("ensure_server_env ran a command on a ready environment")

    monkeypatch.setattr(_install.subprocess, "run", no_subprocess)
    assert ensure_server_env(quiet=True) == env_dir


def test_an_environment_set_up_for_other_requirements_still_serves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One an earlier release set up (without perf_analyzer's tritonclient) runs the server
    as it is; install=True (setup-server, the bench) brings it up to date first."""
    import json

    env_dir = tmp_path / "env"
    binary = env_dir / "lib" / "python3.11" / "site-packages" / "pytriton" / "tritonserver"
    binary = binary / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    earlier = [r for r in _install.SERVER_ENV_REQUIREMENTS if not r.startswith("tritonclient")]
    (env_dir / _install._MARKER_NAME).write_text(json.dumps({"requirements": earlier}))
    monkeypatch.setenv("RAY_TRITON_SHM_SERVER_ENV", str(env_dir))
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no tritonserver on it

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("a library call ran a command (pip) without install=True")

    monkeypatch.setattr(_install.subprocess, "run", no_subprocess)
    found = find_tritonserver()
    assert (found.source, found.executable) == ("server-env", binary.resolve())
    brought_up_to_date = []
    monkeypatch.setattr(
        _install, "ensure_server_env", lambda quiet: brought_up_to_date.append(quiet) or env_dir
    )
    assert find_tritonserver(install=True).executable == binary.resolve()
    assert brought_up_to_date == [True]


def test_find_tritonserver_honours_env_var(
    monkeypatch: pytest.MonkeyPatch, triton: LocalTritonServer, tmp_path: Path
) -> None:
    default = find_tritonserver()
    monkeypatch.setenv("TRITONSERVER", str(default.executable))
    explicit = find_tritonserver()
    assert explicit.source == "TRITONSERVER"
    assert explicit.executable == default.executable
    assert explicit.python_stub == default.python_stub

    monkeypatch.setenv("TRITONSERVER", str(tmp_path / "nope"))
    with pytest.raises(LocalServerError, match="not an executable"):
        find_tritonserver()


def test_a_library_call_never_installs_the_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAY_TRITON_SHM_SERVER_ENV", str(tmp_path / "empty-env"))
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no tritonserver on it

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("a library call ran a command (pip) without install=True")

    monkeypatch.setattr(_install.subprocess, "run", no_subprocess)
    with pytest.raises(LocalServerError, match=r"ray-triton-shm setup-server.*install=True"):
        find_tritonserver()
    server = LocalTritonServer()
    try:
        with pytest.raises(LocalServerError, match="setup-server"):
            server.start()
    finally:
        server.close()
    assert not (tmp_path / "empty-env").exists()
