"""Presenting results: the text table, the goals, JSON and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

from ray_triton_shm._bench._runner import RAY_RATIOS, BenchResults, ModelResult

__all__ = ["format_goals", "format_table", "write_json", "write_plot", "PlotUnavailableError"]


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def _num(value: float | None, *, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 10 ** (digits + 2):
        return f"{value:.3g}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 1:
        return f"{value:.{max(0, digits - 1 - int(magnitude >= 10))}f}"
    return f"{value:.{digits}g}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _rows(model: ModelResult) -> list[list[str]]:
    rows = []
    for name, r in model.paths.items():
        if r.skipped is not None:
            note = f"skipped: {r.skipped}"
        elif r.error is not None:
            note = f"FAILED: {r.error}"
        else:
            note = "ok" if r.verified else "unverified"
        vs_grpc = model.mbps_vs(name, "grpc") if name != "grpc" else None
        vs_floor = model.cpu_vs(name, "memcpy") if name != "memcpy" else None
        rows.append(
            [
                model.case.name,
                name,
                _num(r.mb_per_s),
                _num(r.requests_per_s),
                _num(r.cpu_s_per_gb),
                _ratio(vs_grpc),
                _ratio(vs_floor),
                str(r.requests),
                note,
            ]
        )
    return rows


def format_table(results: BenchResults) -> str:
    """The results as an aligned text table, one row per model and path.

    ``vs gRPC`` is the path's input MB/s over plain gRPC's; ``CPU/floor`` its client CPU
    seconds per GB over the memcpy floor's.
    """
    header = [
        "model",
        "path",
        "MB/s",
        "req/s",
        "CPU s/GB",
        "vs gRPC",
        "CPU/floor",
        "requests",
        "check",
    ]
    right = {2, 3, 4, 5, 6, 7}
    body: list[list[str] | None] = []
    for model in results.models:
        if body:
            body.append(None)
        body.extend(_rows(model))
    rows = [r for r in body if r is not None]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    widths[-1] = len(header[-1])  # the note column is last and left unpadded

    def fmt(cells: list[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    lines = [fmt(header), fmt(["-" * w for w in widths])]
    for row in body:
        lines.append("" if row is None else fmt(row))
    cfg = results.config
    lines.append("")
    lines.append(
        f"MB = 1e6 bytes of input, GB = 1e9; CPU = client process CPU time (all threads). "
        f"{cfg.rounds} interleaved rounds x {cfg.slice_s:g} s per path; server: "
        f"{results.server}; total {results.duration_s:.0f} s."
    )
    lines.extend(_ray_ratio_lines(results))
    return "\n".join(lines)


def _ray_ratio_lines(results: BenchResults) -> list[str]:
    """The Ray paths' MB/s ratios per model (only when the run had Ray paths)."""
    pairs = [
        (path, base)
        for path, base in RAY_RATIOS
        if any(path in m.paths and base in m.paths for m in results.models)
    ]
    if not pairs:
        return []
    header = ["model", *(f"{path} / {base}" for path, base in pairs)]
    rows = [
        [m.case.name, *(_ratio(m.mbps_vs(path, base)) for path, base in pairs)]
        for m in results.models
    ]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    lines = [
        "",
        f"Ray paths (MB/s ratios of the same topology; Serve: one replica fed by "
        f"{results.config.ray_callers} caller actors; Ray Data: the same job with "
        f"{results.config.ray_callers} predictor actors):",
    ]
    for row in (header, *rows):
        lines.append(
            "  "
            + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
    actor = [
        f"{m.case.name} {name} {cpu:.0f} us"
        for m in results.models
        for name, r in m.paths.items()
        if (cpu := r.side_cpu_us_per_request) is not None
    ]
    if actor:
        lines.append("  node actor CPU per request (all its threads): " + ", ".join(actor))
    return lines


def format_goals(results: BenchResults) -> str:
    """One line per goal: met, missed or not measured."""
    lines = ["Goals (shm-client = TritonSHMClient.infer_shm, one max batch per call):"]
    for g in results.goals():
        status = {True: "MET ", False: "MISS", None: "n/a "}[g.met]
        unit = " us" if g.goal.kind == "actor_cpu_us" else "x"
        value = "not measured" if g.value is None else f"got {g.value:.2f}{unit}"
        lines.append(f"  [{status}] {g.goal.model:<12} {g.goal.description:<46} {value}")
    return "\n".join(lines)


def _short(value: float) -> str:
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return f"{value:.3g}"


def write_json(results: BenchResults, path: str | Path) -> Path:
    """Write the machine-readable results; returns the path written."""
    target = Path(path)
    if target.parent != Path(""):
        target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results.to_dict(), indent=2, sort_keys=False) + "\n")
    return target


def write_plot(results: BenchResults, path: str | Path) -> Path:
    """Write a grouped bar plot of input MB/s per model and path (log scale).

    Raises:
        PlotUnavailableError: If matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            "matplotlib is not installed; install it with "
            "`pip install 'ray-triton-shm[bench]'` (or `pip install matplotlib`), "
            "or pass --no-plot"
        ) from exc

    models = results.models
    path_names = list(dict.fromkeys(n for m in models for n in m.paths))
    target = Path(path)
    if target.parent != Path(""):
        target.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(models) + 2), 4.8))
    width = 0.8 / max(1, len(path_names))
    all_values: list[float] = []
    for j, name in enumerate(path_names):
        xs, ys = [], []
        for i, m in enumerate(models):
            r = m.paths.get(name)
            value = r.mb_per_s if r is not None else None
            if value is not None and value > 0:
                xs.append(i + (j - (len(path_names) - 1) / 2) * width)
                ys.append(value)
        label = name
        if models and name in models[0].paths and models[0].paths[name].label != name:
            label = f"{name}: {models[0].paths[name].label}"
        all_values.extend(ys)
        bars = ax.bar(xs, ys, width=width * 0.95, label=label)
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(
                _short(y),
                (bar.get_x() + bar.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=6,
                rotation=90,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(
        [
            f"{m.case.name}\n(batch {m.case.batch_size}, {m.case.input_nbytes / 1e6:.3g} MB in)"
            for m in models
        ],
        fontsize=8,
    )
    if all_values:  # (a log scale without any value fails)
        ax.set_yscale("log")
        # Room above the tallest bar for its label.
        ax.set_ylim(min(all_values) / 2, max(all_values) * 6)
    ax.set_ylabel("input MB/s (log scale)")
    ax.set_title("ray-triton-shm bench: input throughput per model and path")
    ax.legend(fontsize=7, loc="upper left", framealpha=0.8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target
