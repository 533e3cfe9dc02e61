"""The bench in the terminal (with rich): its progress as it runs, then the summary and,
with ``--full``, a table per model, the open loop, the goals and the recommendations; styled
on a terminal, plain text in a log. The wording is :mod:`._text`'s."""

from __future__ import annotations

import time

from rich import box
from rich import progress as bars
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ray_triton_shm._bench._config import DATA_JOB_ROUNDS
from ray_triton_shm._bench._format import num, per_s
from ray_triton_shm._bench._progress import Progress
from ray_triton_shm._bench._results import (
    POOL_SIZE_FOR_THROUGHPUT,
    BenchResults,
    ModelResult,
)
from ray_triton_shm._bench._summary import (
    best_cell,
    ceiling_text,
    many_callers,
    speedup_text,
    summary,
    verdict,
    verdict_lines,
)
from ray_triton_shm._bench.report._text import (
    CEILING_LEGEND,
    MANY_CALLERS_LEGEND,
    STREAM_LEGEND,
    bound_text,
    by_value_goal_line,
    crash_lines,
    elastic_lines,
    extra_lines,
    many_callers_cell,
    many_callers_title,
    model_rows,
    pool_size_legend,
    pool_size_lines,
    rate_text,
    transport_lines,
)

__all__ = ["make_console", "make_progress", "print_results"]

#: The line width when the output is not a terminal (a log keeps long notes on one line).
_PLAIN_WIDTH = 1000
_GOAL_STATUS = {True: ("MET", "green"), False: ("MISS", "bold red"), None: ("n/a", "dim")}
_TEXT_COLUMNS: tuple[str, ...] = ("", "model", "path", "run", "goal", "measured", "check")
_TEXT_COLUMNS += ("rate", "sustained", "fastest choice", "transport", "choice")


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): styled on a terminal, plain text elsewhere."""
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console.width = _PLAIN_WIDTH
    return console


class _Bar(Progress):
    """Rich's progress bar, drawn on updates only (a refresh thread would take CPU from the
    timed slices) and gone when the run is over."""

    def __init__(self, console: Console) -> None:
        self._bar = bars.Progress(
            *bars.Progress.get_default_columns(),
            bars.TimeElapsedColumn(),
            console=console,
            auto_refresh=False,
            transient=True,
        )
        self._task = self._bar.add_task("", total=None)

    def start(self, total: int) -> None:
        self._bar.start()
        self._bar.update(self._task, total=total, refresh=True)

    def stage(self, text: str) -> None:
        self._bar.update(self._task, description=text, refresh=True)

    def advance(self, units: int = 1) -> None:
        self._bar.update(self._task, advance=units, refresh=True)

    def stop(self) -> None:
        self._bar.stop()

    def say(self, text: str) -> None:
        self._bar.console.print(text, markup=False)


class _Lines(Progress):
    """A plain line per stage, after the minutes and seconds since the start."""

    def __init__(self, console: Console) -> None:
        self._console, self._start = console, time.monotonic()

    def stage(self, text: str) -> None:
        minutes, seconds = divmod(int(time.monotonic() - self._start), 60)
        self._console.print(f"bench {minutes:02d}:{seconds:02d} {text}", markup=False)

    def say(self, text: str) -> None:
        self.stage(text)


def make_progress(console: Console, *, enabled: bool = True) -> Progress:
    """The run's progress on ``console``: rich's bar on a terminal, plain lines in a log."""
    if not enabled:
        return Progress()
    return _Bar(console) if console.is_terminal else _Lines(console)


def _table(*headers: str, title: str | None = None) -> Table:
    """A table: numbers to the right, the columns of :data:`_TEXT_COLUMNS` to the left."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.title, table.title_justify = title, "left"
    for header in headers:
        left = header in _TEXT_COLUMNS
        table.add_column(header, justify="left" if left else "right", no_wrap=True)
    return table


def _model_table(model: ModelResult) -> Table:
    """One row per run of ``model``."""
    title, headers, rows = model_rows(model)
    table = _table(*headers, title=title)
    for row in rows:
        check = row[-1]
        style = "bold red" if check.startswith("FAILED") else ""
        style = "dim" if check.startswith(("skipped", "not checked")) else style
        style = "yellow" if check.startswith("disturbed") else style
        table.add_row(*row[:-1], Text(check, style=style))
    return table


def _rate_table(model: ModelResult, bound_ms: float | None) -> Table:
    """One row per open-loop run of ``model``."""
    headers = ("run", "rate", "offered/s", "answered/s", "p50 ms", "p90 ms", "p99 ms")
    table = _table(*headers, "dropped", "sustained", title=f"{model.name}: open loop")
    for r in model.rate_runs:
        numbers = r.numbers()
        latency = numbers.get("latency_ms", {})
        if r.disturbed is not None:
            verdict = Text("disturbed", style="yellow")
        elif r.ok:
            status, style = _GOAL_STATUS[r.sustained(bound_ms)]
            verdict = Text({"MET": "yes", "MISS": "no"}.get(status, status), style=style)
        else:
            verdict = Text(r.error or r.skipped or "-", style="bold red" if r.error else "dim")
        table.add_row(
            r.rate_label,
            r.rate_spec or "",
            per_s(numbers.get("offered_per_s")),
            per_s(numbers.get("answered_per_s")),
            *(num(latency.get(p)) for p in ("p50", "p90", "p99")),
            num(numbers.get("dropped")),
            verdict,
        )
    return table


def _goals_table(results: BenchResults) -> Table | None:
    """One row per goal: met, missed or not measured; ``None`` when no goal applies."""
    table = _table("", "model", "goal", "measured")
    for goal, value in results.goals():
        status, style = _GOAL_STATUS[goal.met(value)]
        unit = "x" if goal.baseline else ""
        measured = "not measured" if value is None else f"got {num(value, unit)}"
        table.add_row(Text(status, style=style), goal.model, goal.description, measured)
    return table if table.row_count else None


def _show(console: Console, table: Table) -> None:
    """Prints ``table`` whole, then a blank line: on a terminal too narrow for it, its lines
    wrap rather than its cells fold."""
    width = console.width
    console.width = max(
        width, console.measure(table, options=console.options.update_width(9999)).maximum
    )
    console.print(table, "")
    console.width = width


def print_results(results: BenchResults, console: Console, *, full: bool = False) -> None:
    """Print the summary: per model, the fastest choice, its speed-up over plain gRPC and
    the pool_size, and the goals missed. ``full``: first a table per model, the open loop,
    the churn, Serve over HTTP and the model update, the goals, and the recommendations."""
    with console.capture() as captured:  # a log gets no padding at the ends of its lines
        if full:
            _print_full(results, console)
        _print_summary(results, console)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def _print_skipped(results: BenchResults, console: Console) -> None:
    """Every path that did not run: a line per reason, with its paths and models."""
    skipped: dict[str, tuple[list[str], list[str]]] = {}
    for model in results.models:
        for run in model.runs:
            if run.skipped:
                paths, models = skipped.setdefault(run.skipped, ([], []))
                paths.extend([run.path] * (run.path not in paths))
                models.extend([model.name] * (model.name not in models))
    for reason, (paths, models) in skipped.items():
        console.print(f"skipped: {', '.join(paths)} on {', '.join(models)}: {reason}", markup=False)


def _streams(results: BenchResults) -> bool:
    """Whether a streaming model ran."""
    return any(model.case is not None and model.case.streaming for model in results.models)


def _print_summary(results: BenchResults, console: Console) -> None:
    table = summary(results)
    bound = results.config.latency_bound_ms
    rows = _table(
        "model", "samples/request", "fastest choice", "speed-up", "vs perf_analyzer", "run",
        POOL_SIZE_FOR_THROUGHPUT, title="Summary",
    )  # fmt: skip
    for model in results.models:
        best = best_cell(table.get(model.name, []))
        rec = model.recommendation(bound)
        advice = rec[POOL_SIZE_FOR_THROUGHPUT] if rec else None
        rows.add_row(
            model.name,
            str(model.case.batch_size) if model.case else "-",
            f"{best.choice.name} ({best.choice.api})" if best else "-",
            speedup_text(best),
            ceiling_text(best),
            best.where if best else (f"FAILED: {model.error}" if model.error else "-"),
            "-" if advice is None else str(advice["pool_size"]),
        )
    console.print(
        "speed-up = MB/s over plain gRPC's in the same set-up, with the most callers each choice "
        "ran with (in brackets: its lowest and highest in a round); below the table, each "
        "choice at each number of callers it ran with: faster or slower only where every round "
        "says so, else no measurable difference. "
        + CEILING_LEGEND
        + " "
        + pool_size_legend(bound)
        + (" " + STREAM_LEGEND if _streams(results) else ""),
        markup=False,
    )
    _show(console, rows)
    for line in verdict_lines(results):
        console.print(line, markup=False)
    _print_many_callers(results, console)
    for line in transport_lines(results):
        console.print(line, markup=False)
    _print_skipped(results, console)
    for line in crash_lines(results):
        console.print(line, markup=False)
    for model in results.models:
        for line in elastic_lines(model):
            console.print(f"{model.name}, {line}", markup=False)
    for model in results.models:
        said = verdict(model.name, best_cell(table.get(model.name, [])))
        if said is not None:
            console.print(said, markup=False)
    for model in results.models:
        rates = rate_text(model.recommendation(bound), bound)
        if rates is not None:
            console.print(f"{model.name}, {rates}", markup=False)
    by_value = by_value_goal_line(results)
    if by_value is not None:
        console.print(by_value, markup=False)
    goals = results.goals()
    missed = [(goal, value) for goal, value in goals if goal.met(value) is False]
    if goals:
        met = sum(goal.met(value) is True for goal, value in goals)
        unmeasured = len(goals) - met - len(missed)
        rest = f", {unmeasured} not measured" if unmeasured else ""
        console.print(f"Goals: {met} met, {len(missed)} missed{rest}.", markup=False)
    for goal, value in missed:
        unit = "x" if goal.baseline else ""
        console.print(
            f"  MISS {goal.model}: {goal.description}, got {num(value, unit)}", markup=False
        )


def _print_many_callers(results: BenchResults, console: Console) -> None:
    """The many-callers case: per model, a row per choice, a cell per number of callers."""
    tables = many_callers(results)
    if not tables:
        return
    console.print("\n" + MANY_CALLERS_LEGEND, markup=False)
    by_name = {model.name: model for model in results.models}
    for name, (levels, rows) in tables.items():
        callers = [f"{n} caller{'s' * (n != 1)}" for n in levels]
        table = _table("choice", "path", *callers, title=many_callers_title(by_name[name]))
        for row in rows:
            table.add_row(row.choice, row.path, *map(many_callers_cell, row.runs))
        _show(console, table)


def _print_full(results: BenchResults, console: Console) -> None:
    cfg = results.config
    for model in results.models:
        if model.error:
            console.print(Text(f"{model.name}: FAILED: {model.error}\n", style="bold red"))
        else:
            _show(console, _model_table(model))
        if model.rate_runs:
            _show(console, _rate_table(model, cfg.latency_bound_ms))
    console.print(
        f"run = path (callers at once; slots where they differ, and always for shm-model; "
        f"elastic pool = no pool_size, the pool follows its load); shm-model = ShmModel, "
        f"grpc-procs = plain gRPC (no limit), in each caller process. MB = 1e6 bytes of input; "
        f"CPU = client CPU time (all its processes and threads); vs gRPC = MB/s over plain "
        f"gRPC's in the same topology; vs PA = MB/s over the better of perf_analyzer's at as "
        f"many callers; pa-shm, pa-grpc = Triton's perf_analyzer, a run of its own per slice, "
        f"timed by it (its latency percentiles per slice, weighted by their requests; its CPU "
        f"not measured); fairness = the fewest requests a caller completed over "
        f"the mean; wait p99 = among requests that waited for a slot. {cfg.rounds} interleaved "
        f"rounds x {num(cfg.slice_s)} s per run (Serve over HTTP by several clients: "
        f"{num(cfg.slice_s * 3)} s; Ray Data: a job of {cfg.data_job_batches} batches in each of "
        f"{min(cfg.rounds, DATA_JOB_ROUNDS)}); Serve and Ray Data: "
        f"{cfg.ray_callers} callers; "
        f"server: {results.server}; total {num(results.duration_s)} s.\n",
        markup=False,
    )
    if any(model.rate_runs for model in results.models):
        console.print(
            f"Open loop: arrivals {cfg.arrivals}, at most {cfg.max_threads} in flight per path; "
            f"latency from each request's intended send time; sustained = nothing dropped and "
            f"answers at 90% of the offered rate or more{bound_text(cfg.latency_bound_ms)}.\n",
            markup=False,
        )
    extra = extra_lines(results)
    if extra:
        console.print(extra + "\n", markup=False)
    goals = _goals_table(results)
    if goals is not None:
        console.print("Goals:")
        _show(console, goals)
    console.print("Recommendation, " + pool_size_legend(cfg.latency_bound_ms), markup=False)
    for model in results.models:
        lines = pool_size_lines(model, cfg.latency_bound_ms) or ["no shm run posted numbers"]
        console.print("\n".join(f"  {model.name}: {line}" for line in lines), markup=False)
    console.print()
