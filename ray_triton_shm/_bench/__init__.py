"""``ray-triton-shm bench``: the shm client against plain gRPC, HTTP and hand-written shm.

For each example model, every path runs in interleaved rounds (round-robin, one time slice
per path per round, the order rotating each round), so load from other processes hits all
paths alike. Each path's first request is checked against a plain gRPC reference before
its numbers count. See :mod:`ray_triton_shm._bench._paths` for the paths and how to add
more.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ray_triton_shm._bench._cases import CASES, ModelCase, TensorSpec
from ray_triton_shm._bench._paths import (
    SHM_KEY_PREFIX,
    BenchPath,
    BenchTarget,
    PathUnavailableError,
    register_path,
    registered_paths,
)
from ray_triton_shm._bench._progress import ProgressBar
from ray_triton_shm._bench._ray_paths import DEFAULT_RAY_CALLERS, RAY_PATHS
from ray_triton_shm._bench._report import (
    PlotUnavailableError,
    format_goals,
    format_table,
    write_json,
    write_plot,
)
from ray_triton_shm._bench._runner import (
    DEFAULT_PATHS,
    GOALS,
    BenchConfig,
    BenchResults,
    run_bench,
)

__all__ = [
    "CASES",
    "DEFAULT_PATHS",
    "DEFAULT_PLOT_PATH",
    "GOALS",
    "SHM_KEY_PREFIX",
    "BenchConfig",
    "BenchPath",
    "BenchResults",
    "BenchTarget",
    "ModelCase",
    "PathUnavailableError",
    "ProgressBar",
    "TensorSpec",
    "add_arguments",
    "main",
    "register_path",
    "registered_paths",
    "run_bench",
]

DEFAULT_PLOT_PATH = "bench-results/bench.png"
_QUICK = {"rounds": 2, "slice_s": 0.1, "warmup_requests": 1}

#: Exit status when ``--check-goals`` is given and a goal is missed.
EXIT_GOALS_MISSED = 3


def _names(values: Sequence[str] | None) -> list[str]:
    """Accept both ``--models a b`` and ``--models a,b``."""
    out: list[str] = []
    for value in values or ():
        out.extend(v for v in value.split(",") if v)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser``."""
    server = parser.add_argument_group("server")
    server.add_argument(
        "--url",
        metavar="HOST:PORT",
        help="gRPC endpoint of a running server on this host (default: start the embedded "
        "server with the example models)",
    )
    server.add_argument(
        "--http-url",
        metavar="HOST:PORT",
        help="HTTP endpoint of that server (without it, the HTTP path is skipped)",
    )
    server.add_argument(
        "--startup-timeout-s",
        type=float,
        default=180.0,
        metavar="S",
        help="how long to wait for the embedded server (default: %(default)s)",
    )
    what = parser.add_argument_group("what to run")
    what.add_argument(
        "--models",
        nargs="+",
        metavar="MODEL",
        help=f"models to run (default: all: {', '.join(CASES)})",
    )
    what.add_argument(
        "--paths",
        nargs="+",
        metavar="PATH",
        help=f"paths to run (default: {', '.join(DEFAULT_PATHS)})",
    )
    what.add_argument(
        "--ray",
        action="store_true",
        help=f"also run the Ray paths ({', '.join(RAY_PATHS)}), interleaved with the others; "
        "starts a private local Ray for the run",
    )
    what.add_argument(
        "--ray-callers",
        type=int,
        metavar="N",
        default=DEFAULT_RAY_CALLERS,
        help="concurrent callers (Ray actors) driving each Ray path (default: %(default)s)",
    )
    what.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help=f"interleaved rounds (default: {BenchConfig.rounds}; --quick: {_QUICK['rounds']})",
    )
    what.add_argument(
        "--slice-s",
        type=float,
        metavar="S",
        help=f"time slice per path per round (default: {BenchConfig.slice_s}; "
        f"--quick: {_QUICK['slice_s']})",
    )
    what.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        dest="warmup_requests",
        help=f"untimed requests per path before the rounds (default: "
        f"{BenchConfig.warmup_requests})",
    )
    what.add_argument(
        "--quick",
        action="store_true",
        help="a short run (for tests and CI); numbers are noisy",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="PATH", help="write machine-readable results here")
    out.add_argument(
        "--plot",
        metavar="PATH",
        default=DEFAULT_PLOT_PATH,
        help="write a PNG bar plot of MB/s here (default: %(default)s)",
    )
    out.add_argument("--no-plot", action="store_true", help="do not write the plot")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    out.add_argument(
        "--check-goals",
        action="store_true",
        help=f"exit with status {EXIT_GOALS_MISSED} if a measured goal is missed",
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build the run configuration from parsed ``bench`` arguments.

    Raises:
        ValueError: With a user-facing message, for invalid combinations.
    """
    models = _names(args.models) or list(CASES)
    unknown = [m for m in models if m not in CASES]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    groups = ("core", "ray") if args.ray else ("core",)
    available = registered_paths(groups=groups)
    paths = _names(args.paths) or [
        *[p for p in DEFAULT_PATHS if p in available],
        *[p for p in available if p not in DEFAULT_PATHS],
    ]
    unknown = [p for p in paths if p not in registered_paths()]
    if unknown:
        raise ValueError(
            f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(available)}"
        )
    base: dict[str, Any] = dict(_QUICK) if args.quick else {}
    for key in ("rounds", "slice_s", "warmup_requests"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    config = BenchConfig(
        models=tuple(dict.fromkeys(models)),
        paths=tuple(dict.fromkeys(paths)),
        url=args.url,
        http_url=args.http_url,
        startup_timeout_s=args.startup_timeout_s,
        ray_callers=getattr(args, "ray_callers", DEFAULT_RAY_CALLERS),
        **base,
    )
    if config.rounds < 1:
        raise ValueError("--rounds must be at least 1")
    if config.slice_s <= 0:
        raise ValueError("--slice-s must be positive")
    if config.warmup_requests < 1:
        raise ValueError("--warmup must be at least 1 (the first request is checked)")
    if config.ray_callers < 1:
        raise ValueError("--ray-callers must be at least 1")
    if args.http_url and not args.url:
        raise ValueError("--http-url needs --url")
    return config


def main(args: argparse.Namespace) -> int:
    """Run ``bench`` with parsed arguments; returns the exit status."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"ray-triton-shm bench: error: {exc}", file=sys.stderr)
        return 2
    bar = ProgressBar(1, enabled=not args.no_progress)
    try:
        with bar:
            results = run_bench(config, progress=bar)
    except KeyboardInterrupt:
        print("\ninterrupted; everything was cleaned up", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"ray-triton-shm bench: error: {exc}", file=sys.stderr)
        return 1

    print(format_table(results))
    print()
    print(format_goals(results))
    status = 0
    if args.json:
        written = write_json(results, args.json)
        print(f"\nJSON results: {written}", file=sys.stderr)
    if not args.no_plot and args.plot:
        try:
            written = write_plot(results, args.plot)
            print(f"plot: {written}", file=sys.stderr)
        except PlotUnavailableError as exc:
            print(f"plot skipped: {exc}", file=sys.stderr)
    if results.failures:
        print("\nfailed paths:\n  " + "\n  ".join(results.failures), file=sys.stderr)
        status = 1
    if args.check_goals and status == 0 and any(g.met is False for g in results.goals()):
        status = EXIT_GOALS_MISSED
    return status
