"""``ray-triton-shm bench``: does shared memory help a model, and how many slots should it get?

Any model on a running Triton, or the example models on the embedded one, through every path
(:mod:`.paths`) at every ``--concurrency`` level (:mod:`._runner`).
Importing this package loads only the options (:mod:`._config`); the rest loads in :func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ray_triton_shm._bench._config import (
    EXIT_GOALS_MISSED,
    RAY_PATHS,
    RAY_STREAM_PATHS,
    add_arguments,
    config_from_args,
)

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    """Run ``bench`` with parsed arguments; returns the exit status."""
    try:
        config = config_from_args(args)
        from ray_triton_shm._bench._runner import run_bench
        from ray_triton_shm._bench.report import _console, _json
        from ray_triton_shm._slots._memory import CUDA, CUDA_PREVIEW
    except (ValueError, ModuleNotFoundError) as exc:
        extra = "; pip install 'ray-triton-shm[bench]'" if isinstance(exc, ImportError) else ""
        print(f"ray-triton-shm bench: error: {exc}{extra}", file=sys.stderr)
        return 2
    if config.memory == CUDA:
        print(f"note: {CUDA_PREVIEW}", file=sys.stderr)
    ray_address = os.environ.get("RAY_ADDRESS")
    if ray_address and any(p in (*RAY_PATHS, *RAY_STREAM_PATHS) for p in config.paths):
        print(
            f"note: the Ray paths run on a private local Ray, not on RAY_ADDRESS={ray_address}: "
            "they restart the node actor between runs, which would disturb the cluster's own "
            "callers. Run the bench on a node of its own.",
            file=sys.stderr,
        )
    progress = _console.make_progress(
        _console.make_console(stderr=True), enabled=not args.no_progress
    )
    try:
        results = run_bench(config, progress=progress)
    except KeyboardInterrupt:  # while it set up or cleaned up: no results
        print("\ninterrupted; everything was cleaned up", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"ray-triton-shm bench: error: {exc}", file=sys.stderr)
        return 1
    finally:
        progress.stop()
    _console.print_results(results, _console.make_console(), full=args.full)
    if args.json:
        print(f"\nJSON results: {_json.write_json(results, args.json)}", file=sys.stderr)
    summary_png, curves = None, {}
    if not args.no_plot and args.plot:
        try:
            from ray_triton_shm._bench.report import _figures

            written = _figures.write_figures(results, args.plot)
        except ModuleNotFoundError as exc:
            print(f"figures skipped: {exc}", file=sys.stderr)
        else:
            summary_png = Path(args.plot) if Path(args.plot) in written else None
            curves = {
                m.name: path
                for m in results.models
                if (path := _figures.curves_path(args.plot, m.name)) in written
            }
            print(f"figures: {', '.join(map(str, written))}", file=sys.stderr)
    if not args.no_report and args.report:
        from ray_triton_shm._bench.report import _html

        report = _html.write_report(results, args.report, summary_figure=summary_png, curves=curves)
        full = "" if args.full else " (every run's numbers; or --full here)"
        print(f"report: {report}{full}", file=sys.stderr)
    if results.stopped:
        interrupted = results.stopped.startswith("interrupted")
        print(
            f"\n{'interrupted' if interrupted else 'ray-triton-shm bench: error'}: "
            f"{results.stopped}; the report and JSON have what ran before; everything was "
            "cleaned up",
            file=sys.stderr,
        )
        return 130 if interrupted else 1
    if results.failures:
        print("\nfailed:\n  " + "\n  ".join(results.failures), file=sys.stderr)
        return 1
    missed = any(goal.met(value) is False for goal, value in results.goals())
    return EXIT_GOALS_MISSED if args.check_goals and missed else 0
