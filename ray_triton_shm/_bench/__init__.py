"""``ray-triton-shm bench``: the shm client against plain gRPC, HTTP and hand-written shm.

For each example model, every path runs in interleaved rounds (round-robin, one time slice
per path per round, the order rotating each round), so load from other processes hits all
paths alike. Each path's first request is checked against a plain gRPC reference before
its numbers count. The paths are in :mod:`~ray_triton_shm._bench._paths` and
:mod:`~ray_triton_shm._bench._ray_paths`.

Importing this package loads only the options (:mod:`~ray_triton_shm._bench._config`);
numpy, tritonclient and the rest load when :func:`main` runs.
"""

from __future__ import annotations

import argparse
import sys

from ray_triton_shm._bench._config import EXIT_GOALS_MISSED, add_arguments, config_from_args

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    """Run ``bench`` with parsed arguments; returns the exit status."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"ray-triton-shm bench: error: {exc}", file=sys.stderr)
        return 2
    try:
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
    except ModuleNotFoundError as exc:
        print(
            f"ray-triton-shm bench: error: {exc}; pip install 'ray-triton-shm[bench]'",
            file=sys.stderr,
        )
        return 2
    from ray_triton_shm._bench._report import make_console, print_results, write_json, write_plot
    from ray_triton_shm._bench._runner import run_bench

    stderr = make_console(stderr=True)
    # Drawn on a terminal only: a log gets the results, not a bar drawn line by line.
    progress = Progress(
        "bench",
        BarColumn(),
        "[progress.percentage]{task.percentage:>3.0f}%",
        TimeElapsedColumn(),
        "eta",
        TimeRemainingColumn(),
        TextColumn("{task.description}", markup=False),
        console=stderr,
        auto_refresh=False,
        transient=True,
        disable=args.no_progress or not stderr.is_terminal,
    )
    try:
        with progress:
            results = run_bench(config, progress=progress)
    except KeyboardInterrupt:
        print("\ninterrupted; everything was cleaned up", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"ray-triton-shm bench: error: {exc}", file=sys.stderr)
        return 1

    print_results(results, make_console())
    status = 0
    if args.json:
        written = write_json(results, args.json)
        print(f"\nJSON results: {written}", file=sys.stderr)
    if not args.no_plot and args.plot:
        try:
            written = write_plot(results, args.plot)
            print(f"plot: {written}", file=sys.stderr)
        except ModuleNotFoundError as exc:
            print(f"plot skipped: {exc}", file=sys.stderr)
    if results.failures:
        print("\nfailed paths:\n  " + "\n  ".join(results.failures), file=sys.stderr)
        status = 1
    if args.check_goals and status == 0 and any(g.met is False for g in results.goals()):
        status = EXIT_GOALS_MISSED
    return status
