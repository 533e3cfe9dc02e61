"""The metrics, the dashboard and the alerts, end to end: a real Prometheus (Debian's 2.42)
scraping a real local Ray, through the service-discovery file Ray writes, and the embedded
Triton's metrics port, while load runs through ``ShmModel``.

* Every query of every panel of the dashboard (``deployments/grafana/``) returns series: no
  metric the dashboard shows is missing or misspelt.
* An overload induced on purpose (more callers than slots and seats) fires the overload alert
  of ``deployments/prometheus/``; a request abandoned at its deadline fires the alert of slots
  that do not settle. The rules are loaded as shipped, with every ``for:`` cut to a second so
  that the test takes seconds, not minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import init_ray, wait_for

from ray_triton_shm._client import registry_of
from ray_triton_shm._slots._shm import pid_alive
from ray_triton_shm.local import LocalTritonServer

ray = pytest.importorskip("ray")

from ray_triton_shm.ray import URL_ENV_VAR, ShmModel, get_node_actor  # noqa: E402
from ray_triton_shm.ray._dashboard import _panel_queries, grafana_dashboard  # noqa: E402

PROMETHEUS = shutil.which("prometheus")
RULES = Path(__file__).parent.parent / "deployments" / "prometheus" / "ray-triton-shm-rules.yaml"
#: The seats of the node actor's regions: few, so that an overload is easy to make.
MAX_WAITING = 2
#: How long the abandoned request runs on in Triton after its caller gave up.
ABANDONED_MS = 8000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prometheus:
    """A Prometheus server of the test's own, and its HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=expr)["result"]  # type: ignore[no-any-return]

    def diagnosis(self) -> str:
        """What Prometheus sees: its targets' health, the alerts, and our series."""
        targets = [
            (t["scrapeUrl"], t["health"], t["lastError"])
            for t in self.get("/api/v1/targets")["activeTargets"]
        ]
        alerts = [
            (a["labels"]["alertname"], a["state"]) for a in self.get("/api/v1/alerts")["alerts"]
        ]
        names = [n for n in self.get("/api/v1/label/__name__/values") if "triton_shm" in n]
        overloads = self.query('ray_triton_shm_errors_total{kind="overloaded"}')
        return f"targets: {targets}\nalerts: {alerts}\nnames: {names}\noverloads: {overloads}"

    def firing(self) -> set[str]:
        alerts = self.get("/api/v1/alerts")["alerts"]
        return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}


@pytest.fixture(scope="module")
def ray_reporting_every_second(triton: LocalTritonServer) -> Iterator[Path]:
    """A private local Ray whose processes report their metrics every second (Ray's default is
    every 10 s); yields the service-discovery file Ray writes for Prometheus."""
    if ray.is_initialized():
        ray.shutdown()
    old = os.environ.get(URL_ENV_VAR)
    os.environ[URL_ENV_VAR] = triton.grpc_url
    for attempt in range(2):
        try:
            context = init_ray(
                address="local",
                num_cpus=4,
                include_dashboard=True,  # its head writes the service-discovery file
                dashboard_port=_free_port(),
                _system_config={"metrics_report_interval_ms": 1000},
            )
            break
        except Exception as exc:  # once, in CI, the dashboard died as it started (SIGABRT)
            ray.shutdown()
            if attempt or "dashboard" not in str(exc).lower():
                raise
    # The head writes it in Ray's temp dir, above its session's.
    temp_dir = Path(context.address_info["session_dir"]).parent
    discovery = temp_dir / "prom_metrics_service_discovery.json"
    port = f":{ray.nodes()[0]['MetricsExportPort']}"
    try:
        # It lists the autoscaler's endpoint first, the node's metrics port seconds later.
        wait_for(
            lambda: discovery.exists() and port in discovery.read_text(),
            timeout_s=60,
            every_s=0.1,
            what=f"{discovery} to list {port}",
        )
        yield discovery
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop(URL_ENV_VAR, None)
        else:
            os.environ[URL_ENV_VAR] = old


@pytest.fixture
def prometheus(
    tmp_path: Path, triton: LocalTritonServer, ray_reporting_every_second: Path
) -> Iterator[Prometheus]:
    if PROMETHEUS is None:
        pytest.fail(
            "no prometheus on the PATH: Debian's prometheus package (make test installs it)"
        )
    rules = re.sub(r"(?m)^(\s*)for: *\S+", r"\1for: 1s", RULES.read_text())
    (tmp_path / "rules.yaml").write_text(rules)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {
                "job_name": "ray",
                "file_sd_configs": [{"files": [str(ray_reporting_every_second)]}],
            },
            {
                "job_name": "triton",
                "static_configs": [{"targets": [f"127.0.0.1:{triton.metrics_port}"]}],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(f"http://127.0.0.1:{port}")

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2):
                return True
        except OSError:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            return False

    try:
        wait_for(ready, timeout_s=60, every_s=0.1, what="Prometheus ready")
        yield server
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@ray.remote(num_cpus=0, max_concurrency=16)
class Caller:
    """Calls models through ``ShmModel`` from a Ray worker, every answer checked."""

    def __init__(self) -> None:
        self.models: dict[str, ShmModel] = {}
        self.stop = threading.Event()
        self.answers = 0

    def model(self, name: str, **options: Any) -> ShmModel:
        key = f"{name}{sorted(options.items())}"
        if key not in self.models:
            self.models[key] = ShmModel(name, **options)
        return self.models[key]

    def classify(self, seconds: float) -> int:
        model = self.model("classifier")
        rng = np.random.default_rng()
        deadline = time.monotonic() + seconds  # the load itself: `seconds` of it
        while time.monotonic() < deadline and not self.stop.is_set():
            image = rng.random((1, 3, 224, 224), dtype=np.float32)
            out = model.infer({"INPUT0": image})
            assert out["OUTPUT0"].shape == (1, 1000)
            self.answers += 1
        return self.answers

    def echo(self, delay_ms: int) -> str:
        """One call of the model that sleeps ``delay_ms`` (on a pool of one slot); how it
        ended."""
        shapes = {"DATA": (16,), "ECHO": (16,)}
        model = self.model("delay_echo", pool_size=1, max_shapes=shapes)
        data = np.arange(16, dtype=np.float32)
        inputs = {"DELAY_MS": np.array([delay_ms], np.int32), "DATA": data}
        try:
            out = model.infer(inputs)
        except Exception as exc:
            return type(exc).__name__
        np.testing.assert_array_equal(out["ECHO"], data)
        return "answered"

    def sent(self) -> bool:
        """Whether a request of ``delay_echo`` is in Triton now (its slot says so)."""
        binding = next((m._here.binding for m in self.models.values()), None)
        if binding is None or binding.client is None:
            return False  # not bound yet
        header = registry_of(binding.client).get("delay_echo").header
        return any(header.busy_since(slot) for slot in range(header.slot_count))

    def pid(self) -> int:
        return os.getpid()

    def halt(self) -> None:
        self.stop.set()


@pytest.mark.soak  # minutes of make test: CI's soak tier runs it
def test_prometheus_sees_every_panel_and_fires_the_overload_and_abandoned_slot_alerts(
    prometheus: Prometheus,
) -> None:
    get_node_actor(max_waiting=MAX_WAITING)
    callers = [Caller.remote() for _ in range(2)]
    load = [caller.classify.remote(90) for caller in callers]
    victim = Caller.options(max_restarts=0).remote()
    try:
        assert ray.get(callers[0].echo.remote(0)) == "answered"
        # Counters exist at zero before their first event, or rate() would not see it.
        overloads = 'ray_triton_shm_errors_total{model="delay_echo",kind="overloaded"}'
        wait_for(
            lambda: prometheus.query(overloads),
            every_s=0.25,
            what=lambda: f"{overloads} at 0 in Prometheus; {prometheus.diagnosis()}",
        )
        # More callers than the slot and its seats: the others are refused at once.
        endings = ray.get([callers[0].echo.remote(300) for _ in range(8)])
        assert endings.count("OverloadedError") >= 1, endings
        assert endings.count("answered") >= 1, endings
        # A caller killed mid-request: its slot stays out of use until Triton is done.
        pid = ray.get(victim.pid.remote())
        victim.echo.remote(ABANDONED_MS)
        wait_for(lambda: ray.get(victim.sent.remote()), what="the victim's request sent")
        ray.kill(victim)
        wait_for(lambda: not pid_alive(pid), what="the victim's process gone")

        wanted = {"TritonShmOverloaded", "TritonShmSlotsAbandoned"}
        wait_for(
            lambda: wanted <= prometheus.firing(),
            every_s=0.25,
            what=lambda: f"{wanted} firing; {prometheus.diagnosis()}",
        )

        # By now the abandoned slot settled too (its settle time is a panel of its own).
        queries = _panel_queries(grafana_dashboard())
        assert len(queries) >= 15

        def empty() -> list[tuple[str, str]]:
            return [(title, expr) for title, expr in queries if not prometheus.query(expr)]

        wait_for(
            lambda: not empty(),
            timeout_s=ABANDONED_MS / 1000 + 30,
            every_s=0.25,
            what=lambda: (
                "series of every panel; panels whose queries return none:\n"
                + "\n".join(f"  {title}: {expr}" for title, expr in empty())
            ),
        )
    finally:
        for caller in callers:
            caller.halt.remote()
        answers = ray.get(load)
    assert all(n > 0 for n in answers)
