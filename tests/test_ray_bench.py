"""``bench --ray`` and ``status --ray`` against the session's real Triton and a real local Ray."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import our_regions, registered_on
from rich.console import Console

from ray_triton_shm._bench._config import (
    CEILING_PATHS,
    CHURN,
    CHURN_CASE,
    DATA_CASE,
    DEFAULT_PATHS,
    ELASTIC,
    MANY_CALLERS,
    MANY_CALLERS_BY_VALUE,
    RAY_PATHS,
    SERVE_HTTP_CLIENTS,
    SERVE_HTTP_PATHS,
    SWEEP_PATHS,
    BenchConfig,
    add_arguments,
    config_from_args,
)
from ray_triton_shm._bench._runner import run_bench
from ray_triton_shm._bench.report._console import _PLAIN_WIDTH, print_results
from ray_triton_shm._bench.report._json import bench_json
from ray_triton_shm._slots._shm import ALIVE, owner_state
from ray_triton_shm.local._server import LocalTritonServer

REPO_ROOT = Path(__file__).resolve().parent.parent
SHM_DIR = Path("/dev/shm")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.pop("RAY_ADDRESS", None)
    return env


def _bench_json(
    triton: LocalTritonServer, json_path: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Runs ``bench --quick`` on the test's Triton; returns the process and its JSON."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "ray_triton_shm", "bench", "--quick", *args),
            *("--url", triton.grpc_url, "--no-plot", "--no-report", "--json", str(json_path)),
            "--full",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc, json.loads(json_path.read_text())


def _bench_here(*args: str) -> tuple[dict[str, Any], str]:
    """Runs ``bench --quick --models classifier --rounds 1 ARGS`` in this process, on the
    shared Ray (its Ray start is the CLI's, already paid); returns its JSON and its printed
    results (``--full``)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    quick = ("--quick", "--models", DATA_CASE, "--rounds", "1")  # every path once: each runs right
    config = config_from_args(parser.parse_args([*quick, *args]))
    results = run_bench(config)
    console = Console(file=io.StringIO(), width=_PLAIN_WIDTH, highlight=False)
    print_results(results, console, full=True)
    data = json.loads(json.dumps(bench_json(results)))  # as the CLI writes it
    assert results.stopped is None and data["failures"] == [], console.file.getvalue()
    return data, console.file.getvalue()


def _runs(data: dict[str, Any]) -> dict[tuple[str, str, int, Any], dict[str, Any]]:
    return {(r["model"], r["path"], r["concurrency"], r["slots"]): r for r in data["runs"]}


def _ray_goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    core = ("shm-client", "shm-lease")  # the core client's goals: tests/test_bench.py
    return [g for g in data["goals"] if not g["description"].startswith(core)]


def _nothing_left(url: str, registered_before: set[str], regions_before: set[str]) -> None:
    """The callers, the node actor and Serve's replicas are gone, and so are their regions."""
    assert registered_on(url) - registered_before == set()
    # (Other processes on this machine may create regions meanwhile: only live owners.)
    left = [name for name in our_regions() - regions_before if owner_state(name) != ALIVE]
    assert left == []


@pytest.mark.soak
def test_bench_ray_cli_runs_serve_and_ray_data_verified_quietly_on_a_private_ray(
    triton: LocalTritonServer, tmp_path: Path
) -> None:
    """The CLI starts a Ray of its own for Serve and Ray Data (the loudest), keeps their logs
    out of its output, and leaves nothing behind."""
    json_path = tmp_path / "bench.json"
    registered_before = registered_on(triton.grpc_url)
    regions_before = our_regions()
    choices = ["serve-grpc", "serve-shm", "serve-inproc", "data-grpc", "data-shm", "data-noop"]
    proc, data = _bench_json(
        triton,
        json_path,
        *("--models", DATA_CASE, "--rounds", "1", "--paths", *choices),
        *("--ray-callers", "2"),  # each caller a process, each Ray Data actor too: 2 cores
    )
    config = data["config"]
    assert (config["ray_callers"], config["data_job_batches"]) == (2, 16)
    assert data["failures"] == []
    runs = _runs(data)
    assert set(runs) == {(DATA_CASE, path, 2, None) for path in choices}
    for path in ("serve-shm", "data-shm"):
        run = runs[(DATA_CASE, path, 2, None)]
        assert run["node_actor_cpu_us"] is not None, path
        # Its node actor's idle CPU, and its CPU per extra request from there to the load.
        assert run["node_actor_idle_ms_per_s"] > 0, path
        assert run["node_actor_us_per_extra_request"] is not None, path
    assert all(runs[(DATA_CASE, path, 2, None)]["requests"] > 0 for path in choices)
    assert {g["description"] for g in _ray_goals(data)} == {
        "serve-shm MB/s >= 2.3x serve-grpc",
        "serve-shm MB/s >= 0.95x serve-inproc",
        "data-shm MB/s >= 0.95x data-noop",
        "data-shm MB/s >= 1x data-grpc",
        "serve-shm: node actor CPU us per extra request <= 58.5",
        "serve-shm: node actor idle CPU ms/s <= 20",
        "data-shm: node actor CPU us per extra request <= 58.5",
        "data-shm: node actor idle CPU ms/s <= 20",
    }
    assert all(isinstance(g["met"], bool) for g in data["goals"])
    assert "serve-shm (2 callers)" in proc.stdout
    assert "Ray Data: a job of 16 batches in each of 1)" in proc.stdout
    # Quiet: Ray's and Ray Data's logs stay out; a log gets a plain line per stage.
    assert "INFO" not in proc.stdout + proc.stderr and "(raylet)" not in proc.stdout + proc.stderr
    assert "deprecated" not in proc.stdout + proc.stderr
    assert "bench 00:" in proc.stderr and f"{DATA_CASE}: serve-grpc (2 callers)" in proc.stderr
    # Ray, Serve, the callers and the node actor are gone, and so are their regions.
    _nothing_left(triton.grpc_url, registered_before, regions_before)


@pytest.mark.soak
def test_bench_ray_sweep_node_under_load_and_open_loop(
    triton: LocalTritonServer, ray_local: str
) -> None:
    """ShmModel and gRPC in caller processes at every level of the sweep and on the node
    under load (the elastic pool beside fixed ones), and in the open loop: the advice from
    them."""
    registered_before = registered_on(triton.grpc_url)
    regions_before = our_regions()
    # perf_analyzer's runs are tests/test_perf_analyzer.py's (and the quick JSON's): seconds.
    paths = [p for p in DEFAULT_PATHS if p not in CEILING_PATHS]
    data, out = _bench_here(
        *("--url", triton.grpc_url, "--concurrency", "1", "4"),
        *("--paths", *paths, "shm-model", "grpc-procs"),
        *("--request-rate", "100", "--rate-models", DATA_CASE),
    )
    runs = _runs(data)
    model = DATA_CASE
    expected = {(p, level) for p in SWEEP_PATHS if p not in CEILING_PATHS for level in (1, 4)}
    expected |= {(p, 1) for p in paths if p != "http"}
    node_load = {"shm-model", "grpc-procs"}
    swept = {(path, level) for _, path, level, _ in runs if not (path in node_load and level == 16)}
    assert swept == expected
    # The node under load: 16 callers on the elastic pool beside 16 gRPC callers, and on
    # fixed pools of 4 and of 16 slots.
    assert {k[1:] for k in runs if k[1] in node_load and k[2] == 16} == {
        ("shm-model", 16, ELASTIC),
        ("grpc-procs", 16, None),
        ("shm-model", 16, 4),
        ("shm-model", 16, 16),
    }
    for level in (1, 4):
        shm_model = runs[(model, "shm-model", level, level)]
        assert shm_model["shm_bytes"] > 0 and shm_model["node_actor_cpu_us"] is not None
        assert runs[(model, "shm-client", level, level)]["shm_bytes"] > 0
        assert "pool_sizes" not in shm_model  # a fixed pool
    overloaded = runs[(model, "shm-model", 16, 4)]
    # 16 callers on 4 slots wait for one; each of them completed requests.
    assert overloaded["wait_p99_ms"] > 0 and 0 < overloaded["fairness"] <= 1
    assert runs[(model, "grpc-procs", 16, None)]["fairness"] > 0
    # The elastic pool's size over time: from its 2 slots, grown under 16 callers' load
    # (every read a size within its bounds), what it reached and settled on.
    elastic = runs[(model, "shm-model", 16, ELASTIC)]
    sizes = elastic["pool_sizes"]
    assert (elastic["min_slots"], elastic["max_slots"]) == (2, 64) and sizes[0][0] < 1
    assert len(sizes) >= 3 and all(2 <= size <= 64 for _, size in sizes), sizes
    assert [t for t, _ in sizes] == sorted(t for t, _ in sizes)
    # Past the 16 callers only by slots still being given back while a caller waited
    # (they count as held): a few at most.
    assert 2 < elastic["pool_size_max"] <= 16 + 4 and elastic["pool_grows"] >= 1, sizes
    assert [elastic["pool_size_max_s"], elastic["pool_size_max"]] in sizes
    assert elastic["pool_size_settled"] == sizes[-1][1]
    # Nothing held it back (waits shorter than upscale_delay_s may be said).
    assert elastic["limited_by"] in ("", "upscale_delay_s"), elastic["limited_by"]
    assert elastic["shm_bytes"] > 0 and elastic["warmup_requests_per_s"] > 0
    # The answers: pool_size_for_throughput at the sweep's levels; under load the
    # elastic_pool, the size it settled on beside the best fixed pool measured there.
    rec = data["recommendations"][model]
    assert rec["pool_size_for_throughput"]["pool_size"] in (1, 4)
    (advice,) = rec["elastic_pool"]
    assert advice["callers"] == 16 and advice["settled_slots"] == sizes[-1][1]
    assert [f["slots"] for f in advice["fixed"]] == [4, 16]
    best = max(advice["fixed"], key=lambda f: f["requests_per_s"])
    assert advice["best_fixed"] == best["slots"]
    assert advice["vs_best_fixed"] == elastic["requests_per_s"] / best["requests_per_s"]
    assert (
        f"{model}, elastic_pool under 16 callers: settled at {advice['settled_slots']} slots (2 -> "
    ) in out
    assert f"the best fixed pool ({best['slots']} slots, " in out and "Recommendation" in out
    # Ray tasks get a verdict at every caller count: the sweep's and the node's load.
    ray_tasks = [v["callers"] for v in data["verdicts"][model] if v["choice"] == "Ray tasks"]
    assert ray_tasks == [1, 4, 16], ray_tasks
    assert data["models"][DATA_CASE]["skipped"] == {
        "http@1": "no HTTP endpoint given: pass Triton's as --http-url HOST:PORT"
    }
    assert {g["description"] for g in _ray_goals(data)} == {
        f"shm-model (16 callers, elastic pool){goal}"
        for goal in (
            " MB/s >= 1.25x shm-model (16 callers, 4 slots)",
            " MB/s >= 0.95x shm-model (16 callers, 16 slots)",
            " MB/s >= 4.5x grpc-procs (16 callers)",
            ": fewest requests of a caller / mean >= 0.5",
        )
    }
    assert all(isinstance(g["met"], bool) for g in data["goals"])
    # The open loop at 100 requests/s: ShmModel in 4 caller processes on 1 and on 4 slots too.
    rates = {(r["path"], r["slots"]): r for r in data["rate_runs"]}
    assert set(rates) == {
        ("grpc", None), ("shm-client", 1), ("shm-client", 4), ("shm-model", 1), ("shm-model", 4)
    }  # fmt: skip
    assert all(r["model"] == DATA_CASE and r["requests"] > 0 for r in rates.values())
    assert data["rate_limits"][DATA_CASE]["shm-model (4 slots)"] in (None, 100)
    _nothing_left(triton.grpc_url, registered_before, regions_before)


@pytest.mark.soak
def test_bench_ray_serve_over_http_and_churn(
    triton: LocalTritonServer,
    ray_local: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The example app behind Serve's HTTP proxy at low load and under it, and the churn:
    every answer checked."""
    registered_before = registered_on(triton.grpc_url)
    regions_before = our_regions()
    churn = [path for path, _, _ in CHURN]
    data, out = _bench_here(
        *("--url", triton.grpc_url, "--paths", *SERVE_HTTP_PATHS, *churn),
        *("--churn-s", "3"),  # one round of 3 s: one caller killed, at 2 s
    )
    runs = _runs(data)
    assert set(runs) == {
        *((DATA_CASE, p, n, None) for p in SERVE_HTTP_PATHS for n in SERVE_HTTP_CLIENTS),
        *((CHURN_CASE, path, callers, slots) for path, callers, slots in CHURN),
    }
    for clients in SERVE_HTTP_CLIENTS:
        for path in SERVE_HTTP_PATHS:
            run = runs[(DATA_CASE, path, clients, None)]
            assert run["wrong_answers"] == 0 and run["answers_checked"] >= run["requests"], run
            stages = run["replica_ms"]
            assert 0 < stages["parse"] < stages["request"] and stages["model"] > 0, run
            assert 1 <= run["images_per_batch"] <= 8, run
    ray_goals = _ray_goals(data)
    assert {(g["model"], g["description"]) for g in ray_goals} == {
        *((CHURN_CASE, goal) for goal in _CHURN_GOALS),
        (DATA_CASE, "serve-http-shm (16 callers) MB/s >= 1.2x serve-http-grpc (16 callers)"),
        (DATA_CASE, "serve-http-shm (16 callers) MB/s >= 0.9x serve-http-noop (16 callers)"),
        *(
            (DATA_CASE, f"{path} ({clients} caller{'s' * (clients > 1)}): wrong answers <= 0")
            for path in SERVE_HTTP_PATHS
            for clients in SERVE_HTTP_CLIENTS
        ),
    }
    assert all(isinstance(g["met"], bool) for g in ray_goals)
    assert f"{DATA_CASE}, 16 clients: shm " in out and "Serve over HTTP" in out
    errors = capfd.readouterr().err + caplog.text  # Ray's driver logs what it does not raise
    _check_churn(runs, {g["description"]: g for g in ray_goals}, out, errors)
    _nothing_left(triton.grpc_url, registered_before, regions_before)


_CHURN_GOALS = (
    "shm-model-churn (8 callers, 4 slots) req/s >= 0.8x shm-model-nokill (8 callers, 4 slots)",
    "shm-model-nokill (8 callers, 4 slots): wrong answers <= 0",
    "shm-model-churn (8 callers, 4 slots): wrong answers <= 0",
)


def _check_churn(
    runs: dict[tuple[str, str, int, Any], dict[str, Any]],
    goals: dict[str, dict[str, Any]],
    out: str,
    err: str,
) -> None:
    """The churn runs: 8 callers on 4 node slots, one SIGKILLed mid-request every 2 s, every
    answer right; a killed caller's lost requests are no errors."""
    steady = runs[(CHURN_CASE, "shm-model-nokill", 8, 4)]
    churn = runs[(CHURN_CASE, "shm-model-churn", 8, 4)]
    assert (steady["kills"], churn["kills"]) == (0, 1)
    for run in (steady, churn):
        assert run["requests"] > 0 and run["wrong_answers"] == 0
    assert goals[_CHURN_GOALS[0]]["value"] == churn["requests_per_s"] / steady["requests_per_s"]
    assert goals[_CHURN_GOALS[1]]["met"] is goals[_CHURN_GOALS[2]]["met"] is True
    assert "Churn (8 caller processes on 4 node slots, 3.00 s each" in out
    assert "1 caller(s) killed" in out and ", 0 wrong" in out
    assert "Unhandled error" not in err


#: The many-callers case's paths, each run briefly (tests/test_ray_bench.py): its table at
#: 2 callers.
_MANY = (
    (("shm-model-nb", 2, 2), ("serve-shm-nb", 2, None), ("grpc-procs", 2, None),
     ("grpc-procs-dynamic", 2, None)),
    (("shm-model", 2, 2), ("serve-shm", 2, None), ("shm-model-dynamic", 2, 2)),
)  # fmt: skip
_MANY_BY_VALUE = (
    (("shm-model-nb-byvalue", 2, 2), ("grpc-procs-byvalue", 2, None)),
    (("shm-model-byvalue", 2, 2),),
)


def test_bench_many_callers_runs_each_choice_every_answer_checked(
    triton: LocalTritonServer,
    triton_elsewhere: LocalTritonServer,
    ray_local: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node batching's case, each of its choices run briefly (its table at 2 callers, a
    round): each caller on inputs of its own, every answer checked; Triton's counts of rows
    per request; the twin with Triton's dynamic batcher; by value on a Triton elsewhere;
    nothing left behind."""
    from ray_triton_shm._bench import _runner

    monkeypatch.setattr(_runner, "MANY_CALLERS", _MANY)
    monkeypatch.setattr(_runner, "MANY_CALLERS_BY_VALUE", _MANY_BY_VALUE)
    far = triton_elsewhere.grpc_url
    registered_before = registered_on(triton.grpc_url), registered_on(far)
    regions_before = our_regions()
    keys = [key for group in (*_MANY, *_MANY_BY_VALUE) for key in group]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = ("--quick", "--rounds", "1", "--url", triton.grpc_url, "--by-value-url", far)
    args += ("--models", "identity-1", "--many-callers", "2", "--paths", *(k[0] for k in keys))
    results = run_bench(config_from_args(parser.parse_args(args)))
    data = json.loads(json.dumps(bench_json(results)))
    assert results.stopped is None and data["failures"] == [], data["failures"]
    runs = _runs(data)
    assert set(runs) == {("identity-1", *key) for key in keys}
    for key, run in runs.items():
        assert run["many_callers"] and run["requests"] > 0, key
        # Every answer checked against its caller's own inputs' (warm-ups included).
        assert run["answers_checked"] >= run["requests"], key
        assert run["rows_per_request"] >= 1.0, key
    transports = {key[1]: run.get("transport") for key, run in runs.items()}
    assert {p: transports[p] for p in ("shm-model-nb", "serve-shm-nb", "shm-model-dynamic")} == {
        "shm-model-nb": "shm",
        "serve-shm-nb": "shm",
        "shm-model-dynamic": "shm",
    }
    assert transports["shm-model-nb-byvalue"] == transports["shm-model-byvalue"] == "inline"
    dynamic = runs[("identity-1", "grpc-procs-dynamic", 2, None)]
    assert dynamic["rows_per_execution"] >= dynamic["rows_per_request"] == 1.0
    table = {(c["path"], c["callers"]) for c in data["many_callers"]["identity-1"]}
    assert table == {(key[0], 2) for key in keys}
    assert (registered_on(triton.grpc_url), registered_on(far)) == registered_before
    assert [n for n in our_regions() - regions_before if owner_state(n) != ALIVE] == []


@pytest.mark.soak
def test_bench_many_callers_through_the_cli_at_16_callers(
    triton: LocalTritonServer, triton_elsewhere: LocalTritonServer, tmp_path: Path
) -> None:
    """The many-callers case as make bench runs it (its table, at 1 and 16 callers; by value
    on a Triton elsewhere), through the CLI on a private Ray: its runs, its goals measured,
    node batching's requests of several rows, its table in the summary; nothing left."""
    far = triton_elsewhere.grpc_url
    registered_before = registered_on(triton.grpc_url), registered_on(far)
    regions_before = our_regions()
    proc, data = _bench_json(
        triton,
        tmp_path / "bench.json",
        *("--ray", "--models", "identity-1", "--many-callers", "1", "16", "--rounds", "1"),
        *("--by-value-url", far),
    )
    keys = [key for group in (*MANY_CALLERS, *MANY_CALLERS_BY_VALUE) for key in group]
    expected = {("identity-1", *key) for key in keys if key[1] in (1, 16)}
    runs = _runs(data)
    assert set(runs) == expected and data["failures"] == []
    assert all(run["answers_checked"] >= run["requests"] > 0 for run in runs.values()
               if not run["path"].startswith("pa-"))  # fmt: skip
    assert runs[("identity-1", "shm-model-nb", 16, 16)]["rows_per_request"] > 1.0
    goals = {g["description"]: g for g in data["goals"] if g["model"] == "identity-1"}
    measured = [g for g in goals.values() if "(64 callers)" not in g["description"]]
    assert len(measured) == 8 and all(isinstance(g["met"], bool) for g in measured), goals
    assert "Many callers at 1 row each (node batching)" in proc.stdout
    assert "identity-1, Ray tasks, node batching vs plain gRPC: " in proc.stdout
    assert (registered_on(triton.grpc_url), registered_on(far)) == registered_before
    assert [n for n in our_regions() - regions_before if owner_state(n) != ALIVE] == []


def test_bench_without_ray_has_no_ray_paths_or_goals(triton: LocalTritonServer) -> None:
    results = run_bench(
        BenchConfig(
            models=("identity",),
            paths=("grpc", "shm-client"),
            concurrency=(1, 2),
            rounds=1,
            slice_s=0.05,
            warmup_requests=1,
            url=triton.grpc_url,
        )
    )
    data = bench_json(results)
    assert {(r["path"], r["concurrency"]) for r in data["runs"]} == {
        ("grpc", 1),
        ("shm-client", 1),
        ("grpc", 2),
        ("shm-client", 2),
    }
    assert [g["description"] for g in data["goals"]] == [
        "shm-client (1 caller) MB/s >= 1x grpc (1 caller)"
    ]


@pytest.mark.soak  # minutes of make test: CI's soak tier runs it
def test_bench_on_a_triton_that_cannot_map_its_shared_memory_runs_by_value_and_says_so(
    triton_elsewhere: LocalTritonServer, tmp_path: Path
) -> None:
    """Every library path (the core client, ShmModel in Ray tasks) runs by value there, and
    the report says so and why; the shm-only paths are skipped saying why; plain gRPC and
    perf_analyzer's by value run as the baselines, and each library path's goal is its gRPC
    twin's MB/s (0.95x)."""
    url = triton_elsewhere.grpc_url
    regions_before = our_regions()
    paths = ("grpc", "shm-manual", "shm-client", "shm-lease", "pa-shm", "pa-grpc")
    proc, data = _bench_json(
        triton_elsewhere,
        tmp_path / "bench.json",
        *("--ray", "--models", "identity", "--paths", *paths, "shm-model", "grpc-procs"),
        *("--concurrency", "1", "--rounds", "1", "--ray-callers", "1", "--no-node-load"),
    )
    model = data["models"]["identity"]
    assert model["transport"] == "inline", model
    assert f"Triton at {url} could not open /dev/shm/" in model["transport_reason"]
    assert data["failures"] == []
    transports = {r["path"]: r.get("transport") for r in data["runs"]}
    assert {p: transports.get(p) for p in ("grpc", "shm-client", "shm-model", "grpc-procs")} == {
        "grpc": None,
        "shm-client": "inline",
        "shm-model": "inline",
        "grpc-procs": None,
    }
    skipped = model["skipped"]
    for path in ("shm-manual", "shm-lease", "pa-shm"):
        assert f"cannot run by value: Triton at {url} cannot map" in skipped[f"{path}@1"], path
    assert "by value" not in skipped.get("pa-grpc@1", "")  # perf_analyzer's gRPC runs there
    goals = {g["description"] for g in data["goals"]}
    assert {
        "shm-client (1 caller) MB/s >= 0.95x grpc (1 caller)",
        "shm-model (1 caller, 1 slot) MB/s >= 0.95x grpc-procs (1 caller)",
    } <= goals
    assert not [g for g in goals if "perf_analyzer" in g or ">= 1x" in g]  # shared memory's
    out = proc.stdout
    assert f"\nby value: shm-client, shm-model on identity: Triton at {url} could not open " in out
    assert "\nby value, the goal: each library path >= 0.95x plain gRPC's MB/s" in out
    assert re.search(r"\nshm-model \(1 caller, 1 slot\) .* by value +ok\n", out), out
    # Nothing registered there, and nothing of the bench's left in this /dev/shm.
    assert registered_on(url) == set()
    assert [n for n in our_regions() - regions_before if owner_state(n) != ALIVE] == []


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
            "transport",
            "slots",
            "max_slots",
            "limited_by",
            "in_use",
            "waiting",
            "abandoned",
            "overloads",
            "wait_p99_us",
            "settle_p99_us",
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
        # Registered without pool_size: a pool that follows its load, at its 2 slots (of 64).
        expected = ("shm", 2, 64, "-", 0, 0, 0, 0, None, 0, shm_bytes, 1, 2, x.nbytes, x.nbytes, 0)
        values = row.split()[1:]
        # Every request's wait for its slot counts, if only the microseconds of taking it.
        assert 0 <= int(values[8]) < 100_000
        # Under the table, why the model goes through shared memory.
        assert "    identity: shm (through shared memory), because Triton at " in out
        assert [v for v, e in zip(values, expected, strict=True) if e is not None] == [
            str(e) for e in expected if e is not None
        ]
        # The regions report still follows, with the actor's regions registered.
        assert f"rtshm_{stats.pid}-" in out
        model.close()
    finally:
        ray.get(actor.shutdown.remote())
        ray.kill(actor)


def test_a_caller_s_error_reaches_the_driver_as_itself(ray_local: str) -> None:
    """tritonclient's errors carry gRPC's, which Ray cannot send to the driver (it says
    "Failed to deserialize exception"): a bench caller's reach it as a CallerError naming
    them."""
    import ray

    from ray_triton_shm._bench.paths._ray_callers import (
        Caller,
        CallerError,
        ChurnCaller,
        errors_reach_the_driver,
    )
    from ray_triton_shm._wire._plain_client import tritonclient_for

    @ray.remote(num_cpus=0)
    class Unreachable:
        def call(self) -> None:
            tritonclient_for("127.0.0.1:1").is_server_live(client_timeout=5.0)

        @errors_reach_the_driver
        def carried(self) -> None:
            self.call()

    actor = Unreachable.remote()  # type: ignore[attr-defined]
    with pytest.raises(ray.exceptions.RayError) as raw:
        ray.get(actor.call.remote())
    assert "InferenceServerException" in str(raw.value)
    assert not isinstance(raw.value, CallerError)  # what Ray makes of it without the wrapper
    with pytest.raises(CallerError) as carried:
        ray.get(actor.carried.remote())
    assert "tritonclient.utils.InferenceServerException: [StatusCode.UNAVAILABLE]" in str(
        carried.value
    )
    for method in (Caller.add, Caller.once, Caller.loop, ChurnCaller.start):
        assert method.__wrapped__  # type: ignore[attr-defined]
    ray.kill(actor)


def test_the_paths_made_for_one_model_skip_the_others(triton: LocalTritonServer) -> None:
    """The Ray Data job, the churn runs and the example HTTP app are made for the example
    classifier: on another model each says so at once (before any Ray is needed)."""
    from ray_triton_shm._bench._config import BenchConfig
    from ray_triton_shm._bench._runner import PATHS, _prepare
    from ray_triton_shm._bench.paths._base import BenchTarget, SkipPath

    target = BenchTarget(triton.grpc_url)
    case, inputs, reference = _prepare(BenchConfig().case("identity"), target)
    expected = {
        **{
            path: f"the bench's Ray Data job is made for the example {DATA_CASE!r} model only; "
            "for yours, time your own job with ShmPredictor against a plain gRPC one"
            for path in RAY_PATHS
            if path.startswith("data")
        },
        **{
            path: f"the churn runs on the example {CHURN_CASE!r} model only"
            for path in ("shm-model-nokill", "shm-model-churn")
        },
        **{
            path: "the example HTTP app is made for the example classifier-1 and classifier "
            "cases only; for your model, time your own Serve app on ShmModel against plain gRPC"
            for path in SERVE_HTTP_PATHS
        },
    }
    for name, reason in expected.items():
        path = PATHS[name](
            concurrency=4, slots=4, session=None, target=target, case=case, inputs=inputs,
            reference=reference,
        )  # fmt: skip
        with pytest.raises(SkipPath) as skipped:
            path.setup()
        assert str(skipped.value) == reason, name
