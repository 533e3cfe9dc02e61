"""The dashboard's key panels during a benchmark, drawn from a real Prometheus' answers.

Starts the embedded Triton, a local Ray whose processes report their metrics every second (with
its dashboard head, which writes the service-discovery file Prometheus reads), and Debian's
``prometheus`` scraping both with the rules of this folder; runs ``ray-triton-shm bench --ray``
(as ``make bench`` does, against that Triton); then asks Prometheus for the queries of the
Grafana dashboard's key panels over the run, with 15 s rate windows instead of 5 min, and draws
them::

    python deployments/prometheus/bench_snapshot.py --out docs/assets/watching-bench.png

Needs the ``[ray,bench]`` extras and ``prometheus`` on the PATH. Extra arguments after ``--``
go to the bench (``-- --quick`` for a short run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

#: The panels drawn, by their title in the dashboard.
PANELS = (
    "Requests/s",
    "Request latency",
    "Slot wait p99",
    "Slots in use",
    "Callers waiting",
    "Errors/s by kind",
    "Triton queue and compute time per request",
    "Bytes/s in and out",
)
BENCH_ARGS = (
    "bench",
    "--ray",
    "--request-rate",
    "50%",
    "100%",
    "150%",
    "--latency-bound-ms",
    "50",
    "--rate-models",
    "classifier-1",
    "--no-plot",
    "--no-report",
    "--no-progress",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command(argv: list[str]) -> int:
    """Runs ``ray-triton-shm ARGV`` (``python -m ray_triton_shm``) in this process, so that the
    bench's Ray paths run on this driver's Ray, whose metrics Prometheus scrapes (a process of
    its own would start a private Ray); returns its exit status."""
    saved = sys.argv
    sys.argv = ["ray-triton-shm", *argv]
    try:
        runpy.run_module("ray_triton_shm", run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else int(done.code is not None)
    finally:
        sys.argv = saved
    return 0


def _get(url: str, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=30) as answer:
        body = json.load(answer)
    if body["status"] != "success":
        raise RuntimeError(body)
    return body["data"]


def _legend(expr: str, labels: dict[str, str]) -> str:
    """What a series is: its quantile or metric, then its labels that vary."""
    quantile = re.search(r"histogram_quantile\(([\d.]+)", expr)
    metric = re.search(r"(?:ray_triton_shm|nv_inference)_(\w+?)(?:_total|_bucket)?\{", expr)
    what = f"p{float(quantile.group(1)) * 100:g}" if quantile else metric.group(1) if metric else ""
    shown = [labels[k] for k in ("model", "kind", "reason", "direction") if k in labels]
    return " ".join([what, *shown]).strip() or "all"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/assets/watching-bench.png"))
    parser.add_argument("bench_args", nargs="*", help="more arguments for the bench")
    args = parser.parse_args(argv)
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        parser.error("needs Debian's prometheus package (apt-get install prometheus)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import ray

    from ray_triton_shm.local import LocalTritonServer
    from ray_triton_shm.ray import URL_ENV_VAR
    from ray_triton_shm.ray._dashboard import _panel_queries, grafana_dashboard

    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    rules = Path(__file__).with_name("ray-triton-shm-rules.yaml")
    with LocalTritonServer(install=True) as triton:
        os.environ[URL_ENV_VAR] = triton.grpc_url
        context = ray.init(
            address="local",
            include_dashboard=True,
            _system_config={"metrics_report_interval_ms": 1000},
        )
        # The head writes it in Ray's temp dir, above its session's.
        temp_dir = Path(context.address_info["session_dir"]).parent
        discovery = temp_dir / "prom_metrics_service_discovery.json"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "5s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "ray", "file_sd_configs": [{"files": [str(discovery)]}]},
                {
                    "job_name": "triton",
                    "static_configs": [{"targets": [f"127.0.0.1:{triton.metrics_port}"]}],
                },
            ],
        }
        (work / "prometheus.yml").write_text(json.dumps(config))
        port = _free_port()
        server = subprocess.Popen(
            [
                prometheus,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            start = time.time()
            code = _command(
                [*BENCH_ARGS, "--url", triton.grpc_url, "--http-url", triton.http_url]
                + args.bench_args
            )
            time.sleep(5)  # the last reports and scrapes
            end = time.time()
            queries = _panel_queries(grafana_dashboard())
            figure, axes = plt.subplots(4, 2, figsize=(13, 13), constrained_layout=True)
            for title, ax in zip(PANELS, axes.flat, strict=True):
                for _, expr in (q for q in queries if q[0] == title):
                    expr = re.sub(r"\[5m\]", "[15s]", expr)
                    step = max(2, int((end - start) / 400))
                    answer = _get(
                        url, "/api/v1/query_range", query=expr, start=start, end=end, step=step
                    )
                    for series in answer["result"]:
                        times = [(float(t) - start) / 60 for t, _ in series["values"]]
                        values = [float(v) for _, v in series["values"]]
                        if not any(values):
                            continue  # a series at zero throughout (most error kinds)
                        label = _legend(expr, series["metric"])
                        ax.plot(times, values, linewidth=1, label=label)
                ax.set_title(title)
                ax.set_xlabel("minutes into make bench")
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=6, loc="upper left", ncol=2)
                else:
                    ax.text(
                        0.5, 0.5, "zero throughout the run", ha="center", transform=ax.transAxes
                    )
            figure.suptitle("ray-triton-shm dashboard panels during `make bench` (Prometheus)")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(args.out, dpi=90)
            print(f"wrote {args.out} ({end - start:.0f} s of bench, bench exit code {code})")
        finally:
            server.terminate()
            server.wait(timeout=30)
            ray.shutdown()
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
