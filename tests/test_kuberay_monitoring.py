"""``deployments/kuberay/podmonitor.yaml`` and ``prometheusrule.yaml``: valid for
prometheus-operator, pointed at the RayService's pods, and in step with the rules file.

* **Schema.** Each resource is validated against the ``v1`` schema of its CRD from a pinned
  prometheus-operator release (vendored under ``tests/schemas/``), closed as the API server's
  strict field validation is: an unknown or misspelt field is an error, as are a wrong type and
  two list entries with the same key (two rule groups of one name).
* **Targets.** The PodMonitors scrape the ports the pods have: KubeRay's ``metrics`` port of
  every Ray container and the Triton container's ``triton-metrics`` port, declared at Triton's
  metrics port in every RayService manifest here, on pods their selectors match; each sets
  ``ray_io_cluster`` from the pod's ``ray.io/cluster`` label, as KubeRay's samples do.
* **In step.** ``prometheusrule.yaml`` is ``deployments/prometheus/ray-triton-shm-rules.yaml``
  wrapped in a PrometheusRule, generated (``python tests/test_kuberay_monitoring.py`` writes
  it): the same groups, byte for byte.

Each check is shown to catch a broken copy. Nothing here starts Triton or Ray.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _crd import crd_schema
from _crd import schema_problems as crd_problems

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = ROOT / "deployments" / "kuberay"
PODMONITOR = KUBERAY / "podmonitor.yaml"
PROMETHEUSRULE = KUBERAY / "prometheusrule.yaml"
RULES = ROOT / "deployments" / "prometheus" / "ray-triton-shm-rules.yaml"
RAYSERVICES = [KUBERAY / f"rayservice{s}.yaml" for s in ("", "-gpu", "-mtls")]
SCHEMAS = Path(__file__).parent / "schemas" / "prometheus-operator-v0.93.0"
CRDS = {
    "PodMonitor": SCHEMAS / "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": SCHEMAS / "monitoring.coreos.com_prometheusrules.yaml",
}

#: The port KubeRay adds to every Ray container (Ray's metrics export port).
RAY_METRICS_PORT = ("metrics", 8080)
#: The Triton container's metrics port in the RayService manifests (tritonserver's default).
TRITON_METRICS_PORT_NAME = "triton-metrics"
TRITON_DEFAULT_METRICS_PORT = 8002
#: The relabeling KubeRay's sample PodMonitors carry.
CLUSTER_LABEL = {
    "sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"],
    "targetLabel": "ray_io_cluster",
}

_PROMETHEUSRULE_HEAD = """\
# Generated from deployments/prometheus/ray-triton-shm-rules.yaml: edit that file, then run
#   python tests/test_kuberay_monitoring.py
# (tests/test_kuberay_monitoring.py checks the two are in step). The alerts and recording rules
# of ray_triton_shm for prometheus-operator (e.g. kube-prometheus-stack), beside
# podmonitor.yaml. `release: prometheus`: kube-prometheus-stack picks up rules with its Helm
# release's label only (unless ruleSelectorNilUsesHelmValues is false): set it to yours.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: ray-triton-shm
  labels:
    release: prometheus
spec:
"""

Manifest = dict[str, Any]


# ---- schema (as tests/test_kuberay.py validates the RayService) ---------------------------


def schema_problems(resource: Manifest) -> list[str]:
    """Where ``resource`` breaks its CRD's schema: types, unknown fields, duplicate list keys."""
    if resource.get("apiVersion") != "monitoring.coreos.com/v1" or resource.get("kind") not in CRDS:
        return [f"not a monitoring.coreos.com/v1 {' or '.join(CRDS)}"]
    kind = resource["kind"]
    return crd_problems(resource, crd_schema(CRDS[kind], kind))


# ---- targets -----------------------------------------------------------------------------


def _pod_monitors() -> list[Manifest]:
    return [d for d in yaml.safe_load_all(PODMONITOR.read_text()) if d]


def _pods(service: Manifest) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """``(labels KubeRay puts on the pod, pod spec)`` of each group of a RayService."""
    cluster = service["spec"]["rayClusterConfig"]
    groups = [("head", cluster["headGroupSpec"])]
    groups += [("worker", g) for g in cluster.get("workerGroupSpecs", [])]
    return [
        ({"ray.io/node-type": kind, "ray.io/is-ray-node": "yes"}, group["template"]["spec"])
        for kind, group in groups
    ]


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}


def _triton_metrics_port(container: dict[str, Any]) -> int | None:
    """The port Triton serves metrics on, from its command line, if it is Triton."""
    words = " ".join([*container.get("command", []), *container.get("args", [])])
    if "tritonserver" not in words + container.get("image", ""):
        return None
    given = re.findall(r"--metrics-port=(\d+)", words)
    if "--allow-metrics=false" in words:
        return None
    return int(given[-1]) if given else TRITON_DEFAULT_METRICS_PORT


def target_problems(monitors: list[Manifest], services: list[Manifest]) -> list[str]:
    """What keeps the PodMonitors from scraping Ray's and Triton's metrics, one line each."""
    problems = []
    scraped: set[str] = set()
    for monitor in monitors:
        name = monitor["metadata"]["name"]
        selector = monitor["spec"].get("selector", {}).get("matchLabels", {})
        if not selector:
            problems.append(f"{name}: selects every pod of the namespace")
        for endpoint in monitor["spec"].get("podMetricsEndpoints", []):
            port = endpoint.get("port")
            relabelings = [
                {k: v for k, v in r.items() if k != "action"}
                for r in endpoint.get("relabelings", [])
                if r.get("action", "replace") == "replace"
            ]
            if CLUSTER_LABEL not in relabelings:
                problems.append(f"{name}: port {port} does not set ray_io_cluster")
            for service in services:
                where = f"{name} in {service['metadata']['name']}"
                pods = [
                    spec
                    for labels, spec in _pods(service)
                    if all(labels.get(k) == v for k, v in selector.items())
                ]
                if not pods:
                    problems.append(f"{where}: its selector matches no pod")
                for spec in pods:
                    problems += _port_problems(where, port, spec)
            scraped.add(port)
    for port in (RAY_METRICS_PORT[0], TRITON_METRICS_PORT_NAME):
        if port not in scraped:
            problems.append(f"no PodMonitor scrapes port {port}")
    return problems


def _port_problems(where: str, port: str | None, spec: dict[str, Any]) -> list[str]:
    containers = spec["containers"]
    if port == RAY_METRICS_PORT[0]:
        # KubeRay adds it to the Ray container (the first) unless that container names it.
        declared = _ports(containers[0]).get(port, RAY_METRICS_PORT[1])
        if declared != RAY_METRICS_PORT[1]:
            return [f"{where}: the Ray container's metrics port is {declared}, not 8080"]
        return []
    if port == TRITON_METRICS_PORT_NAME:
        tritons = [c for c in containers if _triton_metrics_port(c) is not None]
        if not tritons:
            return [f"{where}: scrapes {port} on a pod without Triton"]
        for triton in tritons:
            named = _ports(triton).get(port)
            serving = _triton_metrics_port(triton)
            if named is None:
                return [f"{where}: the Triton container has no port named {port}"]
            if named != serving:
                return [f"{where}: {port} is {named}, Triton serves metrics on {serving}"]
        return []
    return [f"{where}: port {port!r} is neither Ray's metrics nor Triton's"]


# ---- the PrometheusRule, generated -------------------------------------------------------


def prometheusrule_text(rules: Path = RULES) -> str:
    """``prometheusrule.yaml`` as generated from the rules file: its ``groups:`` block, as is,
    under the PrometheusRule's ``spec``."""
    lines = rules.read_text().splitlines()
    start = lines.index("groups:")
    body = [f"  {line}" if line else "" for line in lines[start:]]
    return _PROMETHEUSRULE_HEAD + "\n".join(body) + "\n"


# ---- the tests ---------------------------------------------------------------------------


@pytest.fixture
def monitors() -> list[Manifest]:
    return _pod_monitors()


@pytest.fixture(scope="module")
def services() -> list[Manifest]:
    found = [d for path in RAYSERVICES for d in yaml.safe_load_all(path.read_text()) if d]
    return [d for d in found if d["kind"] == "RayService"]


@pytest.fixture
def prometheusrule() -> Manifest:
    return yaml.safe_load(PROMETHEUSRULE.read_text())  # type: ignore[no-any-return]


def test_the_pod_monitors_are_valid(monitors: list[Manifest]) -> None:
    assert [m["kind"] for m in monitors] == ["PodMonitor"] * 3
    for monitor in monitors:
        assert schema_problems(monitor) == [], monitor["metadata"]["name"]


def test_the_pod_monitors_scrape_ray_and_triton(
    monitors: list[Manifest], services: list[Manifest]
) -> None:
    assert len(services) == len(RAYSERVICES)
    assert target_problems(monitors, services) == []


def test_the_prometheusrule_is_valid(prometheusrule: Manifest) -> None:
    assert schema_problems(prometheusrule) == []


def test_the_prometheusrule_is_the_rules_file() -> None:
    assert PROMETHEUSRULE.read_text() == prometheusrule_text(), (
        "prometheusrule.yaml is not in step with ray-triton-shm-rules.yaml: "
        "run python tests/test_kuberay_monitoring.py"
    )
    generated = yaml.safe_load(prometheusrule_text())
    assert generated["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def _endpoint(monitors: list[Manifest], name: str) -> dict[str, Any]:
    monitor = next(m for m in monitors if m["metadata"]["name"] == name)
    return monitor["spec"]["podMetricsEndpoints"][0]  # type: ignore[no-any-return]


SCHEMA_BROKEN: dict[str, tuple[Callable[[list[Manifest], Manifest], Any], str]] = {
    "a misspelt PodMonitor field": (
        lambda m, r: _endpoint(m, "triton-monitor").update(scrapeIntervall="30s"),
        "'scrapeIntervall' was unexpected",
    ),
    "a misspelt relabeling field": (
        lambda m, r: _endpoint(m, "ray-workers-monitor")["relabelings"][0].update(
            sourceLabel=["x"]
        ),
        "'sourceLabel' was unexpected",
    ),
    "a wrong type": (
        lambda m, r: _endpoint(m, "ray-head-monitor").update(port=8080),
        "8080 is not of type 'string'",
    ),
    "a misspelt rule field": (
        lambda m, r: r["spec"]["groups"][1]["rules"][0].update(annotation={}),
        "'annotation' was unexpected",
    ),
    "a bad duration": (
        lambda m, r: r["spec"]["groups"][1]["rules"][0].update({"for": "5 minutes"}),
        "does not match",
    ),
    "two groups of one name": (
        lambda m, r: r["spec"]["groups"][1].update(name=r["spec"]["groups"][0]["name"]),
        "two entries with {'name': 'ray-triton-shm.records'}",
    ),
}


@pytest.mark.parametrize("broken", list(SCHEMA_BROKEN))
def test_the_schema_check_catches_a_broken_copy(
    monitors: list[Manifest], prometheusrule: Manifest, broken: str
) -> None:
    change, expected = SCHEMA_BROKEN[broken]
    change(monitors, prometheusrule)
    problems = [p for r in [*monitors, prometheusrule] for p in schema_problems(r)]
    assert any(expected in p for p in problems), problems


def _triton(services: list[Manifest]) -> dict[str, Any]:
    pod = services[0]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "triton")  # type: ignore[no-any-return]


TARGET_BROKEN: dict[str, tuple[Callable[[list[Manifest], list[Manifest]], Any], str]] = {
    "Triton's port undeclared": (
        lambda m, s: _triton(s).update(
            ports=[p for p in _triton(s)["ports"] if p["name"] != "triton-metrics"]
        ),
        "the Triton container has no port named triton-metrics",
    ),
    "Triton's metrics elsewhere": (
        lambda m, s: _triton(s)["args"].__setitem__(
            0,
            _triton(s)["args"][0].replace(
                "exec tritonserver", "exec tritonserver --metrics-port=9002"
            ),
        ),
        "triton-metrics is 8002, Triton serves metrics on 9002",
    ),
    "a misspelt port": (
        lambda m, s: _endpoint(m, "triton-monitor").update(port="triton-metric"),
        "port 'triton-metric' is neither",
    ),
    "Triton looked for on the head": (
        lambda m, s: next(x for x in m if x["metadata"]["name"] == "triton-monitor")["spec"][
            "selector"
        ]["matchLabels"].update({"ray.io/node-type": "head"}),
        "scrapes triton-metrics on a pod without Triton",
    ),
    "a selector matching nothing": (
        lambda m, s: next(x for x in m if x["metadata"]["name"] == "ray-workers-monitor")["spec"][
            "selector"
        ]["matchLabels"].update({"ray.io/node-type": "workers"}),
        "its selector matches no pod",
    ),
    "no cluster label": (
        lambda m, s: _endpoint(m, "ray-head-monitor").pop("relabelings"),
        "ray-head-monitor: port metrics does not set ray_io_cluster",
    ),
}


@pytest.mark.parametrize("broken", list(TARGET_BROKEN))
def test_the_target_check_catches_a_broken_copy(
    monitors: list[Manifest], services: list[Manifest], broken: str
) -> None:
    change, expected = TARGET_BROKEN[broken]
    services = copy.deepcopy(services)
    change(monitors, services)
    problems = target_problems(monitors, services)
    assert any(expected in p for p in problems), problems


def test_a_prometheusrule_out_of_step_is_caught(tmp_path: Path) -> None:
    """An alert changed in the rules file only: the generated text differs from the file's."""
    edited = tmp_path / RULES.name
    edited.write_text(RULES.read_text().replace("for: 10m", "for: 15m", 1))
    assert prometheusrule_text(edited) != PROMETHEUSRULE.read_text()


if __name__ == "__main__":
    PROMETHEUSRULE.write_text(prometheusrule_text())
    print(f"wrote {PROMETHEUSRULE.relative_to(ROOT)}")
