"""The ``ray-triton-shm`` command line (also ``python -m ray_triton_shm``).

Subcommands:

* ``setup-server``: create the private Triton server environment;
* ``serve-local``: run the embedded Triton server with the example models until Ctrl-C;
* ``bench``: a concurrency sweep of shared memory against plain gRPC (and HTTP, shm by hand,
  Ray), with latency percentiles and a pool-size recommendation, for any model;
* ``doctor``: check a node (``--ray``: every node) for what breaks shared memory at deployment;
* ``status`` / ``reclaim``: show / reclaim shared-memory regions left behind;
* ``grafana``: write the Grafana dashboard of the Ray metrics beside Ray's own dashboards.

Heavy modules are imported only by the subcommand that needs them, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from ray_triton_shm._bench._config import (
    BENCH_OPTIONS,
    Option,
    OptionGroups,
    add_groups,
    add_options,
)
from ray_triton_shm._defaults import DEFAULT_URL

if TYPE_CHECKING:
    from ray_triton_shm._pools._reclaim import ReclaimReport
    from ray_triton_shm._tools._region_status import RegionStatus, StatusReport
    from ray_triton_shm.local._crashes import ServerEvent

__all__ = ["build_parser", "main"]

PROG = "ray-triton-shm"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ray-triton-shm")
    except Exception:
        return "unknown"


@contextlib.contextmanager
def _signal_handlers(handlers: Mapping[signal.Signals, Any]) -> Iterator[None]:
    """Set ``handlers`` for the block, then put back the ones before (in the main thread only:
    ``signal.signal`` raises elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _interrupts_as_keyboard_interrupt() -> contextlib.AbstractContextManager[None]:
    """Make SIGINT and SIGTERM raise ``KeyboardInterrupt`` so the same cleanup runs for both.

    SIGINT is set explicitly because a process started in the background by a
    non-interactive shell inherits it as ignored, and then ``kill -INT`` would do nothing.
    """
    return _signal_handlers(
        {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _raise_keyboard_interrupt}
    )


def _ignore_interrupts() -> contextlib.AbstractContextManager[None]:
    """Ignore SIGINT and SIGTERM for the block."""
    return _signal_handlers(dict.fromkeys((signal.SIGINT, signal.SIGTERM), signal.SIG_IGN))


# --------------------------------------------------------------------------------------
# setup-server
# --------------------------------------------------------------------------------------


def _cmd_setup_server(args: argparse.Namespace) -> int:
    from importlib.metadata import version

    from ray_triton_shm._exceptions import LocalServerError
    from ray_triton_shm.local._install import (
        add_server_packages,
        find_tritonserver,
        server_env_dir,
    )
    from ray_triton_shm.local._perf_analyzer import find_perf_analyzer

    try:
        versions = add_server_packages(args.packages, requirements=args.requirements)
        install = find_tritonserver()
    except LocalServerError as exc:
        print(f"{PROG} setup-server: error: {exc}", file=sys.stderr)
        return 1
    numpy_here = versions.pop("numpy")
    print(f"Triton server environment: {server_env_dir()}")
    print(f"tritonserver ({install.source}): {install.executable}")
    try:
        analyzer = find_perf_analyzer()
        print(f"perf_analyzer ({analyzer.source}, the bench's ceiling): {analyzer.executable}")
    except LocalServerError as exc:
        print(f"perf_analyzer (the bench's ceiling): not here: {exc}")
    for project, installed in versions.items():
        print(f"  {project}: {installed}")
    print(
        f"numpy: {numpy_here} on the server side (Triton's Python backend needs numpy<2), "
        f"{version('numpy')} here. Pickles and .npy files written with numpy 2 may not load "
        "on the server side: save what a model loads with numpy<2, or in a plain format."
    )
    return 0


# --------------------------------------------------------------------------------------
# serve-local
# --------------------------------------------------------------------------------------


def _model_names(grpc_url: str) -> list[str]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        index = client.get_model_repository_index(as_json=True)
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return sorted(
        f"{m['name']}" + (f" ({m['state']})" if m.get("state") not in (None, "READY") else "")
        for m in index.get("models", [])
    )


def _print_server_event(event: ServerEvent) -> None:
    """One line per crash, restart or surrender of the embedded server, as it happens."""
    crash = event.crash
    if event.kind == "crashed":
        print(f"Triton {crash.describe()}; restarting it (log: {crash.log_path})", flush=True)
    elif event.kind == "restarted":
        print(
            f"Triton is back (pid {event.pid}, {crash.down_s or 0.0:.1f} s after crash "
            f"{crash.number}), on the same ports.",
            flush=True,
        )


def _cmd_serve_local(args: argparse.Namespace) -> int:
    from ray_triton_shm.local._server import LocalServerError, LocalTritonServer

    repos = args.model_repository or None
    try:
        server = LocalTritonServer(
            repos,
            log_path=args.log_file,
            host=args.host,
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            metrics_port=args.metrics_port,
            startup_timeout_s=args.startup_timeout_s,
            install=True,  # a command of its own: sets the server side up on first use
            restart_on_crash=not args.no_restart,
            on_event=_print_server_event,
            onnx_via_python=args.onnx_via_python,
        )
    except ValueError as exc:  # a port out of range
        print(f"{PROG} serve-local: error: {exc}", file=sys.stderr)
        return 2
    interrupted = False
    try:
        print("Starting Triton ...", file=sys.stderr, flush=True)
        try:
            server.start()
        except LocalServerError as exc:
            print(f"{PROG} serve-local: error: {exc}", file=sys.stderr)
            return 1
        try:
            models = _model_names(server.grpc_url)
        except Exception as exc:
            models = [f"(could not list the models: {exc})"]
        print(f"Triton is ready (pid {server.pid}).")
        print(f"  gRPC:    {server.grpc_url}")
        print(f"  HTTP:    {server.http_url}")
        print(f"  metrics: {server.metrics_url}")
        kept = (
            " (kept)"
            if args.log_file
            else " (deleted when Triton stops, kept if it crashed: --log-file keeps it)"
        )
        print(f"  log:     {server.log_path}{kept}")
        print(f"  models:  {', '.join(models) if models else '(none)'}")
        restarts = "off" if args.no_restart else "on (a crashed Triton is started again)"
        print(f"  restarts: {restarts}")
        print("Press Ctrl-C to stop.", flush=True)
        while server.is_running or server.is_restarting:
            time.sleep(0.2)
        why = server.failure or f"the server exited unexpectedly (log: {server.log_path})"
        print(f"{PROG} serve-local: error: {why}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nStopping Triton ...", file=sys.stderr, flush=True)
        interrupted = True
        return 0
    finally:
        # A second Ctrl-C must not abort the cleanup half-way.
        with _ignore_interrupts():
            server.close()
        if interrupted:
            print("Stopped.", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------


def _cmd_bench(args: argparse.Namespace) -> int:
    from ray_triton_shm._bench import main as bench_main

    return bench_main(args)


# --------------------------------------------------------------------------------------
# status / reclaim
# --------------------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.1f} {unit}"
    return f"{nbytes} B"


def _yes_no(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _print_status(report: StatusReport) -> int:
    regions = report.regions
    print(f"server: {report.url or '(not asked)'}")
    if regions:
        header = (
            "region",
            "size",
            "owner pid",
            "owner",
            "/dev/shm",
            "registered",
            "transport",
            "layout",
        )
        rows = [
            (
                r.name,
                _size(int(r.size)),
                "-" if r.owner_pid is None else str(r.owner_pid),
                r.owner or "-",
                _yes_no(r.in_dev_shm),
                _yes_no(r.registered),
                r.transport or "-",
                _layout(r),
            )
            for r in regions
        ]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        for row in (header, tuple("-" * w for w in widths), *rows):
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        stale = [r for r in regions if r.owner == "dead"]
        if stale:
            print(
                f"{len(stale)} region(s) belong to processes that are gone; "
                f"`{PROG} reclaim` removes them."
            )
        if any(r.transport == "inline" for r in regions):
            print(
                "regions of transport 'inline' send their tensors by value: they hold a header "
                "alone, and are never registered in Triton."
            )
        if any(r.foreign for r in regions):
            from ray_triton_shm._slots._header import LAYOUT_VERSION

            print(
                f"foreign regions are not of this version's layout (version {LAYOUT_VERSION}): "
                "another ray-triton-shm version made them, or something wrote over them; this "
                "version refuses them. Run one version on the node."
            )
        if any(r.owner == "other namespace" for r in regions):
            print(
                "regions of 'other namespace' belong to processes of another pid namespace "
                "(container) that shares /dev/shm; they are left alone."
            )
    else:
        print("no regions")
    return _report_server_error(report)


def _layout(region: RegionStatus) -> str:
    if region.foreign:
        found = "no stamp" if region.layout_version is None else f"v{region.layout_version}"
        return f"foreign ({found})"
    return "-" if region.layout_version is None else f"v{region.layout_version}"


def _print_reclaim(report: ReclaimReport) -> int:
    for label, names in (
        ("unregistered from Triton", report.unregistered),
        ("unlinked from /dev/shm", report.unlinked),
        ("foreign, left alone (another version's, or written over)", report.foreign),
    ):
        print(f"{label}: {len(names)}")
        for name in names:
            print(f"  {name}")
    return _report_server_error(report)


def _report_server_error(report: StatusReport | ReclaimReport) -> int:
    if report.server_error:
        print(f"{PROG}: the server could not be asked: {report.server_error}", file=sys.stderr)
        return 1
    return 0


def _print_node_actors(address: str | None, *, timeout_s: float) -> int:
    try:
        from ray_triton_shm.ray._actor import NAMESPACE
        from ray_triton_shm.ray._status import format_node_actors, node_actor_reports

        reports = node_actor_reports(address, timeout_s=timeout_s)
    except ImportError as exc:
        print(f"{PROG} status: error: Ray is not installed ({exc})", file=sys.stderr)
        return 1
    except ConnectionError as exc:
        print(
            f"{PROG} status: error: no Ray cluster at {address or 'auto'}: {exc}", file=sys.stderr
        )
        return 1
    text, unasked = format_node_actors(reports, NAMESPACE)
    print(text)
    return int(unasked)


def _cmd_status(args: argparse.Namespace) -> int:
    from ray_triton_shm._tools import _region_status

    status = 0
    if args.ray or args.address:
        status = _print_node_actors(args.address, timeout_s=args.timeout_s)
        print()
    return max(
        status, _print_status(_region_status.region_status(url=None if args.local else args.url))
    )


def _cmd_reclaim(args: argparse.Namespace) -> int:
    from ray_triton_shm._pools import _reclaim

    return _print_reclaim(_reclaim.reclaim_regions(url=None if args.local else args.url))


# --------------------------------------------------------------------------------------
# doctor
# --------------------------------------------------------------------------------------


def _model_pool(text: str) -> tuple[str, int | None]:
    name, _, pool = text.partition(":")
    if not name or (pool and not pool.isdigit()):
        raise argparse.ArgumentTypeError(f"expected NAME or NAME:POOL_SIZE, got {text!r}")
    return name, int(pool) if pool else None


def _cmd_doctor(args: argparse.Namespace) -> int:
    import json

    from ray_triton_shm._tools._doctor import check_node
    from ray_triton_shm._tools._doctor_report import format_reports

    tls = {
        "ssl": args.ssl,
        "root_certificates": args.root_certificates,
        "private_key": args.private_key,
        "certificate_chain": args.certificate_chain,
        "tls_dir": args.tls_dir,
    }
    models = dict(args.model or [])
    if args.ray or args.address:
        try:
            from ray_triton_shm.ray._doctor import check_cluster

            reports = check_cluster(
                address=args.address,
                url=args.url,
                models=models,
                timeout_s=args.timeout_s,
                tls=tls,
                all_nodes=args.all_nodes,
                transport=args.transport,
            )
        except ImportError as exc:
            print(f"{PROG} doctor: error: Ray is not installed ({exc})", file=sys.stderr)
            return 1
        except ConnectionError as exc:
            print(
                f"{PROG} doctor: error: no Ray cluster at {args.address or 'auto'}: {exc}",
                file=sys.stderr,
            )
            return 1
    else:
        reports = [
            check_node(
                url=args.url,
                models=models,
                timeout_s=args.timeout_s,
                transport=args.transport,
                **tls,
            )
        ]
    if args.json:
        failed = any(r.failed for r in reports)
        print(json.dumps({"failed": failed, "nodes": [r.to_dict() for r in reports]}, indent=2))
    else:
        print(format_reports(reports))
    return 1 if any(r.failed for r in reports) else 0


# --------------------------------------------------------------------------------------
# grafana
# --------------------------------------------------------------------------------------


def _cmd_grafana(args: argparse.Namespace) -> int:
    try:
        from ray_triton_shm.ray._dashboard import grafana_dashboard, install_grafana_dashboard

        if args.stdout:
            content = grafana_dashboard()
        else:
            path = install_grafana_dashboard(args.out)
    except ImportError as exc:
        print(f"{PROG} grafana: error: Ray is not installed ({exc})", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{PROG} grafana: error: {exc}", file=sys.stderr)
        return 1
    if args.stdout:
        print(content)
        return 0
    print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Command:
    """A subcommand, as data: what ``--help`` says of it, its options and what runs it.

    Attributes:
        exclusive: Its ``options`` exclude each other.
        groups: Its options in argument groups of their own, after ``options``.
    """

    name: str
    help: str
    description: str
    run: Callable[[argparse.Namespace], int]
    options: tuple[Option, ...] = ()
    groups: OptionGroups = ()
    exclusive: bool = False


#: ``--address`` of ``doctor`` and ``status``.
_ADDRESS: Option = ("--address", dict(metavar="ADDR", help="Ray cluster address (implies --ray)"))
#: ``--url`` and ``--local`` of ``status`` and ``reclaim``.
_REGION_OPTIONS: tuple[Option, ...] = (
    (
        "--url",
        dict(
            default=DEFAULT_URL,
            metavar="HOST:PORT",
            help="gRPC endpoint of the Triton server (default: %(default)s)",
        ),
    ),
    (
        "--local",
        dict(
            action="store_true",
            help="look at this machine's /dev/shm only; do not contact a server",
        ),
    ),
)

#: The subcommands, in ``--help``'s order.
COMMANDS: tuple[_Command, ...] = (
    _Command(
        "setup-server",
        help="create the private Triton server environment (nvidia-pytriton, numpy<2, "
        "perf_analyzer)",
        description="Create the virtual environment the embedded Triton server runs from "
        "($RAY_TRITON_SHM_SERVER_ENV, else ~/.cache/ray-triton-shm), with the tritonclient "
        "wheel of the server's release for its perf_analyzer (the bench's ceiling), and "
        "install what your models import into it (Python backend), keeping its numpy<2. "
        "Idempotent.",
        run=_cmd_setup_server,
        options=(
            (
                "--with",
                dict(
                    dest="packages",
                    action="extend",
                    nargs="+",
                    default=[],
                    metavar="PACKAGE",
                    help="pip requirements your models import, e.g. --with scikit-learn",
                ),
            ),
            ("--requirements", dict(metavar="FILE", help="a pip requirements file for them")),
        ),
    ),
    _Command(
        "serve-local",
        help="run a local Triton server with the example models until Ctrl-C",
        description="Start the embedded Triton server, print its endpoints and models, and "
        "wait until Ctrl-C (or SIGTERM), then stop it cleanly.",
        run=_cmd_serve_local,
        options=(
            ("--grpc-port", dict(type=int, metavar="PORT", help="gRPC port (default or 0: free)")),
            ("--http-port", dict(type=int, metavar="PORT", help="HTTP port (default or 0: free)")),
            (
                "--metrics-port",
                dict(
                    type=int,
                    metavar="PORT",
                    help="Prometheus metrics port (default or 0: free; give one for a steady "
                    "scrape target)",
                ),
            ),
            (
                "--model-repository",
                dict(
                    action="append",
                    metavar="DIR",
                    help="model repository to serve; repeatable (default: the example models)",
                ),
            ),
            ("--host", dict(default="127.0.0.1", help="address to bind to (default: %(default)s)")),
            (
                "--log-file",
                dict(
                    metavar="PATH",
                    help="write Triton's log here, and keep it (default: a temporary file, "
                    "deleted at stop)",
                ),
            ),
            (
                "--startup-timeout-s",
                dict(
                    type=float,
                    default=180.0,
                    metavar="S",
                    help="how long to wait for the server and its models (default: %(default)s)",
                ),
            ),
            (
                "--no-restart",
                dict(
                    action="store_true",
                    help="end when Triton crashes, instead of starting it again (its supervisor "
                    "gives up after 5 crashes within a minute)",
                ),
            ),
            (
                "--onnx-via-python",
                dict(
                    action="store_true",
                    help="serve each ONNX model of the repositories through the Python backend "
                    "with onnxruntime (the embedded server has no ONNX backend; needs "
                    "`setup-server --with onnxruntime`); inputs, outputs and batching from its "
                    "config.pbtxt, else its graph",
                ),
            ),
        ),
    ),
    _Command(
        "bench",
        help="does shared memory help a model, and how many slots should it get?",
        description="Run models (any on a running Triton: --url, --models; by default the "
        "example models on the embedded one) through plain gRPC and TritonSHMClient at each "
        "--concurrency level (with --ray: ShmModel from caller processes, Serve and Ray Data), "
        "beside HTTP, tritonclient's shm utilities by hand and a memcpy floor; print requests/s, "
        "latency percentiles and CPU, the goals, a verdict per choice and caller count, and "
        "per model the pool-size answers (pool_size_for_throughput, elastic_pool, "
        "pool_size_for_rate).",
        run=_cmd_bench,
        groups=BENCH_OPTIONS,
    ),
    _Command(
        "doctor",
        help="check this node (or, with --ray, every node) before traffic arrives",
        description="Check that Triton is reachable and ready, which transport the models will "
        "get (shared memory where Triton opens a region made here; else, with --transport "
        "auto, by value, and why: another /dev/shm or another uid), that the access keys in "
        "RAY_TRITON_SHM_HEADER_* are enough, that /dev/shm has room for the pools and Ray's "
        "object store, and list leftovers and versions. Each check says ok, warn or fail, with "
        "its fix; the exit status is 1 when one fails. Nothing is left behind.",
        run=_cmd_doctor,
        options=(
            (
                "--url",
                dict(
                    metavar="HOST:PORT",
                    help="Triton's gRPC address (default: the node actor's, else "
                    f"$RAY_TRITON_SHM_URL on the node, else {DEFAULT_URL})",
                ),
            ),
            (
                "--model",
                dict(
                    action="append",
                    type=_model_pool,
                    metavar="NAME[:POOL]",
                    help="a pool the node would hold, sized from the model's configuration: "
                    "POOL slots, or without it one that follows its load (2 slots up to 64, "
                    "counted at 64); repeatable",
                ),
            ),
            (
                "--transport",
                dict(
                    choices=("auto", "shm", "inline"),
                    default="auto",
                    help="the transport= the models will be registered with: with auto a Triton "
                    "that cannot map this node's shared memory is a warning (by value), with "
                    "shm a failure (default: %(default)s)",
                ),
            ),
            ("--ray", dict(action="store_true", help="check every alive node of the Ray cluster")),
            _ADDRESS,
            (
                "--all-nodes",
                dict(
                    action="store_true",
                    help="with --ray, check nodes without CPUs or GPUs too (skipped by default: "
                    "no replica runs there, e.g. a head with num-cpus 0)",
                ),
            ),
            ("--json", dict(action="store_true", help="print the reports as JSON")),
            (
                "--timeout-s",
                dict(
                    type=float,
                    default=5.0,
                    metavar="S",
                    help="the longest wait for one answer from Triton (default: %(default)s)",
                ),
            ),
            ("--ssl", dict(action="store_true", help="talk TLS to Triton")),
            (
                "--root-certificates",
                dict(metavar="PEM", help="CA certificate of Triton's (implies --ssl)"),
            ),
            ("--private-key", dict(metavar="PEM", help="the client's key, for mutual TLS")),
            (
                "--certificate-chain",
                dict(metavar="PEM", help="the client's certificate, for mutual TLS"),
            ),
            (
                "--tls-dir",
                dict(
                    metavar="DIR",
                    help="ca.crt, tls.crt and tls.key as cert-manager writes them (default: "
                    "$RAY_TRITON_SHM_TLS_DIR, as the library's clients)",
                ),
            ),
        ),
    ),
    _Command(
        "status",
        help="show shared-memory regions (local and registered)",
        description="Show shared-memory regions (local and registered).",
        run=_cmd_status,
        options=(
            *_REGION_OPTIONS,
            (
                "--ray",
                dict(
                    action="store_true",
                    help="also list the Ray node actors and their stats (connects to the Ray "
                    "cluster at --address, else $RAY_ADDRESS or the local one)",
                ),
            ),
            _ADDRESS,
            (
                "--timeout-s",
                dict(
                    type=float,
                    default=30.0,
                    metavar="S",
                    help="how long to wait for each node actor's stats (default: %(default)s)",
                ),
            ),
        ),
    ),
    _Command(
        "reclaim",
        help="unregister and unlink regions whose owner is gone",
        description="Unregister and unlink regions whose owner is gone.",
        run=_cmd_reclaim,
        options=_REGION_OPTIONS,
    ),
    _Command(
        "grafana",
        help="write the Grafana dashboard of the Ray metrics beside Ray's dashboards",
        description="Write ray_triton_shm_grafana_dashboard.json, the dashboard of the node "
        "actors' Ray metrics and Triton's own, where Ray writes its Grafana dashboards "
        "($RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR, else the latest Ray session's "
        "metrics/grafana/dashboards on this node): a Grafana started with Ray's grafana.ini "
        "shows it in its Ray folder. Ray empties that folder when the head starts: run this "
        "after `ray start --head`. Ray's RAY_GRAFANA_RAY_TRITON_SHM_DASHBOARD_* variables "
        "(UID, GLOBAL_FILTERS) apply, as to Ray's dashboards.",
        run=_cmd_grafana,
        options=(
            ("--out", dict(metavar="DIR", help="write into DIR instead (made if missing)")),
            (
                "--stdout",
                dict(action="store_true", help="print the JSON instead (for Grafana's import)"),
            ),
        ),
        exclusive=True,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser from :data:`COMMANDS` (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Triton Inference Server system shared memory for Ray users.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.description)
        add_options(p.add_mutually_exclusive_group() if command.exclusive else p, command.options)
        add_groups(p, command.groups)
        p.set_defaults(func=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` if ``None``.

    Returns:
        The exit status.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code) if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        with _interrupts_as_keyboard_interrupt():
            return int(args.func(args))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
