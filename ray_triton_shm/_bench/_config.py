"""What a benchmark run does: the ``bench`` options, their defaults and the run configuration.

This module imports nothing heavy (no numpy, tritonclient or Ray), so that defining the
``bench`` subcommand costs ``ray-triton-shm --help`` nothing. The names below are those of
the cases and paths in :mod:`~ray_triton_shm._bench._cases`,
:mod:`~ray_triton_shm._bench._paths` and :mod:`~ray_triton_shm._bench._ray_paths`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CASE_NAMES",
    "DEFAULT_PATHS",
    "DEFAULT_PLOT_PATH",
    "DEFAULT_RAY_CALLERS",
    "EXIT_GOALS_MISSED",
    "RAY_PATHS",
    "BenchConfig",
    "add_arguments",
    "config_from_args",
]

#: The cases (``--models``), in table order.
CASE_NAMES: tuple[str, ...] = (
    "identity",
    "classifier-1",
    "classifier",
    "my_model",
    "large_image",
    "upper-short",
    "upper-long",
)
#: Paths in the default run, in table order.
DEFAULT_PATHS: tuple[str, ...] = ("grpc", "http", "shm-manual", "shm-client", "memcpy")
#: The Ray paths (``--ray``), in table order.
RAY_PATHS: tuple[str, ...] = (
    "serve-grpc",
    "serve-shm",
    "serve-inproc",
    "data-grpc",
    "data-shm",
    "data-noop",
)
#: Concurrent callers per Ray path unless ``--ray-callers`` says otherwise.
DEFAULT_RAY_CALLERS = 4
DEFAULT_PLOT_PATH = "bench-results/bench.png"
#: Exit status when ``--check-goals`` is given and a goal is missed.
EXIT_GOALS_MISSED = 3

_QUICK = {"rounds": 2, "slice_s": 0.1, "warmup_requests": 1, "node_load_s": 1.0}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to run.

    Attributes:
        models: Case names (``CASE_NAMES``), in order.
        paths: Path names (``DEFAULT_PATHS``, ``RAY_PATHS``), in table order.
        rounds: Interleaved rounds; in each, every path runs one time slice.
        slice_s: Length of one time slice (at least one request is always sent).
        warmup_requests: Untimed requests per path before the rounds (the first is checked).
        url: gRPC endpoint of an existing server; ``None`` starts the embedded server.
        http_url: HTTP endpoint of that server (``None`` skips the HTTP path).
        startup_timeout_s: How long to wait for the embedded server.
        ray_callers: Concurrent callers driving each Ray path (``bench --ray``).
        node_load_s: Length of each node-load run (``bench --ray``; ``0`` skips them).
    """

    models: tuple[str, ...] = CASE_NAMES
    paths: tuple[str, ...] = DEFAULT_PATHS
    rounds: int = 6
    slice_s: float = 0.6
    warmup_requests: int = 2
    url: str | None = None
    http_url: str | None = None
    startup_timeout_s: float = 180.0
    ray_callers: int = DEFAULT_RAY_CALLERS
    node_load_s: float = 10.0


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
        default=BenchConfig.startup_timeout_s,
        metavar="S",
        help="how long to wait for the embedded server (default: %(default)s)",
    )
    what = parser.add_argument_group("what to run")
    what.add_argument(
        "--models",
        nargs="+",
        metavar="MODEL",
        help=f"models to run (default: all: {', '.join(CASE_NAMES)})",
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
        "--node-load-s",
        type=float,
        metavar="S",
        help="length of each node-load run of --ray: 4 and 16 caller processes on 4 node "
        f"slots, and 16 plain gRPC callers (default: {BenchConfig.node_load_s}; --quick: "
        f"{_QUICK['node_load_s']}; 0 skips them)",
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
    models = _names(args.models) or list(CASE_NAMES)
    unknown = [m for m in models if m not in CASE_NAMES]
    if unknown:
        raise ValueError(
            f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(CASE_NAMES)}"
        )
    known = (*DEFAULT_PATHS, *RAY_PATHS)
    paths = _names(args.paths) or [*DEFAULT_PATHS, *(RAY_PATHS if args.ray else ())]
    unknown = [p for p in paths if p not in known]
    if unknown:
        raise ValueError(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    base: dict[str, Any] = dict(_QUICK) if args.quick else {}
    for key in ("rounds", "slice_s", "warmup_requests", "node_load_s"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    config = BenchConfig(
        models=tuple(dict.fromkeys(models)),
        paths=tuple(dict.fromkeys(paths)),
        url=args.url,
        http_url=args.http_url,
        startup_timeout_s=args.startup_timeout_s,
        ray_callers=args.ray_callers,
        **base,
    )
    if config.rounds < 1:
        raise ValueError("--rounds must be at least 1")
    if config.slice_s <= 0:
        raise ValueError("--slice-s must be positive")
    if config.warmup_requests < 1:
        raise ValueError("--warmup must be at least 1 (the first request is checked)")
    if config.node_load_s < 0:
        raise ValueError("--node-load-s must not be negative")
    if config.ray_callers < 1:
        raise ValueError("--ray-callers must be at least 1")
    if args.http_url and not args.url:
        raise ValueError("--http-url needs --url")
    return config
