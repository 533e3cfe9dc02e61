"""The bench's answer as users read it: the open loop's timing, the summary, the figures and
the HTML report (in headless Chromium, on a wide and a narrow window)."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _helpers import GREW, browse
from rich.console import Console

from ray_triton_shm._bench._cases import ModelCase
from ray_triton_shm._bench._config import DEFAULT_PATHS, ELASTIC, RAY_PATHS, BenchConfig
from ray_triton_shm._bench._load import (
    OpenLoop,
    SliceSummary,
    StreamSlice,
    arrival_times,
    run_open_loop,
)
from ray_triton_shm._bench._results import (
    ELASTIC_POOL,
    POOL_SIZE_FOR_RATE,
    POOL_SIZE_FOR_THROUGHPUT,
    BenchResults,
    ModelResult,
    RunResult,
)
from ray_triton_shm._bench._runner import rate_groups
from ray_triton_shm._bench._summary import best_cell, summary
from ray_triton_shm._bench.report._console import print_results
from ray_triton_shm._bench.report._figures import curves_path, write_figures
from ray_triton_shm._bench.report._html import SECTIONS, write_report
from ray_triton_shm._bench.report._json import write_json
from ray_triton_shm._cli import main
from ray_triton_shm._slots._specs import TensorSpec

_CASE = ModelCase("m", "m", 1, True, (TensorSpec("x", (1,), np.dtype(np.float32)),), ())


def test_arrivals_are_evenly_spaced_or_poisson() -> None:
    assert np.allclose(arrival_times(100, 0.1, "constant", seed=0), np.arange(10) / 100)
    poisson = arrival_times(1000, 5.0, "poisson", seed=1)
    assert 4500 < len(poisson) < 5500 and poisson[0] == 0 and np.all(np.diff(poisson) > 0)
    assert np.diff(poisson).std() == pytest.approx(1e-3, rel=0.1)  # exponential: sd = mean
    assert len(arrival_times(1, 0.1, "poisson", seed=2)) == 1  # at least one


def test_open_loop_latency_counts_from_when_a_request_was_due() -> None:
    """A server that takes 20 ms per request, asked for one every 10 ms by one thread: a
    closed loop would report 20 ms for each; the open loop shows the queue growing."""
    calls = []

    def slow() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.02)  # the load itself: the server's 20 ms a request

    loop = run_open_loop(slow, np.arange(20) / 100, time.perf_counter(), 1, give_up_s=10)
    assert loop.dropped == 0 and len(loop.latencies) == 20
    assert loop.latencies[0] < 0.03 and loop.latencies[-1] > 0.15  # 19 x 10 ms behind
    assert loop.first_s < 0.05 and loop.wall_s > 0.38
    # With enough threads, each goes out on time and none waits.
    loop = run_open_loop(slow, np.arange(20) / 100, time.perf_counter(), 4, give_up_s=10)
    assert loop.latencies.max() < 0.04


def test_open_loop_drops_what_it_could_not_send_in_time() -> None:
    release = threading.Event()
    loop = run_open_loop(
        lambda: release.wait(0.3), np.arange(50) / 1000, time.perf_counter(), 2, give_up_s=0.05
    )
    assert len(loop.latencies) == 2 and loop.dropped == 48


def _closed(path: str, level: int, slots: int | None, rate: float, **extra: object) -> RunResult:
    """A run of ``rate`` requests per second, latency 1 ms per caller's request."""
    run = RunResult(path, level, slots, _CASE, verified=True, extra=dict(extra))
    run.add(1.0, 0.1, None, [[0.001] * int(rate / level)] * level)
    return run


def _timed(path: str, level: int, rate: float) -> RunResult:
    """A perf_analyzer run of ``rate`` requests per second, timed by it."""
    run = RunResult(path, level, None, _CASE, verified=True, unchecked="it reads no output")
    run.add_summary(SliceSummary(int(rate), 1.0, {"p50": 1.0, "p90": 2.0, "p99": 3.0}))
    return run


def _open(path: str, slots: int | None, rate: float, p99_s: float, dropped: int = 0) -> RunResult:
    run = RunResult(path, 16, slots, _CASE, verified=True, rate_spec=f"{rate:g}", rate=rate)
    latencies = np.full(int(rate), p99_s / 2)
    latencies[-max(2, len(latencies) // 20) :] = p99_s
    run.add_open_loop(OpenLoop(latencies, dropped, 1.0 + p99_s / 2, p99_s / 2), 1.0, 0.1)
    return run


def _results(tmp_path: Path) -> BenchResults:
    """Two models as a --ray run with --request-rate would leave them."""
    runs = [
        _closed("grpc", 1, None, 100),
        _closed("shm-client", 1, 1, 300, shm_bytes=10),
        _closed("grpc", 4, None, 200),
        _closed("shm-client", 4, 4, 800, shm_bytes=40),
        _closed("shm-model", 1, 1, 250),
        _closed("grpc-procs", 1, None, 90),
        _closed("shm-model", 16, ELASTIC, 960, **GREW),
        _closed("grpc-procs", 16, None, 160),
        _closed("shm-model", 16, 4, 640),
        _closed("shm-model", 16, 16, 992),
        _closed("serve-grpc", 4, None, 64),
        _closed("serve-shm", 4, None, 160),
        _closed("data-grpc", 4, None, 40),
        _closed("data-shm", 4, None, 100),
        _closed("data-noop", 4, None, 110),
        _timed("pa-shm", 1, 400),
        _timed("pa-grpc", 1, 150),
        _timed("pa-shm", 4, 900),
        _timed("pa-grpc", 4, 300),
    ]
    rates = [
        _open("grpc", None, 100, 0.004),
        _open("shm-client", 1, 100, 0.002),
        _open("shm-client", 4, 100, 0.002),
        _open("grpc", None, 300, 0.2, dropped=3),
        _open("shm-client", 1, 300, 0.09),
        _open("shm-client", 4, 300, 0.003),
    ]
    classifier = ModelResult("classifier", _CASE, runs, rate_runs=rates)
    small = ModelResult("identity", _CASE, runs[:4])
    failed = ModelResult("broken", error="InferenceServerException: no such model")
    config = BenchConfig(
        models=("classifier", "identity", "broken"),
        request_rates=("100", "300"),
        latency_bound_ms=50.0,
    )
    return BenchResults(config, [classifier, small, failed], "embedded", 12.0)


def test_the_summary_compares_each_choice_with_its_grpc_twin(tmp_path: Path) -> None:
    table = summary(_results(tmp_path))
    assert set(table) == {"classifier", "identity"}  # the failed model has no numbers
    cells = {(c.choice.name, c.load): c for c in table["classifier"]}
    assert cells["core client", "low load"].speedup == pytest.approx(3.0)
    assert cells["core client", "under load"].speedup == pytest.approx(4.0)
    node = cells["Ray tasks", "under load"]  # 16 callers on ShmModel's default pool
    assert node.where == "shm-model (16 callers, elastic pool)"
    assert node.speedup == pytest.approx(6)  # against 16 gRPC callers
    assert cells["Serve (handles)", "under load"].speedup == pytest.approx(2.5)
    assert cells["Serve (handles)", "low load"].speedup is None
    assert cells["Serve over HTTP", "under load"].run is None
    best = best_cell(table["classifier"])
    assert best is not None and best.choice.name == "Ray tasks"
    # The goals on a cell: classifier's core client at one caller, 3x gRPC's.
    goal = cells["core client", "low load"]
    assert goal.goal is not None and goal.goal.target == 3.0 and goal.met is True
    # Beside gRPC, the ceiling: the better of perf_analyzer's runs at as many callers, and
    # the goal against it (at one caller, infer_shm's is against the line its copies allow:
    # the goals' table has it, the cell none).
    assert goal.vs_ceiling == pytest.approx(0.75) and goal.ceiling is not None
    assert goal.ceiling.path == "pa-shm" and goal.ceiling_goal is None
    loaded = cells["core client", "under load"]
    assert loaded.vs_ceiling == pytest.approx(800 / 900) and loaded.ceiling_goal is not None
    assert (loaded.ceiling_goal.target, loaded.ceiling_met) == (1.0, False)
    assert cells["Serve (handles)", "under load"].vs_ceiling == pytest.approx(160 / 900)
    assert node.vs_ceiling is None  # no perf_analyzer run with 16 callers


def test_the_open_loop_says_what_each_path_sustained(tmp_path: Path) -> None:
    model = _results(tmp_path).models[0]
    assert model.rate_limits(50.0) == {
        "grpc": 100,
        "shm-client (pool 1)": 100,
        "shm-client (pool 4)": 300,
    }
    assert model.rate_limits(None)["shm-client (pool 1)"] == 300  # no bound: pace alone
    assert model.pools_for_rates(50.0) == [
        {"request_rate": 100, "pool_size": 1, "grpc_sustained": True},
        {"request_rate": 300, "pool_size": 4, "grpc_sustained": False},
    ]


def test_the_open_loop_runs_a_group_per_pool_size() -> None:
    config = BenchConfig(
        paths=("grpc", "shm-client", "shm-model"), concurrency=(1, 4), max_threads=8
    )
    assert rate_groups(config) == [
        [("grpc", 8, None), ("shm-client", 1, 1), ("shm-model", 4, 1)],
        [("shm-client", 4, 4), ("shm-model", 4, 4)],
    ]
    assert config.rate("50%", 300.0) == 150.0 and config.rate("20", None) == 20.0
    with pytest.raises(ValueError, match="share of plain gRPC"):
        config.rate("50%", None)


def test_request_rate_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-5", "fast", "inf%"):
        assert main(["bench", "--request-rate", bad, "--url", "x:1"]) == 2
        assert "--request-rate takes R or N%" in capsys.readouterr().err
    assert main(["bench", "--request-rate", "50%", "--paths", "shm-client", "--url", "x:1"]) == 2
    assert "run the grpc path" in capsys.readouterr().err
    assert main(["bench", "--rate-models", "other", "--models", "m", "--url", "x:1"]) == 2
    assert "not in --models" in capsys.readouterr().err
    assert main(["bench", "--latency-bound-ms", "0", "--url", "x:1"]) == 2
    assert main(["bench", "--arrivals", "bursty", "--url", "x:1"]) == 2


def test_the_figures_and_the_report_read_well_wide_and_narrow(tmp_path: Path) -> None:
    results = _results(tmp_path)
    written = write_figures(results, tmp_path / "bench.png")
    curves = {m: curves_path(tmp_path / "bench.png", m) for m in ("classifier", "identity")}
    assert written == [tmp_path / "bench.png", *curves.values()]
    for png in written:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = write_report(
        results, tmp_path / "report.html", summary_figure=written[0], curves=curves
    )
    page = report.read_text()
    assert "<script" not in page and "http://" not in page and "https://" not in page
    for width in (1400, 390):
        seen = browse(report, width)
        assert [s["id"] for s in seen["sections"]] == list(SECTIONS)
        assert all(s["height"] > 30 for s in seen["sections"]), seen["sections"]
        assert len(seen["images"]) == 3 and all(i["loaded"] for i in seen["images"])
        # Nothing wider than the window: the figures shrink, wide tables scroll in their box.
        assert all(i["width"] <= seen["viewport"] for i in seen["images"]), seen
        assert seen["page_width"] <= seen["viewport"], seen
    assert "pool_size_for_throughput: 4 (800 req/s with shm-client" in page
    assert "no such model" in page
    # Under load the pool needs no size: the one it settled on, beside the fixed pools.
    assert (
        "elastic_pool under 16 callers: settled at 16 slots (2 -&gt; 16 slots within 0.4 s of "
        "load, 16 at the end): 960 req/s, 0.968x the best fixed pool (16 slots, 992 req/s)"
    ) in page
    assert "shm-client (pool 4)" in page and "MISSED" not in page.split('id="goals"')[0]
    assert "<td>0.75x perf_analyzer (pa-shm)</td>" in page  # beside each choice's speed-up
    assert "not checked: it reads no output" in page


def _rounds(path: str, level: int, slots: int | None, rates: tuple[float, ...]) -> RunResult:
    """A run of a second per round, at each of ``rates`` requests per second."""
    run = RunResult(path, level, slots, _CASE, verified=True)
    for rate in rates:
        run.add(1.0, 0.1, None, [[0.001] * int(rate / level)] * level)
    return run


def _printed(results: BenchResults) -> tuple[str, str]:
    """What ``bench --full`` prints for ``results`` when stdout is not a terminal: all of it,
    and its summary."""
    out = io.StringIO()
    print_results(results, Console(file=out, width=1000), full=True)
    printed = out.getvalue()
    return printed, printed[printed.index("speed-up = MB/s over plain gRPC") :]


def test_a_loss_at_one_caller_shows_in_the_summary_the_report_and_the_json(
    tmp_path: Path,
) -> None:
    """The issue's case: no measurable difference under load, while at one caller plain gRPC
    beat the core client in every round. Each caller count gets its verdict (a disturbed run
    none), in the terminal's summary, the report's and the JSON."""
    runs = [
        _rounds("grpc", 1, None, (872, 880, 865, 870)),
        _rounds("shm-client", 1, 1, (779, 770, 790, 781)),
        _rounds("grpc", 2, None, (1000, 1000, 1000, 1000)),
        _rounds("shm-client", 2, 2, (2000, 2000, 2000, 2000)),
        _rounds("grpc", 4, None, (1500, 1520, 1480, 1500)),
        _rounds("shm-client", 4, 4, (1560, 1440, 1540, 1480)),
    ]
    runs[3].disturbed = "Triton crashed (signal 6) during this run"
    config = BenchConfig(models=("identity",), concurrency=(1, 2, 4))
    results = BenchResults(config, [ModelResult("identity", _CASE, runs)], "embedded", 1.0)

    full, summary_text = _printed(results)
    loss = "slower at 1 caller, 0.895x (0.875-0.913x)"
    even = "no measurable difference at 4 callers, 1.00x (0.947-1.04x)"
    assert f"identity, core client vs plain gRPC: {loss}; {even}\n" in summary_text, full
    assert "at 2 callers" not in full  # disturbed: no verdict
    # The fastest choice under load still reads as it did, its load named.
    assert "identity: no measurable difference from plain gRPC under load: " in summary_text

    page = write_report(results, tmp_path / "report.html").read_text()
    summary_html = page[page.index('id="summary"') : page.index('id="crashes"')]
    assert re.search(
        r"<td class=\"text\">identity</td><td class=\"text\">core client \(TritonSHMClient\)"
        r"</td><td>1</td><td class=\"text\"><span class=\"missed\">slower</span></td>"
        r"<td>0.895x \(0.875-0.913x\)</td>",
        summary_html,
    ), summary_html
    assert "no measurable difference</span></td><td>1.00x (0.947-1.04x)</td>" in summary_html

    data = json.loads(write_json(results, tmp_path / "bench.json").read_text())
    verdicts = data["verdicts"]["identity"]
    assert [(v["choice"], v["callers"], v["verdict"]) for v in verdicts] == [
        ("core client", 1, "slower"),
        ("core client", 4, "no measurable difference"),
    ]
    assert verdicts[0]["api"] == "TritonSHMClient"
    assert verdicts[0]["speedup"] == pytest.approx(3120 / 3487)
    assert verdicts[0]["spread"] == pytest.approx([770 / 880, 790 / 865])
    assert (verdicts[0]["run"], verdicts[0]["baseline"]) == (
        "shm-client (1 caller)",
        "grpc (1 caller)",
    )


def test_each_pool_size_answer_has_one_name_in_the_terminal_the_report_and_the_json(
    tmp_path: Path,
) -> None:
    """Three questions, three answers, each by its one name: the fixed pool for the most
    closed-loop throughput, the elastic pool's size under 16 callers, the pool per rate."""
    results = _results(tmp_path)
    full, summary_text = _printed(results)
    page = write_report(results, tmp_path / "report.html").read_text()
    data = json.loads(write_json(results, tmp_path / "bench.json").read_text())

    rec = data["recommendations"]["classifier"]
    assert set(rec) == {POOL_SIZE_FOR_THROUGHPUT, ELASTIC_POOL, POOL_SIZE_FOR_RATE}
    assert rec[POOL_SIZE_FOR_THROUGHPUT]["pool_size"] == 4
    assert [(a["callers"], a["settled_slots"]) for a in rec[ELASTIC_POOL]] == [(16, 16)]
    assert [(a["request_rate"], a["pool_size"]) for a in rec[POOL_SIZE_FOR_RATE]] == [
        (100, 1),
        (300, 4),
    ]
    assert data["recommendations"]["identity"][ELASTIC_POOL] == []  # no node under load
    assert "broken" not in data["recommendations"]
    answers = {
        POOL_SIZE_FOR_THROUGHPUT: "pool_size_for_throughput: 4",
        ELASTIC_POOL: "elastic_pool under 16 callers: settled at 16 slots",
        POOL_SIZE_FOR_RATE: "pool_size_for_rate (p99 under 50 ms): 1 for 100/s (plain gRPC "
        "sustained it too), 4 for 300/s (plain gRPC did not)",
    }
    recommendations = page[page.index('id="recommendations"') : page.index('id="request-rate"')]
    for name, answer in answers.items():
        assert answer.startswith(name)
        assert f"classifier: {answer}" in full, (name, full)
        assert answer in recommendations, (name, recommendations)
        # Each name is said in the summaries too, where it is explained.
        assert f"{name} " in summary_text and name in page[: page.index('id="crashes"')]
    # The summary: the elastic pool's and the open loop's lines, and the fixed pool in its
    # table, under the same name; no other name for a pool size.
    assert f"classifier, {answers[ELASTIC_POOL]}" in summary_text
    assert f"classifier, {answers[POOL_SIZE_FOR_RATE]}" in summary_text
    assert re.search(r"\nclassifier +1 +Ray tasks .* 4\n", summary_text), summary_text
    assert "none needed" not in full + page and "for_rates" not in json.dumps(data)


def test_an_elastic_pool_s_growth_says_what_held_it_back_and_what_was_no_reason() -> None:
    from ray_triton_shm._bench.report._text import pool_growth

    run = {"pool_sizes": [[0.1, 2], [0.4, 16], [2.0, 16]], "min_slots": 2}
    run["pool_size_settled"] = 16
    assert pool_growth(run) == "2 -> 16 slots within 0.4 s of load, 16 at the end"
    short_waits = pool_growth({**run, "limited_by": "upscale_delay_s"})
    assert short_waits is not None and "held back" not in short_waits
    assert short_waits.endswith("(callers' waits shorter than upscale_delay_s did not grow it)")
    both = pool_growth({**run, "limited_by": "max_slots,upscale_delay_s"})
    assert both is not None and both.endswith(
        "(held back by max_slots; callers' waits shorter than upscale_delay_s did not grow it)"
    )


def test_by_value_each_library_path_s_goal_is_its_grpc_twin_and_the_summary_says_why(
    tmp_path: Path,
) -> None:
    """A Triton that cannot map the bench's /dev/shm: the library's runs say they went by
    value and why, the goals on them are 0.95x their plain gRPC twins' (shared memory's
    speed-ups do not apply, goals without a baseline still do), the shm-only paths skipped."""
    why = "Triton at remote:8001 could not open /dev/shm/rtshm_1_identity@0 (Unable to open)"
    inline = {"transport": "inline", "transport_reason": why}
    lease = RunResult("shm-lease", 1, 1, _CASE, skipped="a lease cannot run by value: ...")
    runs = [
        _closed("grpc", 1, None, 100),
        _closed("shm-client", 1, 1, 90, **inline),  # 0.9x: missed
        _closed("grpc", 4, None, 200),
        _closed("shm-client", 4, 4, 200, **inline),
        lease,
        _closed("shm-model", 16, 4, 100, **inline),  # fewer slots than callers: no goal
        _closed("shm-model", 16, ELASTIC, 160, **inline),
        _closed("grpc-procs", 16, None, 160),
    ]
    paths = (*DEFAULT_PATHS, *RAY_PATHS)
    config = BenchConfig(models=("identity",), paths=paths, concurrency=(1, 4), url="remote:8001")
    model = ModelResult("identity", _CASE, runs, transport="inline", transport_reason=why)
    results = BenchResults(config, [model], "remote:8001", 1.0)

    goals = {goal.description: value for goal, value in results.goals()}
    assert goals == {
        "shm-client (1 caller) MB/s >= 0.95x grpc (1 caller)": pytest.approx(0.9),
        "shm-client (4 callers) MB/s >= 0.95x grpc (4 callers)": pytest.approx(1.0),
        "shm-model (16 callers, elastic pool) MB/s >= 0.95x grpc-procs (16 callers)": 1.0,
        "shm-model (16 callers, elastic pool): fewest requests of a caller / mean >= 0.5": 1.0,
    }
    full, summary_text = _printed(results)
    assert f"by value: shm-client, shm-lease, shm-model on identity: {why}\n" not in full
    assert f"by value: shm-client, shm-model on identity: {why}\n" in summary_text
    assert (
        "by value, the goal: each library path >= 0.95x plain gRPC's MB/s in the same set-up "
        "and run (the library must cost nothing where it cannot help): 2 met, 1 missed; "
        "lowest 0.9x (identity: shm-client (1 caller))\n"
    ) in summary_text
    assert "skipped: shm-lease on identity: a lease cannot run by value" in summary_text
    assert re.search(r"\nshm-client \(1 caller\) .* by value +ok\n", full), full
    assert re.search(r"\ngrpc \(1 caller\) .* ok\n", full) and ">= 1x grpc" not in full

    page = write_report(results, tmp_path / "report.html").read_text()
    assert f"by value: shm-client, shm-model on identity: {why}" in page
    data = json.loads(write_json(results, tmp_path / "bench.json").read_text())
    assert data["models"]["identity"]["transport"] == "inline"
    assert {r["path"]: r.get("transport") for r in data["runs"] if r["concurrency"] == 1} == {
        "grpc": None,
        "shm-client": "inline",
    }
    # The same runs through shared memory: shared memory's goals, and its line.
    model.transport = "shm"
    for run in runs:
        if "transport" in run.extra:
            run.extra.update(transport="shm", transport_reason="Triton mapped the region")
    assert ("identity", 1.0) in {(g.model, g.target) for g, _ in results.goals()}
    full, summary_text = _printed(results)
    assert "shared memory: shm-client, shm-model on identity: Triton mapped the region\n" in (
        summary_text
    )
    assert "\nby value" not in full and " by value " not in full  # no line, no run


_STREAM_CASE = ModelCase(
    "captioner",
    "captioner",
    1,
    False,
    (TensorSpec("IMAGE", (3, 224, 224), np.dtype(np.float32)),),
    (TensorSpec("TOKEN", (1,), np.dtype(np.int32)),),
    streaming=True,
)


def _streams(path: str, level: int, rates: tuple[float, ...], first_s: float) -> RunResult:
    """A streaming run: a second per round, at each of ``rates`` streams per second, each
    stream 8 responses, its first after ``first_s`` and its end after 4 ms."""
    run = RunResult(path, level, level if path != "stream-grpc" else None, _STREAM_CASE)
    run.verified, run.extra = True, {"transport": "shm"} if path != "stream-grpc" else {}
    for rate in rates:
        each = int(rate / level)
        first = [np.full(each, first_s) for _ in range(level)]
        last = [np.full(each, 0.004) for _ in range(level)]
        run.add_streams(StreamSlice(first, last, 8 * each * level, 1.0), 0.5, None)
    return run


def test_a_streaming_model_s_numbers_verdicts_and_goals_read_in_responses(tmp_path: Path) -> None:
    """A streaming model's table says responses per second, the times to the first response
    and to the end, and CPU per response; its verdicts are against tritonclient's streaming
    client, by streams; its goals are in responses/s and time to first response."""
    runs = [
        _streams("stream-grpc", 4, (100, 100), 0.002),
        _streams("stream-client", 4, (160, 168), 0.001),
        _streams("stream-async", 4, (88, 112), 0.003),
    ]
    pa = RunResult("pa-stream-shm", 4, None, _STREAM_CASE, verified=True, unchecked="none read")
    pa.add_summary(SliceSummary(200, 1.0, {"p50": 3.0, "p90": 4.0, "p99": 5.0}, responses=1600))
    model = ModelResult("captioner", _STREAM_CASE, [*runs, pa], transport="shm")
    results = BenchResults(BenchConfig(models=("captioner",)), [model], "embedded", 3.0)
    numbers = runs[1].numbers()
    assert numbers["responses_per_s"] == pytest.approx(8 * 164)
    assert numbers["responses_per_stream"] == 8
    assert numbers["first_response_ms"]["p50"] == pytest.approx(1.0)
    assert numbers["last_response_ms"]["p99"] == pytest.approx(4.0)
    assert numbers["cpu_us_per_response"] == pytest.approx(1.0 / (8 * 328) * 1e6)
    assert pa.numbers()["responses_per_s"] == 1600 and pa.numbers()["first_response_ms"] is None
    printed, said = _printed(results)
    assert "captioner: model captioner (streaming), 0.602 MB in" in printed
    assert re.search(r"stream-client \(4 streams\) +164 +1,312 +8\.00 +1\.00", printed), printed
    assert re.search(r"pa-stream-shm \(4 streams\) +200 +1,600 +8\.00 +- +- +3\.00", printed)
    assert "captioner: a streaming model: each stream holds one slot" in printed
    assert (
        "captioner, core client vs tritonclient's streaming client: faster at 4 streams, "
        "1.64x (1.60-1.68x), 0.82x perf_analyzer (pa-stream-shm)"
    ) in said
    assert "captioner, core client, async vs tritonclient's streaming client: no measurable" in said
    assert "On a streaming model (decoupled" in said
    measured = {g.description: (g.met(v), v) for g, v in results.goals()}
    assert measured["stream-client (4 streams) responses/s >= 1.5x stream-grpc (4 streams)"] == (
        True,
        pytest.approx(1.64),
    )
    ttfr = "stream-async (4 streams) time to first response p50 <= 1x stream-grpc (4 streams)"
    assert measured[ttfr] == (False, pytest.approx(1.5))
    data = json.loads(write_json(results, tmp_path / "bench.json").read_text())
    run = next(r for r in data["runs"] if r["path"] == "stream-client")
    assert run["first_response_p50_ms"] == pytest.approx(1.0) and run["responses_per_s"] > 0
    assert [v["choice"] for v in data["verdicts"]["captioner"]] == [
        "core client",
        "core client, async",
    ]
    page = write_report(results, tmp_path / "report.html").read_text()
    assert "tritonclient&#x27;s streaming client" in page and "first p50 ms" in page
    assert write_figures(results, tmp_path / "bench.png")[1] == curves_path(
        tmp_path / "bench.png", "captioner"
    )


def _many(
    path: str, callers: int, slots: int | None, rate: float, rows: float, p99_s: float = 0.004
) -> RunResult:
    """A run of the many-callers case: ``rate`` samples per second, ``rows`` rows per Triton
    request as Triton counted them, p99 latency ``p99_s``."""
    run = _closed(path, callers, slots, rate)
    run.many_callers = True
    for latencies in run.latencies_s:  # 2% of each caller's requests at p99_s
        slow = -(-len(latencies) // 50)
        latencies[-slow:] = [p99_s] * slow
    requests = int(rate / rows)
    run.add_counts((0, 0, 0), (requests, int(rate), requests))
    return run


def _many_callers_results() -> BenchResults:
    """identity-1 as the many-callers case leaves it, at 1 and 16 callers."""
    runs = [
        _many("shm-model-nb", 1, 1, 1900, 1.0),
        _many("grpc-procs", 1, None, 1500, 1.0),
        _many("shm-model", 1, 1, 2000, 1.0),
        _many("shm-model-nb", 16, 16, 6000, 5.0, p99_s=0.015),
        _many("serve-shm-nb", 16, None, 256, 2.0),
        _many("grpc-procs", 16, None, 1904, 1.0),
        _timed("pa-shm", 16, 2900),
        _timed("pa-grpc", 16, 3400),
        _many("grpc-procs-dynamic", 16, None, 1792, 1.0),
        _many("serve-grpc", 16, None, 240, 1.0),
        _many("shm-model", 16, 16, 2096, 1.0, p99_s=0.025),
        _many("serve-shm", 16, None, 144, 1.0),
        _many("shm-model-dynamic", 16, 16, 1600, 1.0),
        _many("shm-model-nb-byvalue", 16, 16, 2000, 4.0),
        _many("grpc-procs-byvalue", 16, None, 1600, 1.0),
    ]
    for run in runs[6:8]:
        run.many_callers = True
    runs[8].triton_executions = runs[8].triton_requests // 2  # Triton's batcher: 2 a batch
    model = ModelResult("identity-1", _CASE, runs)
    config = BenchConfig(
        models=("identity-1",), paths=(*DEFAULT_PATHS, *RAY_PATHS), many_callers=(1, 16)
    )
    return BenchResults(config, [model], "embedded", 1.0)


def test_the_many_callers_case_reads_in_samples_latency_and_rows_per_request(
    tmp_path: Path,
) -> None:
    """Node batching's case: a row per choice, a cell per number of callers (samples/s, p50
    and p99, rows per Triton request) in the terminal's summary, the report and the JSON; its
    goals measured side by side, in samples per second and p99."""
    results = _many_callers_results()
    full, summary_text = _printed(results)
    assert "Many callers at 1 row each (node batching)" in summary_text
    assert "identity-1: model m, 1 row per call" in summary_text
    rows = {line.split("  ")[0]: line for line in summary_text.splitlines() if "  " in line}
    nb = rows["Ray tasks, node batching"]
    assert re.search(r"shm-model-nb +1,900/s, 1.00 / .* ms, 1.00 rows +6,000/s, .*, 5.00 rows", nb)
    assert "1,792/s" in rows["Triton's dynamic batcher, plain gRPC"]
    assert "1.00 / 2.00 rows" in rows["Triton's dynamic batcher, plain gRPC"]  # per execution
    assert re.search(r"perf_analyzer, gRPC +pa-grpc +- +3,400/s", rows["perf_analyzer, gRPC"])
    assert "2,000/s" in rows["by value: Ray tasks, node batching"]
    # The choices of the summary: node batching against plain gRPC in the same processes.
    assert "identity-1, Ray tasks, node batching vs plain gRPC: faster at 1 caller" in full

    data = json.loads(write_json(results, tmp_path / "bench.json").read_text())
    many = {(c["path"], c["callers"]): c for c in data["many_callers"]["identity-1"]}
    assert many["shm-model-nb", 16]["rows_per_request"] == pytest.approx(5.0)
    assert many["shm-model-nb", 16]["samples_per_s"] == pytest.approx(6000)
    assert set(many["shm-model-nb", 16]["latency_ms"]) == {"p50", "p99"}
    assert many["grpc-procs-dynamic", 16]["rows_per_execution"] == pytest.approx(2.0)
    assert many["pa-grpc", 16]["choice"] == "perf_analyzer, gRPC"
    assert all(r["many_callers"] for r in data["runs"])
    page = write_report(results, tmp_path / "report.html").read_text()
    section = page[page.index('id="many-callers"') : page.index('id="crashes"')]
    assert "<td>6,000/s, 1.00 / 15.0 ms, 5.00 rows</td>" in section, section

    goals = {g["description"]: g for g in data["goals"]}
    nb16 = "shm-model-nb (16 callers)"
    measured = {
        f"{nb16} samples/s >= 2x perf_analyzer (16 callers), the better of pa-shm and pa-grpc": 6000
        / 3400,
        f"{nb16} samples/s >= 3x grpc-procs (16 callers)": 6000 / 1904,
        f"{nb16} samples/s >= 1.5x shm-model (16 callers, 16 slots)": 6000 / 2096,
        f"{nb16} p99 latency <= 1x shm-model (16 callers, 16 slots)": 15 / 25,
        f"{nb16} samples/s >= 1.5x grpc-procs-dynamic (16 callers)": 6000 / 1792,
        "shm-model-nb (1 caller) samples/s >= 0.95x shm-model (1 caller, 1 slot)": 0.95,
        "serve-shm-nb (16 callers) samples/s >= 1.3x serve-shm (16 callers)": 256 / 144,
        "shm-model-nb-byvalue (16 callers) samples/s >= 1.5x grpc-procs-byvalue (16 callers)": (
            2000 / 1600
        ),
    }
    for description, value in measured.items():
        assert goals[description]["value"] == pytest.approx(value, rel=1e-3), description
    assert goals[f"{nb16} p99 latency <= 1x shm-model (16 callers, 16 slots)"]["met"] is True
    assert goals[f"{nb16} samples/s >= 2x perf_analyzer (16 callers), the better of pa-shm and "
                 "pa-grpc"]["met"] is False  # fmt: skip
    # 64 callers were not run: their goal is not measured.
    assert [g["met"] for g in data["goals"] if "(64 callers)" in g["description"]] == [None]


def test_the_node_actor_s_goals_are_its_idle_cpu_and_its_cpu_per_extra_request() -> None:
    """Its CPU over a run less its idle CPU over that time, per request: the slope from no
    load to the run's (not its fixed cost spread over a short run's requests)."""
    from ray_triton_shm._bench._results import GOALS

    run = _closed("serve-shm", 4, None, 400)  # 400 requests in a second
    run.side_cpu_s, run.side_wall_s = 0.02, 1.25  # read over 1.25 s
    run.node_actor_idle = (0.004, 0.5)  # 8 ms a second without load
    numbers = run.numbers()
    assert numbers["node_actor_idle_ms_per_s"] == pytest.approx(8.0)
    assert numbers["node_actor_us_per_extra_request"] == pytest.approx((0.02 - 0.01) / 400 * 1e6)
    assert numbers["node_actor_cpu_us"] == pytest.approx(50.0)  # the old figure, still there
    model = ModelResult("classifier", _CASE, [run])
    goals = {g.description: g.measure(model) for g in GOALS if g.model == "classifier"}
    assert goals["serve-shm: node actor CPU us per extra request <= 58.5"] == pytest.approx(25.0)
    assert goals["serve-shm: node actor idle CPU ms/s <= 20"] == pytest.approx(8.0)
    assert "serve-shm: node actor CPU us/request <= 58.5" not in goals
    assert "node_actor_idle_ms_per_s" not in _closed("serve-shm", 4, None, 400).numbers()


def test_infer_shm_at_one_caller_is_held_to_the_line_its_copies_allow() -> None:
    """perf_analyzer never copies; infer_shm copies its inputs in and its outputs out: its
    goal at one caller is the line pa-shm's requests plus the memcpy floor's copies allow."""
    from ray_triton_shm._bench._results import GOALS

    runs = [
        _closed("shm-client", 1, 1, 300),
        _timed("pa-shm", 1, 500),  # 2 ms a request
        _closed("memcpy", 1, None, 2000),  # 0.5 ms of copies
    ]
    model = ModelResult("classifier", _CASE, runs)
    line = {
        g.description: g
        for g in GOALS
        if g.model == "classifier" and g.run[:2] == ("shm-client", 1)
    }
    goal = line[
        "shm-client (1 caller) MB/s >= 0.8x the line of pa-shm (1 caller) plus memcpy's copies"
    ]
    assert goal.paths == {"shm-client", "pa-shm", "memcpy"}
    assert goal.measure(model) == pytest.approx(300 / 400)  # 1 / (2 + 0.5 ms)
    assert goal.met(goal.measure(model)) is False
    lease = [g for g in GOALS if g.run == ("shm-lease", 1) and g.baseline == ("pa-shm", 1)]
    assert [g.model for g in lease] == ["large_image"]  # nothing copied: pa-shm itself
