"""The bench's report: one self-contained HTML file, its figures embedded, readable on a wide
screen and on a phone. Its sections: the summary, the recommendations, the open loop, the
goals, every run's numbers, and the configuration and machine. The wording it shares with the
terminal is :mod:`._text`'s."""

from __future__ import annotations

import base64
import html
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ray_triton_shm._bench._format import num, per_s
from ray_triton_shm._bench._results import POOL_SIZE_FOR_THROUGHPUT, BenchResults, host_info
from ray_triton_shm._bench._summary import (
    LOADS,
    best_cell,
    ceiling_text,
    many_callers,
    speedup_text,
    summary,
    verdict,
    verdicts,
)
from ray_triton_shm._bench.report._text import (
    CEILING_LEGEND,
    MANY_CALLERS_LEGEND,
    STREAM_LEGEND,
    by_value_goal_line,
    crash_lines,
    extra_lines,
    many_callers_cell,
    many_callers_title,
    model_rows,
    pool_size_legend,
    pool_size_lines,
    transport_lines,
)

__all__ = ["SECTIONS", "write_report"]

#: The report's sections: ``id`` -> heading, in order.
SECTIONS = {
    "summary": "Summary",
    "many-callers": "Many callers, 1 row each",
    "crashes": "Triton crashes",
    "recommendations": "Recommendations",
    "request-rate": "Open loop: request rates",
    "goals": "Goals",
    "runs": "Every run",
    "configuration": "Configuration and machine",
}

_STYLE = """
:root { color-scheme: light dark; --line: #8884; --muted: #888; }
body { font: 15px/1.5 system-ui, sans-serif; margin: 0; }
p, li, pre, figcaption { overflow-wrap: anywhere; }
main { max-width: 1200px; margin: 0 auto; padding: 1rem; }
h1 { font-size: 1.6rem; margin: 0.2rem 0; }
h2 { border-bottom: 1px solid var(--line); margin-top: 2.2rem; }
nav { display: flex; flex-wrap: wrap; gap: 0.2rem 1rem; }
nav a { white-space: nowrap; }
figure { margin: 1rem 0; }
img { max-width: 100%; height: auto; display: block; }
figcaption, .muted { color: var(--muted); font-size: 0.9rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1rem; }
th, td { padding: 0.2rem 0.6rem; border-bottom: 1px solid var(--line); text-align: right; }
td:not(.text) { white-space: nowrap; }
th { position: sticky; top: 0; background: Canvas; }
td.text, th.text { text-align: left; }
.met { color: #1a7f37; font-weight: 600; }
.missed { color: #cf222e; font-weight: 600; }
pre { white-space: pre-wrap; font-size: 0.8rem; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], text: Sequence[int] = (0,)
) -> str:
    """A table in a horizontally scrolling box; the columns ``text`` to the left."""

    def cell(tag: str, index: int, value: Any) -> str:
        left = ' class="text"' if index in text else ""
        return f"<{tag}{left}>{value}</{tag}>"

    head = "".join(cell("th", i, _e(h)) for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table}</div>'


def _figure(path: Path | None, alt: str, caption: str = "") -> str:
    if path is None or not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    caption = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f'<figure><img src="data:image/png;base64,{data}" alt="{_e(alt)}">{caption}</figure>'


def _status(met: bool | None) -> str:
    if met is None:
        return '<span class="muted">n/a</span>'
    return '<span class="met">met</span>' if met else '<span class="missed">MISSED</span>'


def _sustained(held: bool | None) -> str:
    if held is None:
        return "-"
    return '<span class="met">yes</span>' if held else '<span class="missed">no</span>'


def _summary(results: BenchResults, figure: Path | None) -> str:
    table = summary(results)
    bound = results.config.latency_bound_ms
    rows = []
    for model in results.models:
        cells = table.get(model.name, [])
        best = best_cell(cells)
        rec = model.recommendation(bound)
        advice = rec[POOL_SIZE_FOR_THROUGHPUT] if rec else None
        rows.append(
            (
                _e(model.name),
                str(model.case.batch_size) if model.case else "-",
                _e(f"{best.choice.name} ({best.choice.api})") if best else "-",
                _e(speedup_text(best)),
                _e(ceiling_text(best)),
                _e(best.where) if best else "-",
                "-" if advice is None else str(advice["pool_size"]),
            )
        )
    text = (
        "Each cell: the MB/s of the choice over plain gRPC's, in the same set-up (the same "
        "callers, the same Serve app or Ray Data job, only the client differing). "
        f"{LOADS[0].capitalize()}: one caller at a time; {LOADS[1]}: the most callers each "
        "choice ran with (for Ray tasks, 16 callers on ShmModel's default pool, which follows "
        "its load)."
    )
    streaming = any(model.case is not None and model.case.streaming for model in results.models)
    streams = f" {STREAM_LEGEND}" if streaming else ""
    verdict_rows = [
        (
            _e(model),
            _e(f"{cell.choice.name} ({cell.choice.api})"),
            str(cell.callers),
            f'<span class="{_VERDICT_CLASS.get(cell.verdict or "", "")}">{_e(cell.verdict)}</span>',
            _e(speedup_text(cell)),
            _e(ceiling_text(cell)),
            _e(cell.where),
        )
        for model, cells in verdicts(results).items()
        for cell in cells
    ]
    return (
        _figure(figure, "speed-up over plain gRPC per model and choice", text)
        + _table(
            (
                "model",
                "samples/request",
                "fastest choice",
                "speed-up",
                "vs perf_analyzer",
                "run",
                POOL_SIZE_FOR_THROUGHPUT,
            ),
            rows,
            (0, 2, 5),
        )
        + "<p>Each choice at each number of callers it ran with, against plain gRPC in the "
        "same set-up: faster or slower only where every round says so, else no measurable "
        f"difference. {_e(CEILING_LEGEND)} {_e(pool_size_legend(bound))}{_e(streams)}</p>"
        + _table(
            ("model", "choice", "callers", "verdict", "speed-up", "vs perf_analyzer", "run"),
            verdict_rows,
            (0, 1, 3, 6),
        )
        + "".join(
            f"<p>{_e(line)}</p>"
            for line in (*transport_lines(results), by_value_goal_line(results))
            if line
        )
    )


def _many_callers(results: BenchResults) -> str:
    """The many-callers case: per model, a row per choice, a cell per number of callers."""
    tables = many_callers(results)
    if not tables:
        return (
            "<p class=muted>Not run: <code>--ray</code> runs it on identity-1 and classifier-1 "
            "(<code>--many-callers</code>, <code>--many-callers-models</code>).</p>"
        )
    by_name = {model.name: model for model in results.models}
    parts = [f"<p>{_e(MANY_CALLERS_LEGEND)}</p>"]
    for name, (levels, rows) in tables.items():
        headers = ("choice", "path", *(f"{n} caller{'s' * (n != 1)}" for n in levels))
        body = [
            (_e(row.choice), _e(row.path), *(_e(many_callers_cell(run)) for run in row.runs))
            for row in rows
        ]
        parts.append(
            f"<h3>{_e(many_callers_title(by_name[name]))}</h3>" + _table(headers, body, (0, 1))
        )
    return "".join(parts)


#: How the report marks a verdict.
_VERDICT_CLASS = {"faster": "met", "slower": "missed"}


def _recommendations(results: BenchResults) -> str:
    items = []
    bound = results.config.latency_bound_ms
    table = summary(results)
    for model in results.models:
        lines = pool_size_lines(model, bound)
        if not lines:
            items.append(f"<li><b>{_e(model.name)}</b>: no shared-memory run posted numbers</li>")
            continue
        text = f"<b>{_e(model.name)}</b>:<br>" + "<br>".join(f"{_e(line)}." for line in lines)
        best = best_cell(table.get(model.name, []))
        said = verdict(model.name, best)
        if said is not None:
            sentence = said.partition(": ")[2]
            text += f"<br>{_e(sentence[:1].upper() + sentence[1:])}."
        elif best is not None:
            text += (
                f"<br>Fastest against its gRPC twin: {_e(best.choice.name)} "
                f"({_e(best.choice.api)}), {num(best.speedup, 'x')}."
            )
        items.append(f"<li>{text}</li>")
    return (
        "<p>A pool needs no pool_size by default: a pool registered without it follows its "
        f"load. {_e(pool_size_legend(bound))}</p><ul>{''.join(items)}</ul>"
    )


def _bound_text(bound: float | None) -> str:
    return f" with p99 under {bound:g} ms" if bound is not None else ""


def _rates(results: BenchResults) -> str:
    cfg, bound = results.config, results.config.latency_bound_ms
    models = [m for m in results.models if m.rate_runs]
    if not models:
        return (
            "<p class=muted>Not run: <code>--request-rate R [R ...]</code> sends open-loop "
            "arrivals at each rate, to gRPC, the core client and ShmModel.</p>"
        )
    parts = [
        f"<p>Arrivals {_e(cfg.arrivals)}, at most {cfg.max_threads} requests in flight per "
        f"path; latency from each request's intended send time. Sustained: nothing dropped, "
        f"answers at 90% of the offered rate or more{_bound_text(bound)}.</p>"
    ]
    for model in models:
        limits = model.rate_limits(bound)
        best = ", ".join(
            f"{_e(label)} {per_s(rate) if rate else 'none of the rates'}"
            for label, rate in limits.items()
        )
        rows = []
        for r in model.rate_runs:
            numbers = r.numbers()
            latency = numbers.get("latency_ms", {})
            rows.append(
                (
                    _e(r.rate_label),
                    _e(r.rate_spec),
                    per_s(numbers.get("offered_per_s")),
                    per_s(numbers.get("answered_per_s")),
                    *(num(latency.get(p)) for p in ("p50", "p90", "p99")),
                    str(numbers.get("dropped", "-")),
                    "disturbed"
                    if r.disturbed
                    else _sustained(r.sustained(bound))
                    if r.ok
                    else _e(r.error or r.skipped or "-"),
                )
            )
        headers = ("path", "rate", "offered/s", "answered/s", "p50 ms", "p90 ms", "p99 ms")
        parts.append(
            f"<h3>{_e(model.name)}</h3><p>Highest rate sustained: {best}.</p>"
            + _table((*headers, "dropped", "sustained"), rows, (0, 1))
        )
    return "".join(parts)


def _crashes(results: BenchResults) -> str:
    """Every crash of Triton, with the runs it disturbed and its log's last lines."""
    if not results.outages and not results.stopped:
        return "<p class=muted>Triton did not crash while the bench ran.</p>"
    parts = [
        "<p>The embedded Triton is restarted when it crashes (its Python backend can abort "
        "under concurrent requests of a few MB: triton-inference-server/server issue 8882); "
        "a run it disturbed keeps its numbers, but they count for no verdict, goal or "
        "advice.</p>",
        "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in crash_lines(results)) + "</ul>",
    ]
    for outage in results.outages:
        if outage.crash is not None:
            parts.append(
                f"<h3>{_e(outage.crash.describe())}</h3><p class=muted>"
                f"{_e(outage.crash.log_path)}, its last lines:</p>"
                f"<pre>{_e(outage.crash.log_tail)}</pre>"
            )
    return "".join(parts)


def _goals(results: BenchResults) -> str:
    goals = results.goals()
    if not goals:
        return "<p class=muted>No goal applies to the models and paths run.</p>"
    missed = sum(goal.met(value) is False for goal, value in goals)
    rows = [
        (
            _status(goal.met(value)),
            _e(goal.model),
            _e(goal.description),
            num(value, "x" if goal.baseline else ""),
        )
        for goal, value in goals
    ]
    head = f"<p>{len(goals) - missed} met, {missed} missed.</p>"
    return head + _table(("", "model", "goal", "measured"), rows, (0, 1, 2))


def _runs(results: BenchResults, figures: dict[str, Path]) -> str:
    parts = []
    for model in results.models:
        parts.append(f"<h3 id='model-{_e(model.name)}'>{_e(model.name)}</h3>")
        if model.error:
            parts.append(f"<p class=missed>FAILED: {_e(model.error)}</p>")
            continue
        crowded = any(r.ok and r.slots and r.concurrency > r.slots for r in model.runs)
        elastic = any(r.ok and "pool_sizes" in r.extra for r in model.runs)
        parts.append(
            _figure(
                figures.get(model.name),
                f"{model.name}: throughput against p99 latency",
                "Throughput against p99 latency, a point per concurrency level (up and to the "
                "left is better)"
                + ("; hollow points: more callers than slots" if crowded else "")
                + ("; stars: the elastic pool, its size over time beside" if elastic else "")
                + ".",
            )
        )
        title, headers, rows = model_rows(model)
        left = (0, len(headers) - 2, len(headers) - 1)  # the run, its transport and check
        parts.append(f"<p>{_e(title)}</p>" + _table(headers, _escaped(rows), left))
    lines = extra_lines(results)
    if lines:
        parts.append(
            "<h3>The node under load, churn, Serve over HTTP, a model updated</h3>"
            f"<pre>{_e(lines)}</pre>"
        )
    return "".join(parts)


def _escaped(rows: Iterable[Sequence[Any]]) -> list[list[str]]:
    return [[_e(value) for value in row] for row in rows]


def _configuration(results: BenchResults) -> str:
    import dataclasses
    import os

    config = dataclasses.asdict(results.config)
    rows = [(_e(key), _e(value)) for key, value in config.items()]
    host = host_info()
    rows += [(_e(key), _e(value)) for key, value in host.items()]
    rows += [("server", _e(results.server)), ("duration", num(results.duration_s, " s"))]
    rows += [("written", _e(time.strftime("%Y-%m-%d %H:%M:%S %Z")))]
    rows += [("cwd", _e(os.getcwd()))]
    return _table(("setting", "value"), rows, (0, 1))


def write_report(
    results: BenchResults,
    path: str | Path,
    *,
    summary_figure: Path | None = None,
    curves: dict[str, Path] | None = None,
) -> Path:
    """Writes the report to ``path``, embedding the PNGs given (the summary figure, and
    each model's curves by model name); returns the path written."""
    goals = results.goals()
    missed = sum(goal.met(value) is False for goal, value in goals)
    met = sum(goal.met(value) is True for goal, value in goals)
    failures = "".join(f"<li>{_e(f)}</li>" for f in results.failures)
    bodies = {
        "summary": _summary(results, summary_figure),
        "many-callers": _many_callers(results),
        "crashes": _crashes(results),
        "recommendations": _recommendations(results),
        "request-rate": _rates(results),
        "goals": _goals(results),
        "runs": _runs(results, curves or {}),
        "configuration": _configuration(results),
    }
    nav = "".join(f'<a href="#{key}">{_e(title)}</a>' for key, title in SECTIONS.items())
    sections = "".join(
        f'<section id="{key}"><h2>{_e(SECTIONS[key])}</h2>{body}</section>'
        for key, body in bodies.items()
    )
    models = ", ".join(m.name for m in results.models)
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>ray-triton-shm bench: {_e(models)}</title><style>{_STYLE}</style></head>"
        f"<body><main><header><h1>ray-triton-shm bench</h1>"
        f'<p class="muted">{_e(models)} on {_e(results.server)} Triton; '
        f"{num(results.duration_s)} s; goals: {met} met, {missed} missed.</p>"
        + (f'<p class="missed">Stopped early: {_e(results.stopped)}</p>' if results.stopped else "")
        + (f'<ul class="missed">{failures}</ul>' if failures else "")
        + f"<nav>{nav}</nav></header>{sections}</main></body></html>\n"
    )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target
