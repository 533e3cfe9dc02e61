"""The bench's answer in a few numbers: for each model, how much faster each choice a user
makes is than plain gRPC in the same set-up, at every number of callers it ran with
(:func:`verdicts`) and, in short, at low load and under load (:func:`summary`), beside the
goals, and how near it comes to the ceiling: the better of perf_analyzer's runs at as many
callers (:meth:`~._results.ModelResult.ceiling`).

The many-callers case's answer (node batching) is its own: each choice at each number of
callers, in samples per second, latency and rows per Triton request (:func:`many_callers`).

The terminal summary (:mod:`.report._console`), the summary figure (:mod:`.report._figures`),
the report (:mod:`.report._html`) and the JSON (:mod:`.report._json`) all read it from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_triton_shm._bench._config import BY_VALUE, BY_VALUE_SHARE, CEILING_PATHS, ELASTIC
from ray_triton_shm._bench._format import num
from ray_triton_shm._bench._results import (
    CEILING,
    BenchResults,
    Goal,
    ModelResult,
    RunResult,
    describe_run,
    mb_ratio_spread,
    ratio,
)

__all__ = ["CHOICES", "LOADS", "Cell", "Choice", "best_cell", "summary", "verdict"]
__all__ += ["speedup_text", "verdict_lines", "verdict_text", "verdicts", "verdicts_json"]
__all__ += ["BASELINE_WORDS", "ceiling_text"]
__all__ += ["MANY_CALLERS_CHOICES", "ManyCallersRow", "many_callers", "many_callers_json"]

#: The two loads of the summary: one caller, and the most callers the choice ran with.
LOADS = ("low load", "under load")
#: Slots as many as callers, for a run's ``slots`` in :attr:`Choice.runs`.
_AS_MANY = "callers"


@dataclasses.dataclass(frozen=True)
class Choice:
    """A way to use the library, and the plain gRPC set-up it replaces: ``runs``, the
    ``(path, baseline path, slots)`` of its runs, each against the baseline's run at the same
    number of callers; where two fit one caller count, the first (slots ``"callers"``: as
    many as callers, ``None``: any). Its runs are the many-callers case's (``many_callers``)
    or the others'."""

    name: str
    api: str
    runs: tuple[tuple[str, str, Any], ...]
    many_callers: bool = False


#: On a streaming model, each choice's runs are its streams' (``stream-client`` ...), against
#: tritonclient's streaming client in the same set-up, in responses per second.
CHOICES: tuple[Choice, ...] = (
    Choice(
        "core client",
        "TritonSHMClient",
        (("shm-client", "grpc", _AS_MANY), ("stream-client", "stream-grpc", _AS_MANY)),
    ),
    Choice("core client, async", "stream_async", (("stream-async", "stream-grpc", _AS_MANY),)),
    Choice(
        "Ray tasks",
        "ShmModel",
        (
            ("shm-model", "grpc-procs", ELASTIC),
            ("shm-model", "grpc-procs", _AS_MANY),
            ("stream-model", "stream-grpc-procs", _AS_MANY),
        ),
    ),
    Choice(
        "Ray tasks, node batching",
        "ShmModel(node_batching)",
        (("shm-model-nb", "grpc-procs", _AS_MANY),),
        many_callers=True,
    ),
    Choice(
        "Serve (handles)",
        "ShmModel in a replica",
        (("serve-shm", "serve-grpc", None), ("serve-stream", "serve-stream-grpc", None)),
    ),
    Choice(
        "Serve, node batching",
        "ShmModel(node_batching)",
        (("serve-shm-nb", "serve-grpc", None),),
        many_callers=True,
    ),
    Choice("Serve over HTTP", "the example app", (("serve-http-shm", "serve-http-grpc", None),)),
    Choice("Ray Data", "ShmPredictor", (("data-shm", "data-grpc", None),)),
)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One choice at one load on one model: its run and gRPC's, the speed-up (MB/s over
    gRPC's, ``None``: not measured), and the goal on it, if any, with whether it was met
    (``load``: one of :data:`LOADS` in :func:`summary`, ``""`` in :func:`verdicts`); and
    beside them its MB/s over the ceiling's at as many callers (``vs_ceiling``, ``None``:
    no perf_analyzer run there), the ceiling's run, and the goal on that, if any."""

    choice: Choice
    load: str
    run: RunResult | None = None
    baseline: RunResult | None = None
    speedup: float | None = None
    goal: Goal | None = None
    met: bool | None = None
    #: The lowest and highest speed-up of a round (``None``: fewer than two rounds).
    spread: tuple[float, float] | None = None
    ceiling: RunResult | None = None
    vs_ceiling: float | None = None
    ceiling_goal: Goal | None = None
    ceiling_met: bool | None = None

    @property
    def callers(self) -> int | None:
        """The callers at once of its run (``None``: not measured)."""
        return self.run.concurrency if self.run else None

    @property
    def streaming(self) -> bool:
        """Whether its model streams: its callers are streams at once, its speed-up in
        responses per second over tritonclient's streaming client."""
        return self.run is not None and self.run.case.streaming

    @property
    def verdict(self) -> str | None:
        """``"faster"`` or ``"slower"`` than plain gRPC only when every round says so;
        ``"no measurable difference"`` when the rounds' speed-ups fall on both sides of 1x
        (``None``: not measured)."""
        if self.speedup is None:
            return None
        low, high = self.spread or (self.speedup, self.speedup)
        if low > 1:
            return "faster"
        if high < 1:
            return "slower"
        return "no measurable difference"

    @property
    def spread_text(self) -> str:
        """The rounds' spread, e.g. ``"0.93-1.12x over 4 rounds"`` (``""``: none)."""
        if self.spread is None or self.run is None:
            return ""
        low, high = self.spread
        return f"{num(low)}-{num(high)}x over {len(self.run.rounds)} rounds"

    @property
    def where(self) -> str:
        """The run, e.g. ``"shm-model (16 callers, 4 slots)"`` (``""``: not measured)."""
        return describe_run(self.run.path, self.run.concurrency, self.run.slots) if self.run else ""


def _matches(goal_key: tuple[Any, ...], run: RunResult) -> bool:
    """Whether a goal's ``(path, concurrency, slots)`` (the last two optional) names ``run``."""
    mine = (run.path, run.concurrency, run.slots)
    return all(given == actual for given, actual in zip(goal_key, mine))


#: The metric of a cell's speed-up, by whether its model streams: its input MB/s, or its
#: responses per second (of streams all the same length, the same ratio).
_SPEED = {False: "mb_per_s", True: "responses_per_s"}
#: What a cell's speed-up is over, by whether its model streams.
BASELINE_WORDS = {False: "plain gRPC", True: "tritonclient's streaming client"}


#: The metrics of the goals a cell shows: its speed-up's, or one of the same ratio (of runs of
#: one case, samples per second are in proportion to MB per second).
_CELL_METRICS = (*_SPEED.values(), "samples_per_s")


def _goal(model: ModelResult, run: RunResult, baseline: RunResult) -> Goal | None:
    for goal in model.goals():
        if goal.metric not in _CELL_METRICS or not goal.baseline:
            continue
        if _matches(goal.run, run) and _matches(goal.baseline, baseline):
            return goal
    return None


def _ceiling_goal(model: ModelResult, run: RunResult) -> Goal | None:
    """The goal on ``run`` against perf_analyzer at its number of callers, if any."""
    for goal in model.goals():
        if goal.metric not in ("mb_per_s", "samples_per_s") or not goal.baseline:
            continue
        base, callers = goal.baseline[0], goal.baseline[1:2]
        on_ceiling = base in (CEILING, *CEILING_PATHS) and callers in ((), (run.concurrency,))
        if on_ceiling and _matches(goal.run, run):
            return goal
    return None


def _cells(model: ModelResult, choice: Choice) -> list[Cell]:
    """``choice`` on ``model``, a cell per number of callers it ran with (runs that count,
    against a baseline that counts), by callers."""
    cells: dict[int, Cell] = {}
    for path, base_path, slots in choice.runs:
        for run in model.runs:
            if run.path != path or run.concurrency in cells or not run.counts:
                continue
            if run.many_callers != choice.many_callers:
                continue
            if slots is not None and run.slots != (run.concurrency if slots == _AS_MANY else slots):
                continue
            base = _twin(model, base_path, run)
            if base is None or not base.counts:
                continue
            goal = _goal(model, run, base)
            metric = _SPEED[run.case.streaming]
            speedup = ratio(run.numbers().get(metric), base.numbers().get(metric))
            met = goal.met(speedup) if goal is not None else None
            spread = mb_ratio_spread(run, base)
            vs_ceiling, ceiling = model.vs_ceiling(run)
            ceiling_goal = _ceiling_goal(model, run)
            ceiling_met = ceiling_goal.met(ceiling_goal.measure(model)) if ceiling_goal else None
            cells[run.concurrency] = Cell(
                choice, "", run, base, speedup, goal, met, spread,
                ceiling, vs_ceiling, ceiling_goal, ceiling_met,
            )  # fmt: skip
    return [cells[callers] for callers in sorted(cells)]


def _twin(model: ModelResult, path: str, run: RunResult) -> RunResult | None:
    """The run of ``path`` at ``run``'s callers: of the many-callers case's if ``run`` is
    (where it reused one of the others', theirs), else of the others'."""
    mine = [r for r in model.runs if r.path == path and r.concurrency == run.concurrency]
    same = [r for r in mine if r.many_callers == run.many_callers]
    return next(iter(same or mine), None)


def verdicts(results: BenchResults) -> dict[str, list[Cell]]:
    """Per model (those with numbers), a cell per choice and number of callers it ran with,
    in :data:`CHOICES` order, then by callers: the verdict at every load."""
    return {
        model.name: [cell for choice in CHOICES for cell in _cells(model, choice)]
        for model in results.models
        if any(r.counts for r in model.runs)
    }


def summary(results: BenchResults) -> dict[str, list[Cell]]:
    """Per model (those with numbers), a cell per choice and load, in :data:`CHOICES` and
    :data:`LOADS` order: at one caller, and at the most callers the choice ran with."""
    table: dict[str, list[Cell]] = {}
    for name, cells in verdicts(results).items():
        row = []
        for choice in CHOICES:
            mine = [cell for cell in cells if cell.choice == choice]
            one = next((cell for cell in mine if cell.callers == 1), None)
            for load, cell in zip(LOADS, (one, mine[-1] if mine else None)):
                row.append(
                    Cell(choice, load) if cell is None else dataclasses.replace(cell, load=load)
                )
        table[name] = row
    return table


def verdict_text(cell: Cell) -> str:
    """A cell's verdict at its callers, e.g. ``"slower at 1 caller, 0.89x (0.85-0.93x)"``,
    then its ratio to the ceiling where perf_analyzer ran, e.g. ``", 0.62x perf_analyzer
    (pa-shm)"``."""
    who = "stream" if cell.streaming else "caller"
    callers = f"{cell.callers} {who}{'s' * (cell.callers != 1)}"
    text = f"{cell.verdict} at {callers}, {speedup_text(cell)}"
    return text + (f", {ceiling_text(cell)}" if cell.vs_ceiling is not None else "")


def ceiling_text(cell: Cell | None) -> str:
    """A cell's MB/s over the ceiling's, e.g. ``"0.62x perf_analyzer (pa-shm)"`` (``"-"``:
    no perf_analyzer run at its callers)."""
    if cell is None or cell.vs_ceiling is None or cell.ceiling is None:
        return "-"
    return f"{num(cell.vs_ceiling, 'x')} {CEILING} ({cell.ceiling.path})"


def verdict_lines(results: BenchResults) -> list[str]:
    """A line per model and choice: its verdict against plain gRPC at each number of callers
    it ran with, e.g. ``"identity, core client vs plain gRPC: slower at 1 caller, 0.89x
    (0.85-0.93x); faster at 4 callers, 1.30x (1.20-1.40x)"``."""
    lines = []
    for model, cells in verdicts(results).items():
        for choice in CHOICES:
            mine = [cell for cell in cells if cell.choice == choice]
            if mine:
                base = BASELINE_WORDS[mine[0].streaming]
                texts = "; ".join(map(verdict_text, mine))
                lines.append(f"{model}, {choice.name} vs {base}: {texts}")
    return lines


def verdicts_json(results: BenchResults) -> dict[str, list[dict[str, Any]]]:
    """:func:`verdicts` for the JSON: per model, a dict per choice and number of callers."""
    return {
        model: [
            {
                "choice": cell.choice.name,
                "api": cell.choice.api,
                "callers": cell.callers,
                "verdict": cell.verdict,
                "speedup": cell.speedup,
                "spread": list(cell.spread) if cell.spread else None,
                "run": cell.where,
                "baseline": describe_run(cell.baseline.path, cell.baseline.concurrency)
                if cell.baseline
                else None,
                "vs_perf_analyzer": cell.vs_ceiling,
                "perf_analyzer": describe_run(cell.ceiling.path, cell.ceiling.concurrency)
                if cell.ceiling
                else None,
            }
            for cell in cells
        ]
        for model, cells in verdicts(results).items()
    }


def verdict(model: str, best: Cell | None) -> str | None:
    """What the summary says of a model whose fastest choice did not beat plain gRPC in
    every round (``None``: it did, or nothing was measured)."""
    if best is None or best.verdict in (None, "faster"):
        return None
    spread = f", {best.spread_text}" if best.spread_text else ""
    base = BASELINE_WORDS[best.streaming]
    if best.verdict == "slower":
        why = "requests this small gain nothing from shared memory here"
        if best.run is not None and best.run.extra.get("transport") == BY_VALUE:
            why = (
                "by value, the library sends what plain gRPC sends (its goal there: at least "
                f"{BY_VALUE_SHARE:g}x)"
            )
        return (
            f"{model}: no choice beat {base} {best.load} ({num(best.speedup, 'x')} at "
            f"best, {best.where}{spread}): {why}"
        )
    return (
        f"{model}: no measurable difference from {base} {best.load}: the fastest choice, "
        f"{best.choice.name}, came out at {num(best.speedup, 'x')} ({best.where}{spread}), "
        "faster in some rounds and slower in others; more --rounds tell them apart, if "
        "anything does"
    )


def speedup_text(cell: Cell | None) -> str:
    """A cell's speed-up and its rounds' spread, e.g. ``"1.05x (0.93-1.12x)"``."""
    if cell is None or cell.speedup is None:
        return "-"
    if cell.spread is None:
        return num(cell.speedup, "x")
    low, high = cell.spread
    return f"{num(cell.speedup, 'x')} ({num(low)}-{num(high, 'x')})"


def best_cell(cells: list[Cell]) -> Cell | None:
    """The fastest choice under load (at low load if none ran under load)."""
    for load in reversed(LOADS):
        measured = [c for c in cells if c.load == load and c.speedup is not None]
        if measured:
            return max(measured, key=lambda c: c.speedup or 0.0)
    return None


#: The many-callers case's choices, in its table's order: ``(what, path)``; the runs of each
#: path at each number of callers are those of ``_config.MANY_CALLERS`` (with as many slots
#: as callers, where it has slots).
MANY_CALLERS_CHOICES: tuple[tuple[str, str], ...] = (
    ("Ray tasks, node batching", "shm-model-nb"),
    ("Ray tasks, without it", "shm-model"),
    ("plain gRPC in each task", "grpc-procs"),
    ("perf_analyzer, shm", "pa-shm"),
    ("perf_analyzer, gRPC", "pa-grpc"),
    ("Triton's dynamic batcher, plain gRPC", "grpc-procs-dynamic"),
    ("Triton's dynamic batcher, Ray tasks", "shm-model-dynamic"),
    ("Serve handles, node batching", "serve-shm-nb"),
    ("Serve handles, without it", "serve-shm"),
    ("Serve handles, plain gRPC", "serve-grpc"),
    ("by value: Ray tasks, node batching", "shm-model-nb-byvalue"),
    ("by value: Ray tasks, without it", "shm-model-byvalue"),
    ("by value: plain gRPC in each task", "grpc-procs-byvalue"),
)


@dataclasses.dataclass(frozen=True)
class ManyCallersRow:
    """One choice of the many-callers case on one model: its run at each number of callers
    (``None``: not run there, or no numbers)."""

    choice: str
    path: str
    runs: tuple[RunResult | None, ...]


def many_callers(results: BenchResults) -> dict[str, tuple[tuple[int, ...], list[ManyCallersRow]]]:
    """Per model the case ran on, its numbers of callers and a row per choice that ran
    (:data:`MANY_CALLERS_CHOICES`)."""
    config, table = results.config, {}
    for model in results.models:
        levels = config.many_callers_on(model.name)
        rows = []
        for choice, path in MANY_CALLERS_CHOICES:
            runs = tuple(_many_callers_run(model, path, n) for n in levels)
            if any(runs):
                rows.append(ManyCallersRow(choice, path, runs))
        if rows:
            table[model.name] = (levels, rows)
    return table


def _many_callers_run(model: ModelResult, path: str, callers: int) -> RunResult | None:
    """The run of ``path`` with ``callers`` callers (on as many slots, where it has slots),
    if it posted numbers."""
    runs = [r for r in model.runs if r.path == path and r.concurrency == callers and r.ok]
    mine = [r for r in runs if r.slots in (None, callers)]
    return mine[0] if mine else None


def many_callers_json(results: BenchResults) -> dict[str, list[dict[str, Any]]]:
    """:func:`many_callers` for the JSON: per model, a dict per choice and number of callers
    it ran with."""
    out: dict[str, list[dict[str, Any]]] = {}
    for model, (levels, rows) in many_callers(results).items():
        for row in rows:
            for callers, run in zip(levels, row.runs):
                if run is None:
                    continue
                numbers = run.numbers()
                out.setdefault(model, []).append(
                    {"choice": row.choice, "path": row.path, "callers": callers}
                    | {"run": describe_run(run.path, run.concurrency, run.slots)}
                    | {k: numbers.get(k) for k in _MANY_CALLERS_NUMBERS}
                    | {"latency_ms": {p: numbers["latency_ms"][p] for p in ("p50", "p99")}}
                    | {"transport": numbers.get("transport"), "disturbed": run.disturbed}
                )
    return out


#: The numbers of a run the many-callers case's JSON gives.
_MANY_CALLERS_NUMBERS = (
    "samples_per_s",
    "requests_per_s",
    "rows_per_request",
    "rows_per_execution",
)
