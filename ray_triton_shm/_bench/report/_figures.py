"""The bench's pictures (matplotlib): the summary, and per model throughput against p99
latency, one point per concurrency level, as Triton's Model Analyzer draws it, with the
open-loop runs' p99 against their rate beside it.

Every text sits in its own space: legends go below their panel, titles above, and the
layout engine (``constrained``) keeps them apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ray_triton_shm._bench._config import ELASTIC
from ray_triton_shm._bench._format import num
from ray_triton_shm._bench._results import BenchResults, ModelResult, RunResult, describe_run
from ray_triton_shm._bench._summary import CHOICES, LOADS, summary

__all__ = ["CURVE_GROUPS", "curves_path", "write_curves", "write_figures", "write_summary"]

#: The curves' panels: the paths of each choice, at most six to a panel.
CURVE_GROUPS: dict[str, tuple[str, ...]] = {
    "core (no Ray)": ("grpc", "http", "shm-manual", "shm-client", "pa-shm", "pa-grpc"),
    "Ray tasks": ("grpc-procs", "shm-model", "shm-model-nokill", "shm-model-churn"),
    "Serve": (
        "serve-grpc",
        "serve-shm",
        "serve-inproc",
        "serve-http-grpc",
        "serve-http-shm",
        "serve-http-noop",
    ),
    "Ray Data": ("data-grpc", "data-shm", "data-noop"),
    "node batching": (
        "grpc-procs",
        "shm-model",
        "shm-model-nb",
        "grpc-procs-dynamic",
        "shm-model-dynamic",
        "serve-shm-nb",
    ),
    "node batching, by value": ("grpc-procs-byvalue", "shm-model-byvalue", "shm-model-nb-byvalue"),
    "streams": ("stream-grpc", "stream-client", "stream-async", "pa-stream-shm", "pa-stream"),
    "streams, Ray": ("stream-grpc-procs", "stream-model", "serve-stream-grpc", "serve-stream"),
}
#: Plain gRPC in grey (but on Triton's dynamic batcher) and the ceilings in green (no-op
#: ones, perf_analyzer's: light for pa-grpc), in every panel; the others in turn.
_GREY, _GREEN, _LIGHT_GREEN = "#7f7f7f", "#2ca02c", "#98df8a"
_PALETTE = ("#1f77b4", "#ff7f0e", "#9467bd", "#e377c2", "#8c564b", "#17becf")


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; ``ModuleNotFoundError`` saying how to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:
        message = "matplotlib is missing: pip install 'ray-triton-shm[bench]', or pass --no-plot"
        raise ModuleNotFoundError(message, name="matplotlib") from exc
    return plt


def _colours(names: list[str]) -> dict[str, str]:
    """A colour per series of a panel: gRPC grey, the ceilings green, the rest each its own."""
    others = iter(_PALETTE * 2)
    fixed = {"pa-shm": _GREEN, "pa-grpc": _LIGHT_GREEN}
    fixed |= {"pa-stream-shm": _GREEN, "pa-stream": _LIGHT_GREEN}
    return {
        name: fixed.get(name)
        or (_GREEN if "noop" in name else _GREY if _plain(name) else next(others))
        for name in names
    }


def _plain(name: str) -> bool:
    """Whether the path is plain gRPC, alone (not on Triton's dynamic batcher)."""
    return "grpc" in name and "dynamic" not in name


def _markers() -> Iterator[str]:
    while True:
        yield from "osD^vP"


def write_summary(results: BenchResults, path: str | Path) -> Path | None:
    """The summary figure: per model (rows) and choice (columns), the speed-up over plain
    gRPC in the same set-up, at low load and under load, each cell with its goal; ``None``
    when no model has numbers."""
    table = summary(results)
    if not table:
        return None
    plt = _pyplot()
    from matplotlib.colors import TwoSlopeNorm

    models = list(table)
    top = max([c.speedup or 1.0 for cells in table.values() for c in cells] + [4.0])
    norm = TwoSlopeNorm(vmin=math.log10(0.5), vcenter=0.0, vmax=math.log10(top))
    cmap = plt.get_cmap("RdYlGn")
    height = 2.4 + 0.65 * len(models)  # a cell's four lines: two ratios, each with its goal
    width = max(10.0, 1.6 * len(CHOICES))  # a column: its name and API, 23 characters at most
    fig, axes = plt.subplots(2, 1, figsize=(width, 2 * height), layout="constrained")
    for ax, load in zip(axes, LOADS):
        values = np.full((len(models), len(CHOICES)), np.nan)
        for row, model in enumerate(models):
            for cell in table[model]:
                if cell.load != load:
                    continue
                col = CHOICES.index(cell.choice)
                colour = "black"
                if cell.speedup is not None:
                    values[row, col] = math.log10(max(cell.speedup, 1e-3))
                    red, green, blue, _ = cmap(norm(values[row, col]))
                    dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                    colour = "white" if dark else "black"
                ax.text(
                    col, row, _cell_text(cell), ha="center", va="center", fontsize=8.5, color=colour
                )
        ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto")
        ax.set_facecolor("#eeeeee")
        ax.set_xticks(range(len(CHOICES)), [f"{c.name}\n{c.api}" for c in CHOICES], fontsize=8)
        ax.xaxis.tick_top()
        ax.set_yticks(range(len(models)), models, fontsize=9)
        ax.set_xticks(np.arange(len(CHOICES) + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(len(models) + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="both", length=0)
        ax.set_title(
            "one caller" if load == LOADS[0] else "under load (the most callers run)",
            fontsize=11,
            loc="left",
        )
    streams = [m.name for m in results.models if m.case is not None and m.case.streaming]
    fig.suptitle(
        "How much faster than plain gRPC, in the same set-up (MB/s ratio; green: faster, red: "
        "slower, yellow: about the same;\n'within noise': faster in some rounds, slower in "
        "others; goal in brackets; 'not run': see the terminal's or the report's skipped lines;"
        "\nperf_analyzer: the ratio to the better of Triton's perf_analyzer's runs with as many "
        "callers, the ceiling)"
        + (
            f"\n{', '.join(streams)} (streaming): responses/s over tritonclient's streaming "
            "client's; callers are streams at once"
            if streams
            else ""
        ),
        fontsize=10,
    )
    return _save(fig, plt, path)


def _cell_text(cell: Any) -> str:
    if cell.speedup is None:
        return "not run"
    text = _times(cell.speedup)
    if cell.verdict == "no measurable difference":
        text += " (within noise)"
    if cell.goal is not None:
        mark = "met" if cell.met else "MISSED"
        text += f"\n(>= {cell.goal.target:g}x {mark})"
    if cell.vs_ceiling is not None:
        text += f"\n{_times(cell.vs_ceiling)} perf_analyzer"
        if cell.ceiling_goal is not None:
            mark = "met" if cell.ceiling_met else "MISSED"
            text += f"\n(>= {cell.ceiling_goal.target:g}x {mark})"
    return text


def _times(value: float) -> str:
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def curves_path(path: str | Path, model: str) -> Path:
    """Where the curves of ``model`` go, beside the summary at ``path``."""
    target = Path(path)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
    return target.with_name(f"{target.stem}-{safe}{target.suffix or '.png'}")


def _latency_ms(run: RunResult) -> float:
    return float(run.numbers()["latency_ms"]["p99"])


def write_curves(results: BenchResults, model: ModelResult, path: str | Path) -> Path | None:
    """``model``'s throughput against p99 latency, a panel per group of paths
    (:data:`CURVE_GROUPS`), a line per path through its concurrency levels (fewer slots than
    callers and the elastic pool: points of their own); an elastic pool's size over time;
    and with ``--request-rate``, the open loop's p99 against the rate offered, a line per
    path. ``None`` when the model has no numbers."""
    groups = {
        title: [p for p in paths if any(r.ok and r.path == p for r in model.runs)]
        for title, paths in CURVE_GROUPS.items()
    }
    groups = {title: paths for title, paths in groups.items() if paths}
    rates = [r for r in model.rate_runs if r.ok]
    elastic = [r for r in model.runs if r.ok and r.extra.get("pool_sizes")]
    panels = len(groups) + bool(elastic) + bool(rates)
    if not panels:
        return None
    plt = _pyplot()
    columns = min(3, panels)
    rows = math.ceil(panels / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(5.2 * columns, 4.6 * rows), squeeze=False, layout="constrained"
    )
    flat = list(axes.flat)
    for ax, (title, paths) in zip(flat, groups.items()):
        _plot_throughput(ax, model, title, paths)
    if elastic:
        _plot_pool_sizes(flat[len(groups)], elastic)
    if rates:
        _plot_rates(flat[len(groups) + bool(elastic)], results, rates)
    for ax in flat[panels:]:
        ax.set_visible(False)
    case = model.case
    detail = f" (model {case.model}, {case.batch_size} per request)" if case else ""
    fig.suptitle(f"{model.name}{detail}", fontsize=12)
    return _save(fig, plt, curves_path(path, model.name))


def _plot_throughput(ax: Any, model: ModelResult, title: str, paths: list[str]) -> None:
    """The panel of a group of paths: throughput against p99, a line per path."""
    colours = _colours(paths)
    for name, marker in zip(paths, _markers()):
        runs = sorted(
            (r for r in model.runs if r.ok and r.path == name), key=lambda r: r.concurrency
        )
        # As many slots as callers make the line; fewer slots than callers (the node
        # under load on a fixed pool) and the elastic pool are points of their own.
        series = [("", [r for r in runs if r.slots in (None, r.concurrency)])]
        series += [
            ("elastic" if r.slots == ELASTIC else "crowded", [r])
            for r in runs
            if r.slots not in (None, r.concurrency)
        ]
        for kind, mine in series:
            if not mine:
                continue
            ax.plot(
                [_latency_ms(r) for r in mine],
                [r.numbers()["requests_per_s"] for r in mine],
                marker="*" if kind == "elastic" else marker,
                markersize=11 if kind == "elastic" else 6,
                linestyle=":" if kind else "-",
                color=colours[name],
                fillstyle="none" if kind == "crowded" else "full",
                label=_series_label(name, kind, mine),
            )
    if model.case is not None and model.case.streaming:
        ax.set(xlabel="p99 time to a stream's end (ms)", ylabel="throughput (streams/s)")
    else:
        ax.set(xlabel="p99 latency (ms)", ylabel="throughput (requests/s)")
    _finish(ax, f"{title}: throughput against p99")


def _series_label(name: str, kind: str, runs: list[RunResult]) -> str:
    """The legend of a path's line (``kind`` ``""``: its callers) or point (its set-up)."""
    if kind:
        return describe_run(name, runs[0].concurrency, runs[0].slots)
    who = "stream" if runs[0].case.streaming else "caller"
    if len(runs) > 1:
        return name + f" ({', '.join(str(r.concurrency) for r in runs)} {who}s)"
    return name + f" ({runs[0].concurrency} {who}{'s' * (runs[0].concurrency > 1)})"


def _plot_pool_sizes(ax: Any, elastic: list[RunResult]) -> None:
    """The panel of the elastic pools' sizes over time."""
    for run in elastic:
        seconds, sizes = zip(*run.extra["pool_sizes"])
        label = describe_run(run.path, run.concurrency, run.slots)
        ax.step(seconds, sizes, where="post", color=_PALETTE[0], marker=".", label=label)
    ax.set(xlabel="seconds from its first load (the slices of the runs beside it included)")
    ax.set(ylabel="slots", ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.tick_params(axis="both", labelsize=7)
    ax.set_title("elastic pool: its size over time", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


def _plot_rates(ax: Any, results: BenchResults, rates: list[RunResult]) -> None:
    """The open loop's panel: p99 against the rate offered, a line per path; x where the
    latency bound was not sustained."""
    bound = results.config.latency_bound_ms
    labels = list(dict.fromkeys(r.rate_label for r in rates))
    colours = _colours(labels)
    for label, marker in zip(labels, _markers()):
        mine = sorted((r for r in rates if r.rate_label == label), key=_rate)
        ax.plot(
            [_rate(r) for r in mine],
            [_latency_ms(r) for r in mine],
            marker=marker,
            color=colours[label],
            linestyle="-" if mine[0].path != "shm-model" else "--",
            label=label,
        )
        held = [r for r in mine if not r.sustained(bound)]
        ax.plot(
            [_rate(r) for r in held],
            [_latency_ms(r) for r in held],
            linestyle="none",
            marker="x",
            markersize=11,
            color="#d62728",
        )
    if bound is not None:
        ax.axhline(
            bound,
            color="#d62728",
            linewidth=1,
            linestyle="--",
            label=f"bound {bound:g} ms (x: not sustained)",
        )
    ax.set(xlabel=f"requests/s offered ({results.config.arrivals})", ylabel="p99 latency (ms)")
    _finish(ax, "open loop: p99 against the rate")


def _rate(run: RunResult) -> float:
    return float(run.numbers()["offered_per_s"])


def _finish(ax: Any, title: str) -> None:
    """Log axes with plain numbers, a grid, the title, and the legend below the panel."""
    (x0, y0), (x1, y1) = ax.dataLim.get_points()
    axes = ((ax.xaxis, ax.set_xscale, x0, x1), (ax.yaxis, ax.set_yscale, y0, y1))
    for axis, set_scale, low, high in axes:
        # Log scales for ranges of a factor of 4 or more; within less, a log axis has no tick.
        if low > 0 and high / low >= 4:
            set_scale("log")
            # Over two decades or more, the decades alone: more labels would run together.
            digits = "235" if high / low < 30 else "" if high / low >= 100 else "5"
            axis.set_minor_formatter(lambda v, _, d=digits: num(v) if f"{v:.0e}"[0] in d else "")
        axis.set_major_formatter(lambda value, _: num(value))
    ax.tick_params(axis="both", which="both", labelsize=7)
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def write_figures(results: BenchResults, path: str | Path) -> list[Path]:
    """The summary at ``path``, and each model's curves beside it (:func:`curves_path`);
    returns the files written. Raises ``ModuleNotFoundError``, saying how to install it,
    without matplotlib."""
    _pyplot()
    written = [write_summary(results, path)]
    written += [write_curves(results, model, path) for model in results.models]
    return [p for p in written if p is not None]
