"""The bench's answer in a few numbers: for each model, how much faster each choice a user
makes is than plain gRPC in the same set-up, at low load and under load, beside the goals.

The terminal summary, the summary figure (:mod:`._figures`) and the report (:mod:`._html`)
all read it from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_triton_shm._bench._config import NODE_LOAD, SERVE_HTTP_CLIENTS
from ray_triton_shm._bench._format import num
from ray_triton_shm._bench._runner import (
    GOALS,
    BenchResults,
    Goal,
    ModelResult,
    RunResult,
    describe_run,
    mb_ratio,
    mb_ratio_spread,
)

__all__ = ["CHOICES", "LOADS", "Cell", "Choice", "best_cell", "summary", "verdict"]

#: The two loads of the summary: one caller, and the most callers the choice ran with.
LOADS = ("low load", "under load")
#: A run by ``(path, concurrency, slots)``; ``None`` for a level filled in from the run.
_Key = tuple[str, Any, Any]


@dataclasses.dataclass(frozen=True)
class Choice:
    """A way to use the library, and the plain gRPC set-up it replaces: per load, candidate
    ``(run, baseline)`` pairs, the first that both ran taken (``"max"``: the highest
    ``--concurrency`` level, ``"callers"``: ``--ray-callers``)."""

    name: str
    api: str
    pairs: dict[str, tuple[tuple[_Key, _Key], ...]]


_HTTP_LOW, _HTTP_LOAD = min(SERVE_HTTP_CLIENTS), max(SERVE_HTTP_CLIENTS)
_NODE_SHM, _NODE_GRPC = NODE_LOAD
CHOICES: tuple[Choice, ...] = (
    Choice(
        "core client",
        "TritonSHMClient",
        {
            LOADS[0]: ((("shm-client", 1, 1), ("grpc", 1, None)),),
            LOADS[1]: ((("shm-client", "max", "max"), ("grpc", "max", None)),),
        },
    ),
    Choice(
        "Ray tasks",
        "ShmModel",
        {
            LOADS[0]: ((("shm-model", 1, 1), ("grpc-procs", 1, None)),),
            LOADS[1]: (
                (_NODE_SHM, (_NODE_GRPC[0], _NODE_GRPC[1], None)),
                (("shm-model", "max", "max"), ("grpc-procs", "max", None)),
            ),
        },
    ),
    Choice(
        "Serve (handles)",
        "ShmModel in a replica",
        {LOADS[1]: ((("serve-shm", "callers", None), ("serve-grpc", "callers", None)),)},
    ),
    Choice(
        "Serve over HTTP",
        "the example app",
        {
            LOADS[0]: (
                (("serve-http-shm", _HTTP_LOW, None), ("serve-http-grpc", _HTTP_LOW, None)),
            ),
            LOADS[1]: (
                (("serve-http-shm", _HTTP_LOAD, None), ("serve-http-grpc", _HTTP_LOAD, None)),
            ),
        },
    ),
    Choice(
        "Ray Data",
        "ShmPredictor",
        {LOADS[1]: ((("data-shm", "callers", None), ("data-grpc", "callers", None)),)},
    ),
)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One choice at one load on one model: its run and gRPC's, the speed-up (MB/s over
    gRPC's, ``None``: not measured), and the goal on it, if any, with whether it was met."""

    choice: Choice
    load: str
    run: RunResult | None = None
    baseline: RunResult | None = None
    speedup: float | None = None
    goal: Goal | None = None
    met: bool | None = None
    #: The lowest and highest speed-up of a round (``None``: fewer than two rounds).
    spread: tuple[float, float] | None = None

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


def _resolve(key: _Key, results: BenchResults) -> tuple[str, int | None, int | None]:
    levels = {"max": max(results.config.concurrency), "callers": results.config.ray_callers}
    path, concurrency, slots = key
    return path, levels.get(concurrency, concurrency), levels.get(slots, slots)


def _matches(goal_key: tuple[Any, ...], run: RunResult) -> bool:
    """Whether a goal's ``(path, concurrency, slots)`` (the last two optional) names ``run``."""
    mine = (run.path, run.concurrency, run.slots)
    return all(given == actual for given, actual in zip(goal_key, mine))


def _goal(model: ModelResult, run: RunResult, baseline: RunResult) -> Goal | None:
    for goal in GOALS:
        if goal.model != model.name or goal.metric != "mb_per_s" or not goal.baseline:
            continue
        if _matches(goal.run, run) and _matches(goal.baseline, baseline):
            return goal
    return None


def summary(results: BenchResults) -> dict[str, list[Cell]]:
    """Per model (those with numbers), a cell per choice and load, in :data:`CHOICES` and
    :data:`LOADS` order."""
    table: dict[str, list[Cell]] = {}
    for model in results.models:
        if not any(r.counts for r in model.runs):
            continue
        cells = []
        for choice in CHOICES:
            for load in LOADS:
                cell = Cell(choice, load)
                for run_key, base_key in choice.pairs.get(load, ()):
                    run = model.run(*_resolve(run_key, results))
                    base = model.run(*_resolve(base_key, results))
                    if run is not None and run.counts and base is not None and base.counts:
                        goal = _goal(model, run, base)
                        speedup = mb_ratio(run, base)
                        met = goal.met(speedup) if goal is not None else None
                        spread = mb_ratio_spread(run, base)
                        cell = Cell(choice, load, run, base, speedup, goal, met, spread)
                        break
                cells.append(cell)
        table[model.name] = cells
    return table


def verdict(model: str, best: Cell | None) -> str | None:
    """What the summary says of a model whose fastest choice did not beat plain gRPC in
    every round (``None``: it did, or nothing was measured)."""
    if best is None or best.verdict in (None, "faster"):
        return None
    spread = f", {best.spread_text}" if best.spread_text else ""
    if best.verdict == "slower":
        return (
            f"{model}: no choice beat plain gRPC ({num(best.speedup, 'x')} at best{spread}): "
            "requests this small gain nothing from shared memory here"
        )
    return (
        f"{model}: no measurable difference from plain gRPC: the fastest choice, "
        f"{best.choice.name}, came out at {num(best.speedup, 'x')}{spread}, faster in some "
        "rounds and slower in others; more --rounds tell them apart, if anything does"
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
