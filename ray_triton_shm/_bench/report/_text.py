"""The bench's wording, in plain text, that the terminal (:mod:`._console`) and the report
(:mod:`._html`) both say: the legends, the rows of a model's table, the pool-size answers, the
node under load, the churn, Serve over HTTP, the model update, and Triton's crashes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ray_triton_shm._bench._config import (
    BY_VALUE,
    BY_VALUE_SHARE,
    CHURN,
    CHURN_KILL_EVERY_S,
    ELASTIC,
    GRPC_TWINS,
    LIBRARY_PATHS,
    NODE_LOAD,
    NODE_LOAD_FIXED,
    NODE_LOAD_WARMUP_S,
    POOL_SAMPLE_S,
    REPLICAS,
    SERVE_HTTP_CLIENTS,
    SERVE_HTTP_PATHS,
    SHM,
    STREAM_TWINS,
)
from ray_triton_shm._bench._format import num, per_s
from ray_triton_shm._bench._results import (
    ELASTIC_POOL,
    POOL_SIZE_FOR_RATE,
    POOL_SIZE_FOR_THROUGHPUT,
    RECOMMEND_SHARE,
    BenchResults,
    ModelResult,
    RunResult,
    UpdateResult,
    describe_run,
    describe_slots,
    mb_ratio,
    ratio,
)

__all__ = ["CEILING_LEGEND", "STREAM_LEGEND", "bound_text", "crash_lines", "elastic_lines"]
__all__ += ["MANY_CALLERS_LEGEND", "extra_lines", "many_callers_cell", "many_callers_title"]
__all__ += ["model_rows", "pool_growth", "pool_size_legend", "pool_size_lines", "rate_text"]
__all__ += ["by_value_goal_line", "run_transport", "throughput_text", "transport_lines"]

#: What the ratio to perf_analyzer is, as the terminal and the report say it.
CEILING_LEGEND = (
    "vs perf_analyzer = MB/s over the better of Triton's perf_analyzer's runs with as many "
    "callers (pa-shm: its inputs written into shared memory once; pa-grpc: by value): it "
    "never reads its outputs, so it is the most any client gets from this Triton."
)
#: What a streaming model's numbers are, as the terminal and the report say it.
STREAM_LEGEND = (
    "On a streaming model (decoupled: its responses streamed), each caller runs one stream "
    "at a time: its callers are streams at once, its speed-up is responses/s over "
    "tritonclient's streaming client's in the same set-up (start_stream and "
    "async_stream_infer, inputs by value: a client per caller thread or process; in a Serve "
    "replica, one stream, its requests told apart by their ids), and vs perf_analyzer is over "
    "the better of perf_analyzer --streaming's runs (pa-stream-shm, pa-stream)."
)
#: What the many-callers case's table says, as the terminal and the report say it.
MANY_CALLERS_LEGEND = (
    "Many callers at 1 row each (node batching): each caller a Ray task (a process) or a "
    "Serve handle's caller, sending one request of 1 row at a time (closed loop); node "
    "batching merges the calls of every process on the node into one Triton request. Each "
    "cell: samples/s, p50 / p99 latency (ms), and rows per Triton request (Triton's own "
    "counts of the model; where its dynamic batcher merged requests, rows per execution "
    "after a slash). perf_analyzer at as many callers, batch 1; Triton's dynamic batcher: the "
    "model's twin with dynamic_batching on; by value: on a Triton with a /dev/shm of its own."
)
#: The replica's stages, in the order a request goes through them.
_STAGES = ("request", "body", "parse", "batched", "model", "top_k", "json")


def _baseline(model: ModelResult, r: RunResult) -> RunResult | None:
    """gRPC in the same topology: the same Serve deployment or Ray Data job on plain gRPC, as
    many gRPC caller processes (``shm-model``), or gRPC at the same concurrency; of a
    streaming model, tritonclient's streaming client in the same set-up
    (:data:`~.._config.STREAM_TWINS`)."""
    if r.path in STREAM_TWINS:
        return model.run(STREAM_TWINS[r.path], r.concurrency)
    if r.path in GRPC_TWINS:
        return model.run(GRPC_TWINS[r.path], r.concurrency)
    if r.path.startswith(("serve", "data")):
        return model.run(r.path.rsplit("-", 1)[0] + "-grpc", r.concurrency)
    processes = model.run("grpc-procs", r.concurrency) if r.path == "shm-model" else None
    return processes or model.run("grpc", r.concurrency)


def _check(r: RunResult) -> str:
    """What the table's last column says of ``r``: ok, or why not."""
    if r.skipped is not None:
        return f"skipped: {r.skipped}"
    if r.disturbed is not None:
        return "disturbed (Triton crashed): not counted"
    if r.error:
        return f"FAILED: {r.error}"
    return f"not checked: {r.unchecked}" if r.unchecked else "ok"


def _stream_rows(model: ModelResult) -> tuple[str, tuple[str, ...], list[list[str]]]:
    """:func:`model_rows` of a streaming model: responses per second, the times to a
    stream's first response and to its end, the client's CPU per response, and the ratios of
    responses per second to tritonclient's streaming client and to perf_analyzer."""
    case = model.case
    assert case is not None
    title = f"{model.name}: model {case.model} (streaming), {num(case.input_nbytes / 1e6)} MB in"
    headers: tuple[str, ...] = ("run", "streams/s", "responses/s", "responses/stream")
    headers += ("first p50 ms", "first p99 ms", "last p50 ms", "last p99 ms", "CPU us/response")
    headers += ("vs tritonclient", "vs PA", "transport", "check")
    rows = []
    for r in model.runs:
        numbers = r.numbers()
        first, last = numbers.get("first_response_ms") or {}, numbers.get("last_response_ms") or {}
        base = _baseline(model, r)
        ceiling = model.ceiling(r.concurrency)
        rows.append(
            [
                describe_run(r.path, r.concurrency, r.slots),
                *(num(numbers.get(k)) for k in ("requests_per_s", "responses_per_s")),
                num(numbers.get("responses_per_stream")),
                *(num(times.get(p)) for times in (first, last) for p in ("p50", "p99")),
                num(numbers.get("cpu_us_per_response")),
                num(_responses_ratio(r, base), "x"),
                num(_responses_ratio(r, ceiling), "x"),
                _TRANSPORT_WORDS.get(run_transport(model, r)[0] or "", ""),
                _check(r),
            ]
        )
    title += "; first, last = a stream's time to its first response, to its end"
    return title, headers, rows


def _responses_ratio(r: RunResult, other: RunResult | None) -> float | None:
    """``r``'s responses per second over ``other``'s (``None``: not both, or the same run)."""
    if other is None or other is r or not other.counts:
        return None
    return ratio(r.numbers().get("responses_per_s"), other.numbers().get("responses_per_s"))


def model_rows(model: ModelResult) -> tuple[str, tuple[str, ...], list[list[str]]]:
    """The title, headers and a row per run of ``model``'s table (the check last)."""
    case = model.case
    if case is not None and case.streaming:
        return _stream_rows(model)
    title = model.name
    if case is not None:
        title += f": model {case.model}, {case.batch_size} samples per request, "
        title += f"{num(case.input_nbytes / 1e6)} MB in"
    headers: tuple[str, ...] = ("run", "req/s", "samples/s", "MB/s", "p50 ms", "p90 ms")
    headers += ("p99 ms", "CPU s/GB", "vs gRPC", "vs PA", "fairness", "wait p99 ms")
    headers += ("transport", "check")
    rows = []
    for r in model.runs:
        numbers = r.numbers()
        latency = numbers.get("latency_ms", {})
        base = _baseline(model, r)
        vs_grpc = mb_ratio(r, base) if base is not None and base is not r else None
        vs_ceiling, ceiling = model.vs_ceiling(r)
        check = _check(r)
        rows.append(
            [
                describe_run(r.path, r.concurrency, r.slots),
                *(num(numbers.get(key)) for key in ("requests_per_s", "samples_per_s", "mb_per_s")),
                *(num(latency.get(p)) for p in ("p50", "p90", "p99")),
                num(numbers.get("cpu_s_per_gb")),
                num(vs_grpc, "x"),
                num(vs_ceiling if ceiling is not r else None, "x"),
                num(numbers.get("fairness")),
                num(numbers.get("wait_p99_ms")),
                _TRANSPORT_WORDS.get(run_transport(model, r)[0] or "", ""),
                check,
            ]
        )
    return title, headers, rows


#: How the tables and lines name the library's transports.
_TRANSPORT_WORDS = {SHM: "shm", BY_VALUE: "by value"}


def run_transport(model: ModelResult, r: RunResult) -> tuple[str | None, str]:
    """How a run of one of the library's paths reached Triton (``"shm"``, or ``"inline"``: by
    value), as it said after its rounds or else as found for its model, and why; ``None`` for
    another path's run, a skipped one, or where not known."""
    if r.path not in LIBRARY_PATHS or r.skipped is not None:
        return None, ""
    kind = r.extra.get("transport") or model.transport
    return kind, r.extra.get("transport_reason") or model.transport_reason


def transport_lines(results: BenchResults) -> list[str]:
    """A line per transport the library's paths took: those paths, their models and why (the
    first one's reason), e.g. ``"by value: shm-client, shm-model on identity, classifier:
    Triton at HOST:PORT could not open /dev/shm/... (...)"``."""
    seen: dict[str, tuple[list[str], list[str], str]] = {}
    for model in results.models:
        for r in model.runs:
            kind, reason = run_transport(model, r)
            if kind is None:
                continue
            paths, models, _ = seen.setdefault(kind, ([], [], reason))
            paths.extend([r.path] * (r.path not in paths))
            models.extend([model.name] * (model.name not in models))
    words = {SHM: "shared memory", BY_VALUE: "by value"}
    return [
        f"{words.get(kind, kind)}: {', '.join(paths)} on {', '.join(models)}: {reason}"
        for kind, (paths, models, reason) in seen.items()
    ]


def by_value_goal_line(results: BenchResults) -> str | None:
    """The goal of a run by value in a line: every library path at least
    :data:`~.._config.BY_VALUE_SHARE` of its plain gRPC twin's MB/s in the same run, how
    many met it, and the lowest ratio (``None``: no model ran by value)."""
    mine = {goal for m in results.models if m.by_value for goal in m.by_value_goals()}
    goals = [(goal, value) for goal, value in results.goals() if goal in mine]
    if not goals:
        return None
    met = sum(goal.met(value) is True for goal, value in goals)
    missed = sum(goal.met(value) is False for goal, value in goals)
    unmeasured = len(goals) - met - missed
    text = (
        f"by value, the goal: each library path >= {BY_VALUE_SHARE:g}x plain gRPC's MB/s in "
        f"the same set-up and run (the library must cost nothing where it cannot help): "
        f"{met} met, {missed} missed" + (f", {unmeasured} not measured" if unmeasured else "")
    )
    measured = [(value, goal) for goal, value in goals if value is not None]
    if measured:
        value, goal = min(measured, key=lambda pair: pair[0])
        text += f"; lowest {num(value, 'x')} ({goal.model}: {describe_run(*goal.run)})"
    return text


def pool_growth(numbers: Mapping[str, Any]) -> str | None:
    """An elastic run's pool over time in words, e.g. ``"2 -> 16 slots within 0.4 s of load,
    16 at the end"`` or ``"2 -> 15 slots within 0.45 s of load, 16 within 1.15 s, 16 at the
    end"`` (from the start of its untimed first load; a size it had when that began came in
    its warm-up requests); ``None`` for another run."""
    samples = numbers.get("pool_sizes")
    if not samples:
        return None
    start = last = numbers["min_slots"]
    changes = []
    for index, (seconds, size) in enumerate(samples):
        if size != last:
            changes.append((index, seconds, size))
            last = size
    if not changes:
        return f"{start} slots throughout" + _held_back(numbers)
    steps = []
    for index, seconds, size in changes[:_STEPS]:
        if index == 0:
            steps.append(f"{size} in the warm-up requests")
        else:
            first = all(" within " not in step for step in steps)
            steps.append(f"{size} within {num(seconds)} s" + (" of load" if first else ""))
    text = f"{start} -> " + ", ".join(steps).replace(" ", " slots ", 1)
    text += f", ... ({len(changes)} changes)" if len(changes) > _STEPS else ""
    return text + f", {numbers['pool_size_settled']} at the end" + _held_back(numbers)


#: The most changes of an elastic pool's size :func:`pool_growth` spells out.
_STEPS = 4


def _held_back(numbers: Mapping[str, Any]) -> str:
    """Why the pool did not grow while callers waited: a limit held it back, or their waits
    were too short to be a reason (shorter than ``upscale_delay_s``)."""
    limits = [limit for limit in (numbers.get("limited_by") or "").split(",") if limit]
    held = [limit for limit in limits if limit != "upscale_delay_s"]
    said = [f"held back by {', '.join(held)}"] if held else []
    if "upscale_delay_s" in limits:
        said.append("callers' waits shorter than upscale_delay_s did not grow it")
    return f" ({'; '.join(said)})" if said else ""


def pool_size_legend(bound_ms: float | None) -> str:
    """What each pool-size answer answers, by its name, as the terminal and the report say
    it."""
    return (
        f"{POOL_SIZE_FOR_THROUGHPUT} = the fewest slots of a fixed pool whose shm throughput "
        f"reaches {RECOMMEND_SHARE:.0%} of the best in the closed loop (as many callers as "
        f"slots, at the --concurrency levels); {ELASTIC_POOL} under N callers = the size a "
        f"pool without pool_size (the default) settled on under that load, beside the fixed "
        f"pools measured there; {POOL_SIZE_FOR_RATE} = per open-loop request rate, the "
        f"smallest fixed pool that sustained it{bound_text(bound_ms)}."
    )


def throughput_text(rec: Mapping[str, Any] | None, *, detailed: bool = False) -> str | None:
    """The closed-loop answer, e.g. ``"pool_size_for_throughput: 4"``; ``detailed``: with its
    throughput, gRPC's and its /dev/shm (``None``: not measured)."""
    advice = rec[POOL_SIZE_FOR_THROUGHPUT] if rec else None
    if advice is None:
        return None
    text = f"{POOL_SIZE_FOR_THROUGHPUT}: {advice['pool_size']}"
    if detailed:
        share = advice["requests_per_s"] / advice["best_requests_per_s"]
        shm_mb = num(advice["shm_bytes"] / 1e6, " MB") if advice["shm_bytes"] else "-"
        text += (
            f" ({num(advice['requests_per_s'])} req/s with {advice['path']}, {share:.0%} of the "
            f"best; the core client at {num(advice['shm_vs_grpc'], 'x')} gRPC's MB/s there; "
            f"{shm_mb} of /dev/shm)"
        )
    return text


def elastic_lines(model: ModelResult) -> list[str]:
    """Per load with an elastic run: the size it settled on, its pool over time, and its
    throughput against the fixed pools measured at that load, e.g. ``"elastic_pool under 16
    callers: settled at 16 slots (2 -> 16 slots within 0.4 s of load, 16 at the end): 1,234
    req/s, 0.98x the best fixed pool (16 slots, 1,260 req/s), 1.37x 4 slots (900 req/s)"``."""
    lines = []
    for advice in model.elastic():
        run = model.run("shm-model", advice["callers"], ELASTIC)
        growth = pool_growth(run.numbers()) if run else None
        text = (
            f"{ELASTIC_POOL} under {advice['callers']} callers: settled at "
            f"{advice['settled_slots']} slots ({growth or '-'}): "
            f"{num(advice['requests_per_s'])} req/s"
        )
        best = advice["best_fixed"]
        for fixed in sorted(advice["fixed"], key=lambda f: f["slots"] != best):
            times = num(ratio(advice["requests_per_s"], fixed["requests_per_s"]), "x")
            rate = num(fixed["requests_per_s"])
            if fixed["slots"] == best:
                text += f", {times} the best fixed pool ({best} slots, {rate} req/s)"
            else:
                text += f", {times} {fixed['slots']} slots ({rate} req/s)"
        lines.append(text)
    return lines


def rate_text(rec: Mapping[str, Any] | None, bound_ms: float | None) -> str | None:
    """The open loop's answer, e.g. ``"pool_size_for_rate (p99 under 50 ms): 1 for 100/s
    (plain gRPC sustained it too), 4 for 300/s (plain gRPC did not); size the pool for the
    highest rate you serve"`` (``None``: no open loop ran)."""
    advice = rec[POOL_SIZE_FOR_RATE] if rec else None
    if not advice:
        return None
    grpc = {True: "plain gRPC sustained it too", False: "plain gRPC did not", None: ""}
    parts = []
    for a in advice:
        rate = f"{per_s(a['request_rate'])}/s"
        part = f"{a['pool_size']} for {rate}" if a["pool_size"] else f"none tried for {rate}"
        said = grpc[a["grpc_sustained"]]
        parts.append(part + (f" ({said})" if said else ""))
    return (
        f"{POOL_SIZE_FOR_RATE}{bound_text(bound_ms)}: "
        + ", ".join(parts)
        + "; size the pool for the highest rate you serve"
    )


#: The pool-size answer of a streaming model.
STREAM_POOL = (
    "a streaming model: each stream holds one slot until Triton's final response; a pool "
    "as large as the streams at once (its runs had a slot per stream)"
)


def pool_size_lines(model: ModelResult, bound_ms: float | None) -> list[str]:
    """Every pool-size answer for ``model``, a line each, by its name (none: no shm run)."""
    if model.case is not None and model.case.streaming:
        return [STREAM_POOL]
    rec = model.recommendation(bound_ms)
    lines = [throughput_text(rec, detailed=True), *elastic_lines(model), rate_text(rec, bound_ms)]
    return [line for line in lines if line]


def _node_load(model: ModelResult) -> str | None:
    """The node under load on ``model`` in a line, if its elastic run posted numbers."""
    elastic = model.run(*NODE_LOAD[0])
    if elastic is None or not elastic.ok:
        return None
    parts = []
    for key in (*NODE_LOAD, *NODE_LOAD_FIXED):
        run = model.run(*key)
        numbers = run.numbers() if run else {}
        if not numbers:
            continue
        path, _, slots = key
        name = "gRPC" if path != "shm-model" else describe_slots(slots)
        p50, p99 = (num(numbers["latency_ms"][p]) for p in ("p50", "p99"))
        parts.append(f"{name} {num(numbers['requests_per_s'])} req/s (p50 {p50} / p99 {p99} ms)")
    numbers = elastic.numbers()
    growth = pool_growth(numbers) or "-"
    if numbers.get("warmup_requests_per_s"):
        growth += f"; {num(numbers['warmup_requests_per_s'])} req/s in its untimed warm-up"
    return f"  {model.name}: " + "; ".join(parts) + f"; the elastic pool: {growth}"


def _churn(model: ModelResult) -> str | None:
    """The churn runs of ``model`` in a line, if both posted numbers."""
    steady, churn = (run.numbers() if run else {} for run in (model.run(*key) for key in CHURN))
    if not steady or not churn:
        return None

    def rate(numbers: dict[str, Any]) -> str:
        p50, p99 = (num(numbers["latency_ms"][p]) for p in ("p50", "p99"))
        return f"{num(numbers['requests_per_s'])} req/s (p50 {p50} / p99 {p99} ms)"

    ratio = churn["requests_per_s"] / steady["requests_per_s"]
    checked = steady["requests"] + churn["requests"]
    wrong = steady["wrong_answers"] + churn["wrong_answers"]
    return (
        f"  {model.name}: {rate(churn)} with {churn['kills']} caller(s) killed "
        f"(their slots back {churn.get('settle_p99_us', 0) / 1000:,.0f} ms after being given up, "
        f"p99), {ratio:.2f}x the "
        f"{rate(steady)} without; {checked:,} answers checked, {wrong} wrong"
    )


def _serve_http_lines(model: ModelResult) -> list[str]:
    """The example app behind Serve's HTTP proxy on ``model``, a line per load: the shm app
    against the gRPC and no-op apps, and where each spent a request's time in its replica."""
    lines = []
    for clients in SERVE_HTTP_CLIENTS:
        runs = {p.rsplit("-", 1)[1]: model.run(p, clients) for p in SERVE_HTTP_PATHS}
        numbers = {b: r.numbers() if r else {} for b, r in runs.items()}
        if not numbers["shm"]:
            continue
        rate = {b: n.get("requests_per_s") for b, n in numbers.items()}
        p50 = "/".join(
            num(numbers[b].get("latency_ms", {}).get("p50")) for b in ("shm", "grpc", "noop")
        )
        lines.append(
            f"  {model.name}, {clients} client{'s' * (clients > 1)}: shm {num(rate['shm'])} req/s"
            f" = {num(ratio(rate['shm'], rate['grpc']), 'x')} gRPC's {num(rate['grpc'])}, "
            f"{num(ratio(rate['shm'], rate['noop']), 'x')} no-op's {num(rate['noop'])}; "
            f"p50 {p50} ms (shm/gRPC/no-op)"
        )
        for backend, r in runs.items():
            stages = numbers[backend].get("replica_ms")
            if not stages or r is None:
                continue
            mean = 1e3 * float(np.mean(np.concatenate([np.array(c) for c in r.latencies_s])))
            batch = numbers[backend].get("images_per_batch")
            parts = ", ".join(
                f"{stage} {num(stages[stage])}" for stage in _STAGES if stage in stages
            )
            cpu = numbers[backend].get("cpu_ms", {})
            cpus = ", ".join(f"{name} {num(ms)}" for name, ms in cpu.items())
            busy = numbers[backend].get("proxy_busy")
            lines.append(
                f"    {backend:<4} ms per request in the replica: {parts}"
                f" ({num(batch)} images per batch); outside it (proxy, hops, client): "
                f"{num(mean - stages.get('request', 0.0))} of {num(mean)} (mean). CPU ms per "
                f"request: {cpus}; the proxy busy {num(busy)} of a core"
            )
    return lines


def crash_lines(results: BenchResults) -> list[str]:
    """A line per crash of Triton (when, during which run, why, where its log is), the runs
    it disturbed, and why the bench stopped early, if it did."""
    lines = []
    for outage in results.outages:
        log = f" (log: {outage.crash.log_path})" if outage.crash is not None else ""
        lines.append(outage.describe() + log)
    disturbed = results.disturbed()
    if disturbed:
        lines.append(
            "disturbed (their numbers kept, used for no verdict, goal or advice): "
            + "; ".join(disturbed)
        )
    if results.stopped:
        lines.append(f"stopped early: {results.stopped}; the report has what ran before")
    return lines


def bound_text(bound: float | None) -> str:
    """`` (p99 under BOUND ms)``, or nothing without a latency bound."""
    return f" (p99 under {bound:g} ms)" if bound is not None else ""


def extra_lines(results: BenchResults) -> str:
    """The node under load, the churn, Serve over HTTP and the model update, in lines
    (``""``: none ran)."""
    cfg, parts = results.config, []
    node = [line for line in map(_node_load, results.models) if line]
    if node:
        callers = NODE_LOAD[0][1]
        fixed = " and ".join(str(slots) for _, _, slots in NODE_LOAD_FIXED)
        parts.append(
            f"The node under load ({callers} caller processes, each looping on one request: "
            f"ShmModel as it comes, its pool following its load, interleaved with plain "
            f"gRPC; then fixed pools of {fixed} node slots, each on a node actor of its own; "
            f"each run gets {num(NODE_LOAD_WARMUP_S)} s of load, untimed, before the rounds; "
            f"the elastic pool's size read every {POOL_SAMPLE_S:g} s from its own on):\n"
            + "\n".join(node)
        )
    churn = [line for line in map(_churn, results.models) if line]
    if churn:
        _, callers, slots = CHURN[0]
        parts.append(
            f"Churn ({callers} caller processes on {slots} node slots, {num(cfg.churn_s)} s "
            f"each; one SIGKILLed every {CHURN_KILL_EVERY_S:g} s, mid-request, and replaced at "
            f"once; every answer checked against plain gRPC's for its inputs):\n" + "\n".join(churn)
        )
    http = [line for model in results.models for line in _serve_http_lines(model)]
    if http:
        parts.append(
            f"Serve over HTTP (the example app, {REPLICAS} replicas each, as it ships but for "
            f"its model: ShmModel, plain gRPC, or none; .npy bodies from clients in this "
            f"process; every answer's classes checked). In the replica, per request: request = "
            f"the whole handler, body = reading it, parse = to float32 images, batched = "
            f"@serve.batch's wait, split, model and join, model = the model's call (shared by "
            f"the batch), top_k and json:\n" + "\n".join(http)
        )
    if results.model_update is not None:
        parts.append(_update_lines(results.model_update))
    return "\n\n".join(parts)


def _update_lines(update: UpdateResult) -> str:
    head = (
        f"A model's config reloaded under load ({update.callers} callers of one "
        f"TritonSHMClient on {update.slots} slots, {num(update.duration_s)} s; the output grown "
        f"from 16 to 32 values per sample, past the slots, and load_model called halfway; "
        f"every answer checked against its own input):\n"
    )
    if update.error is not None:
        return head + f"  FAILED: {update.error}"
    first = update.first_new_answer_s
    lines = [
        f"  {update.old_config_answers} answers from the old config, "
        f"{update.new_config_answers} from the new, {update.failed} failed, "
        f"{update.wrong_answers} wrong; old regions left: {update.old_regions_left}",
        f"  Triton's reload {num(update.reload_s)} s; first answer from the new config "
        f"{'none' if first is None else num(first) + ' s'} after it began; latency p50 "
        f"{num(update.p50_ms)} ms, p99 {num(update.p99_ms)} ms, max {num(update.max_ms)} ms",
    ]
    lines += [f"  error: {error}" for error in update.errors]
    return head + "\n".join(lines)


def many_callers_title(model: ModelResult) -> str:
    """The title of ``model``'s many-callers table, e.g. ``"identity-1: model identity, 1
    row per call"``."""
    case = model.case
    if case is None:
        return model.name
    rows = f"{case.batch_size} row{'s' * (case.batch_size != 1)}"
    return f"{model.name}: model {case.model}, {rows} per call"


def many_callers_cell(run: RunResult | None) -> str:
    """One choice at one number of callers, e.g. ``"3,100/s, 4.49 / 14.8 ms, 4.73 rows"``
    (rows per Triton request; ``"1.00 / 3.20 rows"`` where Triton's dynamic batcher made
    executions of more rows than the requests had), ``"disturbed"`` after a crash of Triton,
    ``"-"`` not run."""
    if run is None:
        return "-"
    numbers = run.numbers()
    latency = numbers["latency_ms"]
    text = f"{per_s(numbers['samples_per_s'])}/s, {num(latency['p50'])} / {num(latency['p99'])} ms"
    rows, merged = numbers.get("rows_per_request"), numbers.get("rows_per_execution")
    if rows is not None:
        more = merged is not None and merged > rows * 1.005
        text += f", {num(rows)}{f' / {num(merged)}' if more else ''} rows"
    return text + (" (disturbed)" if run.disturbed else "")
