"""Tests of ``ray-triton-shm bench`` against the session's real Triton server."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from _helpers import registered_on
from rich.console import Console

from ray_triton_shm._bench import _paths as bench_paths
from ray_triton_shm._bench import _ray_paths, _runner
from ray_triton_shm._bench._cases import CASES
from ray_triton_shm._bench._config import (
    CASE_NAMES,
    DEFAULT_PATHS,
    DEFAULT_RAY_CALLERS,
    RAY_PATHS,
    BenchConfig,
)
from ray_triton_shm._bench._paths import BenchPath, SkipPath
from ray_triton_shm._bench._report import num, print_results, write_plot
from ray_triton_shm._bench._runner import BenchResults, run_bench
from ray_triton_shm._cli import main
from ray_triton_shm.local._server import LocalTritonServer

REPO_ROOT = Path(__file__).resolve().parent.parent
SHM_DIR = Path("/dev/shm")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def _regions_of(pid: int) -> list[str]:
    """Regions in /dev/shm created by ``pid`` through the library or the bench's manual path."""
    prefixes = (f"rtshm_{pid}-", f"{bench_paths.SHM_KEY_PREFIX}{pid}_")
    return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefixes))


def _bench_cmd(triton: LocalTritonServer, *extra: str, progress: bool = False) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ray_triton_shm",
        "bench",
        "--url",
        triton.grpc_url,
        "--http-url",
        triton.http_url,
        *(() if progress else ("--no-progress",)),
        *extra,
    ]


def _printed(results: BenchResults) -> str:
    """What ``bench`` prints for ``results`` when stdout is not a terminal."""
    out = io.StringIO()
    print_results(results, Console(file=out, width=1000))
    return out.getvalue()


def test_bench_quick_json_has_every_model_and_path(
    triton: LocalTritonServer, tmp_path: Path
) -> None:
    json_path = tmp_path / "out" / "bench.json"
    plot_path = tmp_path / "out" / "bench.png"
    registered_before = registered_on(triton.grpc_url)
    proc = subprocess.Popen(
        _bench_cmd(
            triton, "--quick", "--json", str(json_path), "--plot", str(plot_path), progress=True
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"

    data = json.loads(json_path.read_text())
    assert set(data["models"]) == set(CASES)
    for model, entry in data["models"].items():
        strings = CASES[model].has_bytes
        assert entry["input_bytes_per_request"] == CASES[model].input_nbytes
        assert set(entry["paths"]) == set(DEFAULT_PATHS), model
        for path, result in entry["paths"].items():
            where = f"{model}/{path}"
            if strings and path == "memcpy":
                assert result["skipped"] == "BYTES tensors have no fixed-size bytes to copy"
                continue
            assert result["ok"] and result["verified"], (where, result)
            assert result["error"] is None and result["skipped"] is None, where
            assert result["requests"] > 0, where
            for key in ("mb_per_s", "requests_per_s", "cpu_s_per_gb", "wall_s"):
                assert result[key] is not None and result[key] > 0, (where, key, result[key])
            assert len(result["slices"]) == data["config"]["rounds"], where
        ratios = entry["ratios"]
        assert ratios["shm_client_vs_grpc_mb_per_s"] > 0
        assert strings or ratios["shm_client_vs_memcpy_cpu_s_per_gb"] > 0
    goals = {(g["model"], g["kind"]): g for g in data["goals"]}
    assert len(goals) == 8
    assert all(g["value"] is not None and isinstance(g["met"], bool) for g in goals.values())
    assert data["failures"] == []

    assert "shm-client" in stdout and "Goals" in stdout
    # Not a terminal: plain text, and the progress bar draws nothing.
    assert "\x1b" not in stdout + stderr and "\r" not in stdout + stderr
    assert "%" not in stderr
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert _regions_of(proc.pid) == []
    assert registered_on(triton.grpc_url) - registered_before == set()


def test_bench_ctrl_c_cleans_up(triton: LocalTritonServer, tmp_path: Path) -> None:
    registered_before = registered_on(triton.grpc_url)
    proc = subprocess.Popen(
        _bench_cmd(
            triton,
            "--models",
            "classifier",
            "--paths",
            "shm-manual",
            "shm-client",
            "--rounds",
            "1000",
            "--no-plot",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 120
        # Both shm paths have set up once the library's region exists (set up second).
        while not any(n.startswith(f"rtshm_{proc.pid}-") for n in _regions_of(proc.pid)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the bench never created its regions"
            time.sleep(0.1)
        assert any(n.startswith(bench_paths.SHM_KEY_PREFIX) for n in _regions_of(proc.pid))
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    assert _regions_of(proc.pid) == []
    assert registered_on(triton.grpc_url) - registered_before == set()


class _WrongOutputs(BenchPath):
    """A broken path: fast, but returns zeros."""

    name = "test-wrong-outputs"
    label = "broken"

    def setup(self) -> None:
        self._zeros = {n: np.zeros_like(a) for n, a in self.reference.items()}

    def run_once(self) -> Mapping[str, np.ndarray]:
        return self._zeros

    def teardown(self) -> None:
        pass


class _Unavailable(BenchPath):
    name = "test-unavailable"
    label = "unavailable"

    def setup(self) -> None:
        raise SkipPath("not here")

    def run_once(self) -> Mapping[str, np.ndarray]:
        raise AssertionError("never run")

    def teardown(self) -> None:
        pass


def test_a_wrong_path_posts_no_numbers(
    triton: LocalTritonServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for cls in (_WrongOutputs, _Unavailable):
        monkeypatch.setitem(_runner.PATHS, cls.name, cls)
    config = BenchConfig(
        models=("classifier",),
        paths=("grpc", _WrongOutputs.name, _Unavailable.name, "memcpy"),
        rounds=2,
        slice_s=0.05,
        warmup_requests=1,
        url=triton.grpc_url,
    )
    results = run_bench(config)
    (model,) = results.models
    wrong = model.paths[_WrongOutputs.name]
    assert not wrong.verified and not wrong.ok
    assert wrong.error is not None and "differ" in wrong.error
    assert wrong.mb_per_s is None and wrong.slices == []
    assert model.paths[_Unavailable.name].skipped == "not here"
    assert model.paths["grpc"].ok and model.paths["memcpy"].ok
    assert results.failures == [f"classifier/{_WrongOutputs.name}: {wrong.error}"]
    printed = _printed(results)
    assert f"FAILED: {wrong.error}" in printed and "skipped: not here" in printed
    # Goals about the shm client are reported as not measured, not as met or missed.
    goal_lines = [line for line in printed.splitlines() if "not measured" in line]
    assert goal_lines and all(line.startswith("n/a") for line in goal_lines)
    assert all(g.met is None for g in results.goals())


def test_bench_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--models", "no_such_model", "--url", "x:1"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["bench", "--paths", "carrier-pigeon", "--url", "x:1"]) == 2
    assert "unknown path" in capsys.readouterr().err
    assert main(["bench", "--ray", "--ray-callers", "0", "--url", "x:1"]) == 2
    assert "--ray-callers must be at least 1" in capsys.readouterr().err
    assert main(["bench", "--rounds", "0", "--url", "x:1"]) == 2
    assert main(["bench", "--http-url", "x:2"]) == 2
    assert main(["bench", "--rounds", "many"]) == 2


def test_bench_unreachable_server_fails_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "--quick",
            "--models",
            "identity",
            "--paths",
            "grpc",
            "--url",
            "127.0.0.1:1",
            "--no-plot",
            "--no-progress",
        ]
    )
    assert code == 1
    assert "reference gRPC request failed" in capsys.readouterr().err


def test_the_light_names_are_those_of_the_cases_and_paths() -> None:
    assert tuple(CASES) == CASE_NAMES
    assert tuple(cls.name for cls in bench_paths.PATHS) == DEFAULT_PATHS
    assert tuple(cls.name for cls in _ray_paths.PATHS) == RAY_PATHS
    assert tuple(_runner.PATHS) == (*DEFAULT_PATHS, *RAY_PATHS)
    assert BenchConfig().ray_callers == DEFAULT_RAY_CALLERS


def test_one_number_format() -> None:
    cases = {
        None: "-",
        0: "0",
        0.000123456: "0.000123",
        0.93: "0.93",
        1: "1.00",
        3.8149: "3.81",
        10.83: "10.8",
        449.4: "449",
        0.99999: "1.00",
        9.996: "10.0",
        99.96: "100",
        1758.2: "1,758",
        123456.0: "1.23e+05",
        -2.5: "-2.50",
    }
    assert {value: num(value) for value in cases} == cases
    assert num(1.0, "x") == "1.00x" and num(None, "x") == "-" and num(55.4, " us") == "55.4 us"


def test_plot_without_matplotlib_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    results = BenchResults(config=BenchConfig(), models=[], server="test")
    with pytest.raises(ModuleNotFoundError, match="pip install"):
        write_plot(results, tmp_path / "x.png")
