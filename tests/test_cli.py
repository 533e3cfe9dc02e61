"""Tests of the ``ray-triton-shm`` command line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from _helpers import free_ports, wait_for
from tritonclient.utils import InferenceServerException

from ray_triton_shm import TritonSHMClient
from ray_triton_shm._cli import main
from ray_triton_shm.local._server import LocalTritonServer

REPO_ROOT = Path(__file__).resolve().parent.parent
SUBCOMMANDS = ("setup-server", "serve-local", "bench", "doctor", "status", "reclaim", "grafana")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out
    for name in SUBCOMMANDS:
        assert main([name, "--help"]) == 0
        assert "usage: ray-triton-shm " + name in capsys.readouterr().out


def test_python_dash_m_and_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ray_triton_shm", "--version"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ray-triton-shm ")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["no-such-command"],
        ["serve-local", "--grpc-port", "not-a-port"],
        ["bench", "--slice-s"],
        ["status", "--bogus"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def _identity_answers(grpc_port: int) -> None:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        assert client.is_server_ready()
        assert client.is_model_ready("identity")
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        infer_input = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        infer_input.set_data_from_numpy(data)
        result = client.infer("identity", [infer_input])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_serve_local_answers_restarts_a_crashed_triton_then_stops_on_sigint() -> None:
    grpc_port, http_port, metrics_port = free_ports(3)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ray_triton_shm",
            "serve-local",
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            "--metrics-port",
            str(metrics_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    lines: list[str] = []
    server_pid = None
    try:
        out, err = proc.stdout, proc.stderr
        assert out is not None and err is not None

        def printed(start: str) -> str | None:
            """Its next line, if that starts with ``start`` (reading waits for one)."""
            line = out.readline()
            assert line or proc.poll() is None, "".join(lines) + err.read()
            lines.append(line)
            return line if line.startswith(start) else None

        wait_for(lambda: printed("Press Ctrl-C"), timeout_s=240, every_s=0, what="it ready")
        text = "".join(lines)
        server_pid = int(re.search(r"pid (\d+)", text).group(1))  # type: ignore[union-attr]
        assert f"127.0.0.1:{grpc_port}" in text and f"127.0.0.1:{http_port}" in text
        assert f"metrics: http://127.0.0.1:{metrics_port}/metrics" in text  # a steady target
        for model in ("identity", "classifier", "my_model", "large_image"):
            assert model in text

        _identity_answers(grpc_port)

        # A crash (as Triton's Python backend can abort): said as it happens, and Triton is
        # back on the same ports.
        os.kill(server_pid, signal.SIGABRT)
        line = wait_for(
            lambda: printed("Triton is back"), timeout_s=240, every_s=0, what="Triton back"
        )
        crashed = next(line for line in lines if line.startswith("Triton crash 1"))
        assert f"(pid {server_pid}): SIGABRT" in crashed and "restarting it (log: " in crashed
        kept = Path(crashed.rsplit("(log: ", 1)[1].rstrip(")\n"))
        assert kept.is_file()  # the evidence is kept, though no --log-file was given
        restarted_pid = int(re.search(r"pid (\d+)", line).group(1))  # type: ignore[union-attr]
        _identity_answers(grpc_port)
        # The restarted Triton's metrics are where Prometheus looked for the first one's.
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            assert b"nv_inference_request_success" in r.read()

        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "Stopped." in stderr
    for pid in (server_pid, restarted_pid):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    kept.unlink()
    with (
        grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client,
        pytest.raises(InferenceServerException),
    ):
        client.is_server_live(client_timeout=2.0)


def test_serve_local_bad_repository_fails(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_triton_shm",
            "serve-local",
            "--model-repository",
            str(tmp_path / "missing"),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert result.returncode == 1
    assert "not a directory" in result.stderr


def test_status_shows_a_registered_region(
    triton: LocalTritonServer, client: TritonSHMClient, capsys: pytest.CaptureFixture[str]
) -> None:
    client.register_shm_model("classifier", pool_size=1)
    client.register_shm_model("my_model", pool_size=1, transport="inline")
    assert main(["status", "--url", triton.grpc_url]) == 0
    out = capsys.readouterr().out
    assert f"server: {triton.grpc_url}" in out
    assert out.splitlines()[1].split()[-2:] == ["transport", "layout"]
    # Each region says how its pool reaches Triton: by value, it is never registered.
    assert re.search(rf"rtshm_{os.getpid()}-\w+classifier.*alive\s+yes\s+yes\s+shm\s+v3", out), out
    assert re.search(rf"rtshm_{os.getpid()}-\w+my_model.*alive\s+yes\s+no\s+inline", out), out
    assert "regions of transport 'inline' send their tensors by value" in out


def test_status_ray_says_each_model_s_transport_and_why() -> None:
    pytest.importorskip("ray")
    from ray_triton_shm.ray._config import NodeStats
    from ray_triton_shm.ray._status import COLUMNS, format_node_actors

    def model(transport: str, reason: str) -> dict[str, object]:
        return {**dict.fromkeys(COLUMNS, 0), "limited_by": "", "transport": transport} | {
            "transport_reason": reason
        }

    far = "Triton at t:8001 could not open /dev/shm/rtshm_1-a_b@0 (Unable to open): it runs..."
    near = "Triton at t:8001 mapped the region: a probe request's outputs landed in it"
    stats = NodeStats("n1", "t:8001", 7, "i1", {"b": model("inline", far), "a": model("shm", near)})
    text, unasked = format_node_actors(
        [{"name": "x", "stats": stats}, {"name": "y", "error": "gone"}], "ns"
    )
    assert unasked
    lines = text.splitlines()
    header = next(line for line in lines if line.strip().startswith("model"))
    assert header.split()[:3] == ["model", "transport", "slots"]
    rows = {line.split()[0]: line.split()[1] for line in lines if line.startswith("    a ")}
    rows |= {line.split()[0]: line.split()[1] for line in lines if line.startswith("    b ")}
    assert rows == {"a": "shm", "b": "inline"}
    # Under the table, why, whole.
    assert f"    a: shm (through shared memory), because {near}" in lines
    assert f"    b: inline (by value, in the requests), because {far}" in lines
    assert "  y: could not be asked: gone" in lines


def test_status_flags_a_dead_owner_and_reclaim_takes_its_region_back(
    triton: LocalTritonServer,
    register_then_sigkill: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = register_then_sigkill(triton.grpc_url, crash_cleanup=False)
    assert main(["status", "--url", triton.grpc_url]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if name in line)
    assert " no " in f" {row} ", row  # owner alive: no
    assert main(["reclaim", "--url", triton.grpc_url]) == 0
    out = capsys.readouterr().out
    assert "unregistered from Triton: " in out and name in out
    assert main(["status", "--url", triton.grpc_url]) == 0
    assert name not in capsys.readouterr().out


def test_status_and_reclaim_local_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--local"]) == 0
    assert "server: (not asked)" in capsys.readouterr().out
    assert main(["reclaim", "--local"]) == 0
    out = capsys.readouterr().out
    assert "unregistered from Triton: 0" in out and "unlinked from /dev/shm" in out


def test_status_unreachable_server_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--url", "127.0.0.1:1"]) == 1
    assert "could not be asked" in capsys.readouterr().err
