"""The bench's results as JSON (``--json``; its schema: ``"ray-triton-shm-bench/3"``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ray_triton_shm._bench._config import CEILING_PATHS
from ray_triton_shm._bench._results import BenchResults, host_info
from ray_triton_shm._bench._summary import many_callers_json, verdicts_json

__all__ = ["bench_json", "write_json"]


def bench_json(results: BenchResults) -> dict[str, Any]:
    """A JSON-ready view: ``runs`` (those that posted numbers; ``disturbed``: what
    happened to Triton meanwhile, which keeps them from every verdict), ``verdicts`` and
    ``recommendations`` first."""
    bound = results.config.latency_bound_ms
    recommendations = {m.name: m.recommendation(bound) for m in results.models}
    return {
        "schema": "ray-triton-shm-bench/3",
        "runs": [
            {"model": m.name, "path": r.path, "concurrency": r.concurrency, "slots": r.slots}
            | r.numbers()
            | {"vs_perf_analyzer": m.vs_ceiling(r)[0], "unchecked": r.unchecked}
            | {"disturbed": r.disturbed, "many_callers": r.many_callers}
            for m in results.models
            for r in m.runs
            if r.ok
        ],
        "verdicts": verdicts_json(results),
        "many_callers": many_callers_json(results),
        "perf_analyzer": _ceilings_json(results),
        "recommendations": {name: r for name, r in recommendations.items() if r},
        "rate_runs": [
            {"model": m.name, "path": r.path, "slots": r.slots, "rate_spec": r.rate_spec}
            | {"arrivals": results.config.arrivals, "max_threads": results.config.max_threads}
            | r.numbers()
            | {"sustained": r.sustained(bound), "disturbed": r.disturbed}
            for m in results.models
            for r in m.rate_runs
            if r.ok
        ],
        "rate_limits": {m.name: m.rate_limits(bound) for m in results.models if m.rate_runs},
        "models": {
            m.name: {"error": m.error, "skipped": m.skipped()}
            | {"transport": m.transport, "transport_reason": m.transport_reason}
            for m in results.models
        },
        "goals": [
            {"model": g.model, "description": g.description, "target": g.target}
            | {"value": value, "met": g.met(value)}
            for g, value in results.goals()
        ],
        "failures": results.failures,
        "stopped": results.stopped,
        "triton_crashes": [outage.to_dict() for outage in results.outages],
        "disturbed": results.disturbed(),
        "units": {"mb": "1e6 bytes of input", "gb": "1e9 bytes of input"},
        "config": dataclasses.asdict(results.config),
        "server": results.server,
        "host": host_info(),
        "duration_s": results.duration_s,
        "model_update": None if results.model_update is None else results.model_update.to_dict(),
    }


def _ceilings_json(results: BenchResults) -> dict[str, list[dict[str, Any]]]:
    """Per model, the ceiling at each number of callers perf_analyzer ran with: the better
    of its runs there (``path``), and its numbers."""
    ceilings: dict[str, list[dict[str, Any]]] = {}
    for m in results.models:
        levels = sorted({r.concurrency for r in m.runs if r.path in CEILING_PATHS})
        for callers in levels:
            run = m.ceiling(callers)
            if run is not None:
                numbers = run.numbers()
                ceilings.setdefault(m.name, []).append(
                    {"callers": callers, "path": run.path}
                    | {k: numbers[k] for k in ("requests_per_s", "mb_per_s", "latency_ms")}
                )
    return ceilings


def write_json(results: BenchResults, path: str | Path) -> Path:
    """Write the machine-readable results; returns the path written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(bench_json(results), indent=2) + "\n")
    return target
