"""Presenting results: the tables and goals (with rich), JSON and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ray_triton_shm._bench._runner import RAY_RATIOS, BenchResults, ModelResult

__all__ = ["make_console", "num", "print_results", "write_json", "write_plot"]

#: The line width when the output is not a terminal (a log keeps long notes on one line).
_PLAIN_WIDTH = 1000
_GOAL_STATUS = {True: ("MET", "green"), False: ("MISS", "bold red"), None: ("n/a", "dim")}


def num(value: float | None, suffix: str = "") -> str:
    """``value`` with about three significant digits, then ``suffix``; ``"-"`` for ``None``.

    From 100 on, whole numbers grouped by thousands (``"1,758"``); from 1e5 on, in
    exponent form.
    """
    if value is None:
        return "-"
    # The bounds are where rounding moves a value up a band (9.996 is "10.0", not "10.00").
    magnitude = abs(value)
    if value == 0:
        text = "0"
    elif magnitude >= 99_999.5:
        text = f"{value:.3g}"
    elif magnitude >= 99.95:
        text = f"{value:,.0f}"
    elif magnitude >= 9.995:
        text = f"{value:.1f}"
    elif magnitude >= 0.9995:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3g}"
    return text + suffix


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): styled on a terminal, plain text elsewhere."""
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console.width = _PLAIN_WIDTH
    return console


def _table() -> Table:
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)


def _check(model: ModelResult, name: str) -> Text:
    r = model.paths[name]
    if r.skipped is not None:
        return Text(f"skipped: {r.skipped}", style="dim")
    if r.error is not None:
        return Text(f"FAILED: {r.error}", style="bold red")
    return Text("ok" if r.verified else "unverified")


def _results_table(results: BenchResults) -> Table:
    """One row per model and path.

    ``vs gRPC`` is the path's input MB/s over plain gRPC's; ``CPU/floor`` its client CPU
    seconds per GB over the memcpy floor's.
    """
    table = _table()
    # On a terminal too narrow for it, cells fold rather than lose characters.
    table.add_column("model", overflow="fold")
    table.add_column("path", overflow="fold")
    for header in ("MB/s", "req/s", "CPU s/GB", "vs gRPC", "CPU/floor", "requests"):
        table.add_column(header, justify="right", overflow="fold")
    table.add_column("check", overflow="fold")
    for model in results.models:
        for i, (name, r) in enumerate(model.paths.items()):
            vs_grpc = model.mbps_vs(name, "grpc") if name != "grpc" else None
            vs_floor = model.cpu_vs(name, "memcpy") if name != "memcpy" else None
            table.add_row(
                model.case.name,
                name,
                num(r.mb_per_s),
                num(r.requests_per_s),
                num(r.cpu_s_per_gb),
                num(vs_grpc, "x"),
                num(vs_floor, "x"),
                str(r.requests),
                _check(model, name),
                end_section=i == len(model.paths) - 1,
            )
    return table


def _ray_table(results: BenchResults) -> Table | None:
    """The Ray paths' MB/s ratios per model; ``None`` when the run had no Ray paths."""
    pairs = [
        (path, base)
        for path, base in RAY_RATIOS
        if any(path in m.paths and base in m.paths for m in results.models)
    ]
    if not pairs:
        return None
    table = _table()
    table.add_column("model")
    for path, base in pairs:
        table.add_column(f"{path} / {base}", justify="right")
    for m in results.models:
        table.add_row(m.case.name, *(num(m.mbps_vs(path, base), "x") for path, base in pairs))
    return table


def _node_load_table(results: BenchResults) -> Table | None:
    """One row per node-load run; ``None`` when there were none."""
    runs = [run for m in results.models for run in m.node_load]
    if not runs:
        return None
    table = _table()
    table.add_column("model")
    table.add_column("path")
    for header in ("callers", "slots", "req/s", "p50 ms", "p99 ms", "fairness", "wait p99 ms"):
        table.add_column(header, justify="right")
    for i, run in enumerate(runs):
        last = i == len(runs) - 1 or runs[i + 1].model != run.model
        table.add_row(
            run.model,
            run.path,
            str(run.callers),
            "-" if run.slots is None else str(run.slots),
            num(run.requests_per_s),
            num(run.p50_ms),
            num(run.p99_ms),
            num(run.fairness),
            num(run.wait_p99_ms),
            end_section=last,
        )
    return table


def _goals_table(results: BenchResults) -> Table:
    """One row per goal: met, missed or not measured."""
    table = _table()
    for header in ("", "model", "goal", "measured"):
        table.add_column(header)
    for g in results.goals():
        status, style = _GOAL_STATUS[g.met]
        unit = " us" if g.goal.kind == "actor_cpu_us" else "x"
        value = "not measured" if g.value is None else f"got {num(g.value, unit)}"
        table.add_row(Text(status, style=style), g.goal.model, g.goal.description, value)
    return table


def print_results(results: BenchResults, console: Console) -> None:
    """Print the results table, the Ray paths' ratios (if any) and the goals."""
    if console.is_terminal:
        _print_results(results, console)
        return
    with console.capture() as captured:  # a log gets no padding at the ends of its lines
        _print_results(results, console)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def _print_results(results: BenchResults, console: Console) -> None:
    cfg = results.config
    console.print(_results_table(results))
    console.print(
        f"MB = 1e6 bytes of input, GB = 1e9; CPU = client process CPU time (all threads). "
        f"{cfg.rounds} interleaved rounds x {num(cfg.slice_s)} s per path; server: "
        f"{results.server}; total {num(results.duration_s)} s.",
        markup=False,
    )
    ray_table = _ray_table(results)
    if ray_table is not None:
        callers = cfg.ray_callers
        console.print()
        console.print(
            f"Ray paths (MB/s ratios of the same topology; Serve: one replica fed by {callers} "
            f"caller actors; Ray Data: the same job with {callers} predictor actors):",
            markup=False,
        )
        console.print(ray_table)
        actor = [
            f"{m.case.name} {name} {num(cpu, ' us')}"
            for m in results.models
            for name, r in m.paths.items()
            if (cpu := r.side_cpu_us_per_request) is not None
        ]
        if actor:
            console.print(
                "node actor CPU per request (all its threads): " + ", ".join(actor), markup=False
            )
    node_table = _node_load_table(results)
    if node_table is not None:
        console.print()
        console.print(
            f"The node under load: caller processes each looping on one request for "
            f"{num(cfg.node_load_s)} s; shm-model = ShmModel on the model's node slots, grpc = "
            "plain tritonclient.grpc (no limit). fairness = fewest requests a caller completed "
            "over the mean; wait p99 = among requests that waited for a slot:",
            markup=False,
        )
        console.print(node_table)
    console.print()
    console.print("Goals (shm-client = TritonSHMClient.infer_shm, one max batch per call):")
    console.print(_goals_table(results))


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
        ModuleNotFoundError: If matplotlib is not installed (saying how to install it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "matplotlib is not installed; install it with "
            "`pip install 'ray-triton-shm[bench]'` (or `pip install matplotlib`), "
            "or pass --no-plot",
            name="matplotlib",
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
                num(y),
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
            f"{m.case.name}\n(batch {m.case.batch_size}, {num(m.case.input_nbytes / 1e6)} MB in)"
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
