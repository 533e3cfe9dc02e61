"""Triton's perf_analyzer, the bench's ceiling: found and run for real against the session's
Triton, measured as a bench path beside the others (the regions beside it kept), skipped
where it cannot run, saying why; and every choice's ratio to it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from rich.console import Console

from ray_triton_shm import TritonSHMClient
from ray_triton_shm._bench import _runner
from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._config import BenchConfig
from ray_triton_shm._bench._load import SliceSummary
from ray_triton_shm._bench._results import CEILING, BenchResults, Goal, ModelResult, RunResult
from ray_triton_shm._bench._summary import verdict_lines, verdicts
from ray_triton_shm._bench.paths._base import BenchTarget, SkipPath
from ray_triton_shm._bench.paths._perf_analyzer import PATHS, UNCHECKED, perf_analyzer_args
from ray_triton_shm._bench.report._console import print_results
from ray_triton_shm._bench.report._json import bench_json
from ray_triton_shm._exceptions import LocalServerError
from ray_triton_shm._slots._specs import TensorSpec
from ray_triton_shm.local._perf_analyzer import find_perf_analyzer
from ray_triton_shm.local._server import LocalTritonServer


def _system_regions(url: str) -> set[str]:
    with grpcclient.InferenceServerClient(url) as client:
        return set(client.get_system_shared_memory_status(as_json=True).get("regions", {}))


def test_the_launcher_finds_and_runs_perf_analyzer(
    triton: LocalTritonServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the server environment (setup-server's tritonclient wheel), its libraries
    linked under their plain names: a second on identity."""
    monkeypatch.delenv("PERF_ANALYZER", raising=False)
    analyzer = find_perf_analyzer()
    assert analyzer.version.startswith("Perf Analyzer Version 2.51"), analyzer
    report = tmp_path / "identity.csv"
    args = ["-m", "identity", "-u", triton.grpc_url, "-i", "grpc", "--shared-memory", "none"]
    args += ["-b", "8", "--shape", "INPUT0:16", "--concurrency-range", "1:1", "-p", "300"]
    args += ["--max-trials", "3", "--stability-percentage", "100000", "-f", str(report)]
    done = analyzer.run(args, timeout_s=60)
    assert done.returncode == 0, done.stdout
    (row,) = csv.DictReader(report.open())
    assert float(row["Inferences/Second"]) > 100, row
    assert 0 < float(row["p50 latency"]) <= float(row["p99 latency"]), row


def test_without_perf_analyzer_the_error_says_why_and_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = find_perf_analyzer()
    monkeypatch.setenv("PERF_ANALYZER", str(tmp_path / "nowhere"))
    with pytest.raises(LocalServerError, match=r"nowhere is not an executable.*setup-server"):
        find_perf_analyzer()
    monkeypatch.delenv("PERF_ANALYZER")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("RAY_TRITON_SHM_SERVER_ENV", str(tmp_path / "empty-env"))
    with pytest.raises(LocalServerError, match=r"no perf_analyzer found .*setup-server"):
        find_perf_analyzer()
    # The binary, away from the server environment's copies of its libraries.
    monkeypatch.setenv("PERF_ANALYZER", str(installed.executable))
    try:
        found = find_perf_analyzer()
    except LocalServerError as exc:
        assert "libb64.so.0d" in str(exc) and "nvidia-pytriton" in str(exc), exc
    else:  # this machine has them itself
        assert found.library_dirs == ()


def test_the_bench_paths_measure_slices_and_keep_the_regions_beside_them(
    triton: LocalTritonServer,
) -> None:
    """perf_analyzer with system shared memory unregisters every region on its Triton: the
    core client's, registered before, are registered again after each slice."""
    target = BenchTarget(triton.grpc_url)
    case, inputs, reference = _runner._prepare(BenchConfig().case("identity"), target)
    with TritonSHMClient(triton.grpc_url) as client:
        client.register_shm_model("identity", **case.registration(2))
        before = _system_regions(triton.grpc_url)
        assert before
        for cls in PATHS:
            path = cls(target=target, case=case, inputs=inputs, reference=reference, concurrency=2)
            path.setup()
            try:
                summary = path.measure_slice(0.3)
            finally:
                path.teardown()
            assert path.unchecked == UNCHECKED == "perf_analyzer never reads its outputs"
            assert summary.requests > 10 and 0.3 <= summary.wall_s < 1.0, (cls.name, summary)
            latency = summary.latency_ms
            assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"], (cls.name, latency)
            assert _system_regions(triton.grpc_url) == before, cls.name
        answer = client.infer_shm("identity", inputs)
    np.testing.assert_array_equal(answer["OUTPUT0"], reference["OUTPUT0"])


def test_the_bench_runs_perf_analyzer_beside_the_others_and_says_it_checked_nothing(
    triton: LocalTritonServer, tmp_path: Path
) -> None:
    config = BenchConfig(
        url=triton.grpc_url,
        models=("identity",),
        paths=("grpc", "shm-client", "pa-shm", "pa-grpc"),
        concurrency=(1,),
        rounds=2,
        slice_s=0.15,
        warmup_requests=1,
        model_update_s=0,
    )
    results = _runner.run_bench(config)
    assert results.failures == [] and results.stopped is None
    (model,) = results.models
    for name in ("pa-shm", "pa-grpc"):
        run = model.run(name, 1)
        assert run is not None and run.counts and run.unchecked == UNCHECKED, run
        numbers = run.numbers()
        assert numbers["requests_per_s"] > 0 and numbers["cpu_s_per_gb"] is None
        assert len(run.rounds) == 2
    ceiling = model.ceiling(1)
    assert ceiling is not None and ceiling.path in ("pa-shm", "pa-grpc")
    (cell,) = verdicts(results)["identity"]
    assert cell.ceiling is ceiling and cell.vs_ceiling == pytest.approx(
        cell.run.numbers()["mb_per_s"] / ceiling.numbers()["mb_per_s"]
    )
    assert f"perf_analyzer ({ceiling.path})" in verdict_lines(results)[0]
    out = io.StringIO()
    print_results(results, Console(file=out, width=1000), full=True)
    assert "pa-shm (1 caller)" in out.getvalue()
    assert "not checked: perf_analyzer never reads its outputs" in out.getvalue()
    data = json.loads(json.dumps(bench_json(results)))
    runs = {run["path"]: run for run in data["runs"]}
    assert runs["pa-grpc"]["unchecked"] == UNCHECKED and runs["grpc"]["unchecked"] is None
    assert runs["shm-client"]["vs_perf_analyzer"] == pytest.approx(cell.vs_ceiling)
    (verdict,) = data["verdicts"]["identity"]
    assert verdict["vs_perf_analyzer"] == pytest.approx(cell.vs_ceiling)
    assert verdict["perf_analyzer"] == f"{ceiling.path} (1 caller)"
    assert [c["path"] for c in data["perf_analyzer"]["identity"]] == [ceiling.path]
    goal = next(g for g in data["goals"] if "perf_analyzer (1 caller)" in g["description"])
    assert goal["value"] == pytest.approx(cell.vs_ceiling) and goal["target"] == 0.8


def test_where_perf_analyzer_cannot_run_the_bench_goes_on_saying_why(
    triton: LocalTritonServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERF_ANALYZER", str(tmp_path / "nowhere"))
    config = BenchConfig(
        url=triton.grpc_url,
        models=("identity",),
        paths=("grpc", "pa-shm", "pa-grpc"),
        concurrency=(1,),
        rounds=1,
        slice_s=0.1,
        warmup_requests=1,
        model_update_s=0,
    )
    results = _runner.run_bench(config)
    assert results.failures == []
    (model,) = results.models
    skipped = model.skipped()
    assert set(skipped) == {"pa-shm@1", "pa-grpc@1"}
    (why,) = set(skipped.values())
    assert "nowhere is not an executable" in why and "setup-server" in why and "\n" not in why
    grpc = model.run("grpc", 1)
    assert grpc is not None and grpc.counts
    assert model.ceiling(1) is None and verdicts(results) == {"identity": []}


def test_perf_analyzer_feeds_strings_of_one_length_only() -> None:
    text = TensorSpec("TEXT", (1,), np.dtype(object), max_element_bytes=64)
    name = TensorSpec("NAME", (1,), np.dtype(object), max_element_bytes=32)
    reply = TensorSpec("UPPER", (1,), np.dtype(object), max_element_bytes=64)
    case = ModelCase("upper", "upper", 8, True, (text,), (reply,))
    args = perf_analyzer_args(case, "h:1", shared_memory="system", concurrency=4)
    assert args[args.index("--string-length") + 1] == "64"
    # Room for a whole request's strings in its output regions: 8 x (4 + 64) bytes.
    assert args[args.index("--output-shared-memory-size") + 1] == str(8 * 68)
    assert "--output-shared-memory-size" not in perf_analyzer_args(
        case, "h:1", shared_memory="none", concurrency=4
    )
    two = ModelCase("two", "two", 8, True, (text, name), (reply,))
    with pytest.raises(SkipPath, match=r"one length.*\[32, 64\]"):
        perf_analyzer_args(two, "h:1", shared_memory="none", concurrency=1)


_CASE = ModelCase("m", "m", 1, True, (TensorSpec("x", (1,), np.dtype(np.float32)),), ())


def _closed(path: str, level: int, rate: float, slots: int | None = None) -> RunResult:
    run = RunResult(path, level, slots, _CASE, verified=True)
    run.add(1.0, 0.1, None, [[0.001] * int(rate / level)] * level)
    return run


def _timed(path: str, level: int, rates: tuple[float, ...], p99_ms: float = 3.0) -> RunResult:
    """A perf_analyzer run: a second per slice, at each of ``rates`` requests per second."""
    run = RunResult(path, level, None, _CASE, verified=True, unchecked=UNCHECKED)
    for rate in rates:
        latency = {"p50": 1.0, "p90": 2.0, "p99": p99_ms}
        run.add_summary(SliceSummary(int(rate), 1.0, latency))
    return run


def test_each_choice_is_measured_against_the_better_of_perf_analyzers_runs() -> None:
    runs = [
        _closed("grpc", 1, 100),
        _closed("shm-client", 1, 300, 1),
        _timed("pa-shm", 1, (380, 420), p99_ms=3.0),
        _timed("pa-grpc", 1, (150, 150), p99_ms=9.0),
        _closed("grpc", 4, 200),
        _closed("shm-client", 4, 800, 4),
        _timed("pa-shm", 4, (700, 700)),
        _timed("pa-grpc", 4, (900, 1100)),
    ]
    model = ModelResult("identity", _CASE, runs)
    # Its numbers: a rate over every slice's requests; each percentile the slices' mean,
    # weighted by their requests; no CPU measured, no fairness.
    numbers = runs[2].numbers()
    assert numbers["requests_per_s"] == pytest.approx(400)
    assert numbers["latency_ms"] == {"p50": 1.0, "p90": 2.0, "p99": 3.0}
    assert numbers["cpu_s_per_gb"] is None and numbers["fairness"] is None
    assert numbers["mb_per_s_rounds"] == pytest.approx([380 * 4e-6, 420 * 4e-6])
    # The better of the two at each number of callers: pa-shm at 1, pa-grpc at 4.
    assert model.ceiling(1) is runs[2] and model.ceiling(4) is runs[7]
    assert model.vs_ceiling(runs[1]) == (pytest.approx(0.75), runs[2])
    assert model.vs_ceiling(runs[5]) == (pytest.approx(0.8), runs[7])
    # A run Triton's crash disturbed is no ceiling.
    runs[7].disturbed = "Triton crashed"
    assert model.ceiling(4) is runs[6] and model.vs_ceiling(runs[5])[0] == pytest.approx(8 / 7)
    runs[7].disturbed = None
    goal = Goal("identity", ("shm-client", 1), 0.8, (CEILING, 1))
    assert goal.measure(model) == pytest.approx(0.75) and goal.met(0.75) is False
    assert goal.description == (
        "shm-client (1 caller) MB/s >= 0.8x perf_analyzer (1 caller), the better of pa-shm "
        "and pa-grpc"
    )
    config = BenchConfig(models=("identity",), paths=("grpc", "shm-client", "pa-shm", "pa-grpc"))
    results = BenchResults(config, [model], "embedded", 1.0)
    cells = verdicts(results)["identity"]
    assert [(c.callers, c.vs_ceiling, c.ceiling) for c in cells] == [
        (1, pytest.approx(0.75), runs[2]),
        (4, pytest.approx(0.8), runs[7]),
    ]
    assert cells[0].ceiling_goal == goal and cells[0].ceiling_met is False
    assert verdict_lines(results) == [
        "identity, core client vs plain gRPC: faster at 1 caller, 3.00x, 0.75x perf_analyzer "
        "(pa-shm); faster at 4 callers, 4.00x, 0.8x perf_analyzer (pa-grpc)"
    ]
    measured = {g.description: value for g, value in results.goals()}
    assert measured[goal.description] == pytest.approx(0.75)
    # Without perf_analyzer's paths, the goals against it are not the run's.
    without = BenchResults(
        BenchConfig(models=("identity",), paths=("grpc", "shm-client")), [model], "x", 1.0
    )
    assert all("perf_analyzer" not in g.description for g, _ in without.goals())
