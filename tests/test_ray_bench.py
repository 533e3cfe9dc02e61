"""``bench --ray`` and ``status --ray`` against the session's real Triton and a real local Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from _helpers import registered_on

from ray_triton_shm._bench._config import DEFAULT_PATHS, RAY_PATHS, BenchConfig
from ray_triton_shm._bench._ray_paths import DATA_CASE
from ray_triton_shm._bench._runner import run_bench
from ray_triton_shm._shm import ALIVE, owner_state
from ray_triton_shm.local._server import LocalTritonServer

REPO_ROOT = Path(__file__).resolve().parent.parent
SHM_DIR = Path("/dev/shm")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.pop("RAY_ADDRESS", None)
    return env


def _our_regions() -> set[str]:
    return {p.name for p in SHM_DIR.iterdir() if p.name.startswith("rtshm_")}


def test_bench_ray_quick_json_has_every_ray_path_verified(
    triton: LocalTritonServer, tmp_path: Path
) -> None:
    json_path = tmp_path / "bench.json"
    registered_before = registered_on(triton.grpc_url)
    regions_before = _our_regions()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_triton_shm",
            "bench",
            "--ray",
            "--quick",
            "--url",
            triton.grpc_url,
            "--no-progress",
            "--no-plot",
            "--json",
            str(json_path),
            "--models",
            "identity",
            DATA_CASE,
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"

    data = json.loads(json_path.read_text())
    assert data["config"]["ray_callers"] == 4
    assert data["failures"] == []
    assert set(data["models"]) == {"identity", DATA_CASE}
    for model, entry in data["models"].items():
        expected = [p for p in DEFAULT_PATHS if p != "http"] + list(RAY_PATHS)
        assert [p for p in entry["paths"] if p != "http"] == expected, model
        for path in RAY_PATHS:
            result = entry["paths"][path]
            where = f"{model}/{path}"
            if path.startswith("data-") and model != DATA_CASE:
                assert result["skipped"] and not result["ok"], where
                continue
            assert result["ok"] and result["verified"], (where, result)
            assert result["error"] is None and result["skipped"] is None, where
            for key in ("mb_per_s", "requests_per_s", "cpu_s_per_gb"):
                assert result[key] is not None and result[key] > 0, (where, key)
            uses_actor = path in ("serve-shm", "data-shm")
            assert (result["node_actor_cpu_us_per_request"] is not None) == uses_actor, where
        ratios = entry["ratios"]
        for key in ("serve_shm_vs_serve_grpc_mb_per_s", "serve_shm_vs_serve_inproc_mb_per_s"):
            assert ratios[key] is not None and ratios[key] > 0, (model, key)
    data_ratios = data["models"][DATA_CASE]["ratios"]
    for key in ("data_shm_vs_data_grpc_mb_per_s", "data_shm_vs_data_noop_mb_per_s"):
        assert data_ratios[key] is not None and data_ratios[key] > 0, key
    ray_goals = [g for g in data["goals"] if g["kind"] in ("mbps_vs", "actor_cpu_us")]
    assert {(g["model"], g["description"]) for g in ray_goals} == {
        ("identity", "serve-shm MB/s >= 1x serve-grpc"),
        ("identity", "serve-shm MB/s >= 0.95x serve-inproc"),
        (DATA_CASE, "serve-shm MB/s >= 2.3x serve-grpc"),
        (DATA_CASE, "serve-shm MB/s >= 0.95x serve-inproc"),
        (DATA_CASE, "data-shm MB/s >= 0.95x data-noop"),
        (DATA_CASE, "data-shm MB/s >= 1x data-grpc"),
        (DATA_CASE, "serve-shm: node actor CPU <= 58.5 us/request"),
        (DATA_CASE, "data-shm: node actor CPU <= 58.5 us/request"),
    }
    assert all(isinstance(g["met"], bool) for g in ray_goals)

    assert "serve-shm / serve-grpc" in proc.stdout and "Ray paths" in proc.stdout
    # Ray, Serve, the callers and the node actor are gone, and so are their regions.
    assert registered_on(triton.grpc_url) - registered_before == set()
    # (Other processes on this machine may create regions meanwhile: only live owners.)
    left = [name for name in _our_regions() - regions_before if owner_state(name) != ALIVE]
    assert left == []


def test_bench_without_ray_has_no_ray_paths_or_goals(triton: LocalTritonServer) -> None:
    results = run_bench(
        BenchConfig(
            models=("identity",),
            paths=("grpc", "shm-client"),
            rounds=1,
            slice_s=0.05,
            warmup_requests=1,
            url=triton.grpc_url,
        )
    )
    entry = results.to_dict()["models"]["identity"]
    assert set(entry["paths"]) == {"grpc", "shm-client"}
    assert not any(key.startswith(("serve", "data")) for key in entry["ratios"])
    assert all(g["kind"] != "mbps_vs" for g in results.to_dict()["goals"])


def test_status_ray_lists_node_actors_with_stats(triton: LocalTritonServer, ray_local: str) -> None:
    import ray

    from ray_triton_shm.ray import ShmModel, get_node_actor

    actor = get_node_actor(url=triton.grpc_url)
    try:
        model = ShmModel("identity", max_shapes={"INPUT0": (16,), "OUTPUT0": (16,)})
        x = np.arange(32, dtype=np.float32).reshape(2, 16)
        np.testing.assert_array_equal(model.infer({"INPUT0": x})["OUTPUT0"], x)
        stats = ray.get(actor.stats.remote())
        address = ray.get_runtime_context().gcs_address
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "ray_triton_shm",
                "status",
                "--address",
                address,
                "--url",
                triton.grpc_url,
            ],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
        assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        out = proc.stdout
        assert "Ray node actors (namespace ray_triton_shm): 1" in out
        assert f"node {stats.node_id}" in out
        assert f"url {triton.grpc_url}" in out and f"pid {stats.pid}" in out
        header = next(line for line in out.splitlines() if line.strip().startswith("model"))
        assert header.split() == [
            "model",
            "slots",
            "in_use",
            "waiting",
            "quarantined",
            "overloads",
            "wait_p99_us",
            "shm_bytes",
            "requests",
            "samples",
            "bytes_in",
            "bytes_out",
            "errors",
        ]
        row = next(line for line in out.splitlines() if line.strip().startswith("identity"))
        shm_bytes = stats.models["identity"]["shm_bytes"]
        # The node's whole footprint in /dev/shm, beside what is free there.
        assert stats.shm_bytes == shm_bytes and 0 < stats.shm_free <= stats.shm_capacity
        assert "held in /dev/shm by the node's regions" in out
        expected = (8, 0, 0, 0, 0, 0, shm_bytes, 1, 2, x.nbytes, x.nbytes, 0)
        assert row.split()[1:] == [str(v) for v in expected]
        # The regions report still follows, with the actor's regions registered.
        assert f"rtshm_{stats.pid}-" in out
        model.close()
    finally:
        ray.get(actor.shutdown.remote())
        ray.kill(actor)
