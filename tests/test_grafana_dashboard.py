"""The Grafana dashboard (``ray_triton_shm/ray/_dashboard.py``) and its checked-in copies.

Neither Ray nor Triton is started: the dashboard is made by Ray's dashboard factory alone.
Every query runs against a real Prometheus in another test; here each is checked against the
metrics' contract (names, labels, histograms), and parsed by ``promtool`` where it is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from ray_triton_shm._exceptions import ERROR_KINDS  # noqa: E402
from ray_triton_shm.ray import grafana_dashboard, install_grafana_dashboard  # noqa: E402
from ray_triton_shm.ray._dashboard import (  # noqa: E402
    DEPLOYMENT_CONFIGMAP,
    DEPLOYMENT_JSON,
    FILE_NAME,
    GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR,
    METRICS_OUTPUT_ROOT_ENV_VAR,
    REGENERATE,
    _deployment_files,
    _panel_queries,
    _without_overrides,
)

ROOT = Path(__file__).resolve().parent.parent

#: The metrics' contract: the names Prometheus sees (Ray adds the ``ray_`` prefix).
COUNTERS = {
    "ray_triton_shm_requests_total",
    "ray_triton_shm_samples_total",
    "ray_triton_shm_input_bytes_total",
    "ray_triton_shm_output_bytes_total",
    "ray_triton_shm_errors_total",
    "ray_triton_shm_abandoned_requests_total",
    "ray_triton_shm_layout_changes_total",
    "ray_triton_shm_pool_resizes_total",
    "ray_triton_shm_company_waits_total",
    "ray_triton_shm_company_wait_seconds_total",
}
HISTOGRAMS = {
    "ray_triton_shm_request_duration_seconds",
    "ray_triton_shm_slot_wait_seconds",
    "ray_triton_shm_abandoned_settle_seconds",
    "ray_triton_shm_rows_per_request",
}
MODEL_GAUGES = {
    "ray_triton_shm_slots",
    "ray_triton_shm_slots_max",
    "ray_triton_shm_slots_in_use",
    "ray_triton_shm_callers_waiting",
    "ray_triton_shm_slots_abandoned",
    "ray_triton_shm_growth_limited",
    "ray_triton_shm_transport",
}
NODE_GAUGES = {
    "ray_triton_shm_triton_up",
    "ray_triton_shm_node_actor_start_time_seconds",
    "ray_triton_shm_dead_owner_regions",
}
TRITON = {
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_request_success",
    "nv_inference_count",
}
#: Every series name a query may use.
SERIES = (
    COUNTERS
    | MODEL_GAUGES
    | NODE_GAUGES
    | TRITON
    | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)
_NAME = re.compile(r"\b(?:ray_triton_shm|nv_inference)_\w+")
#: A selector: ``metric{matchers}``.
_SELECTOR = re.compile(r"\b(?P<metric>(?:ray_triton_shm|nv_inference)_\w+)\{(?P<matchers>[^}]*)\}")


@pytest.fixture(scope="module")
def dashboard_json() -> str:
    with _without_overrides():
        return grafana_dashboard()


@pytest.fixture(scope="module")
def dashboard(dashboard_json: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(dashboard_json)
    return loaded


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel but rows, those inside collapsed rows included."""
    panels = []
    for panel in dashboard["panels"]:
        panels.extend([panel, *panel.get("panels", [])])
    return [p for p in panels if p["type"] != "row"]


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def unknown_metrics(dashboard: dict[str, Any]) -> set[str]:
    """The ``ray_triton_shm_*`` / ``nv_inference_*`` names used that the contract lacks."""
    return {name for expr in _exprs(dashboard) for name in _NAME.findall(expr)} - SERIES


# --- the checked-in copies ----------------------------------------------------------------


def _ray_version(dashboard: dict[str, Any]) -> str:
    return next((t for t in dashboard["tags"] if t.startswith("rayVersion:")), "")


def _what_we_define(dashboard: dict[str, Any]) -> list[Any]:
    """What the panel definitions and the base JSON decide, not Ray's panel templates."""
    return [
        dashboard["uid"],
        dashboard["title"],
        dashboard["templating"],
        [
            (p["title"], p.get("description"), p.get("fieldConfig", {}).get("defaults", {}))
            for p in dashboard["panels"]
        ],
        [[(t["expr"], t["legendFormat"]) for t in p["targets"]] for p in _panels(dashboard)],
    ]


def test_the_checked_in_dashboard_and_configmap_are_what_the_generator_makes() -> None:
    files = _deployment_files()
    for relative in files:
        assert (ROOT / relative).exists(), f"{relative} is missing: regenerate it with {REGENERATE}"
    checked_in = json.loads((ROOT / DEPLOYMENT_JSON).read_text())
    made = json.loads(files[DEPLOYMENT_JSON])
    changed = (
        f"differs from what ray_triton_shm/ray/_dashboard.py makes now: regenerate it with "
        f"{REGENERATE}"
    )
    assert _what_we_define(checked_in) == _what_we_define(made), f"{DEPLOYMENT_JSON} {changed}"
    if _ray_version(checked_in) != _ray_version(made):
        # Ray's panel templates (and the tag) change with Ray, so the files cannot be equal
        # byte for byte; what a reader sees must be: every panel where it was, of its kind.
        def layout(dashboard: dict[str, Any]) -> list[Any]:
            return [(p["id"], p["type"], p["gridPos"]) for p in _panels(dashboard)]

        assert layout(checked_in) == layout(made), f"{DEPLOYMENT_JSON} {changed}"
        return
    for relative, expected in files.items():
        assert (ROOT / relative).read_text() == expected, f"{relative} {changed}"


def test_the_configmap_holds_the_dashboard_for_grafanas_sidecar() -> None:
    yaml = pytest.importorskip("yaml")
    configmap = yaml.safe_load((ROOT / DEPLOYMENT_CONFIGMAP).read_text())
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert list(configmap["data"]) == [FILE_NAME]
    held = json.loads(configmap["data"][FILE_NAME])
    assert held == json.loads((ROOT / DEPLOYMENT_JSON).read_text())


def test_the_checked_in_dashboard_ignores_rays_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_GRAFANA_RAY_TRITON_SHM_DASHBOARD_GLOBAL_FILTERS", 'namespace="prod"')
    monkeypatch.setenv("RAY_GRAFANA_RAY_TRITON_SHM_DASHBOARD_UID", "elsewhere")
    overridden = json.loads(grafana_dashboard())
    assert overridden["uid"] == "elsewhere"
    assert all('namespace="prod"' in t["expr"] for p in _panels(overridden) for t in p["targets"])
    files = _deployment_files()
    assert 'namespace="prod"' not in files[DEPLOYMENT_JSON]
    assert json.loads(files[DEPLOYMENT_JSON])["uid"] == "rayTritonShmDashboard"


# --- the dashboard ------------------------------------------------------------------------


def test_the_dashboard_has_rays_variables_and_ours(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "SessionName", "Cluster", "Model", "NodeId"}
    assert variables["datasource"]["type"] == "datasource"
    # Ray's own, as its default dashboard defines them (global filters formatted away).
    assert "ray_node_network_receive_speed" in variables["SessionName"]["definition"]
    assert "ray_io_cluster" in variables["Cluster"]["definition"]
    assert variables["Model"]["definition"] == (
        'label_values(ray_triton_shm_requests_total{SessionName=~"$SessionName"}, model)'
    )
    assert variables["NodeId"]["definition"] == (
        'label_values(ray_triton_shm_requests_total{SessionName=~"$SessionName",'
        'model=~"$Model"}, node_id)'
    )
    for name in ("Model", "NodeId"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    assert not any("{global_filters}" in e or "{{" in e for e in _exprs(dashboard))


def test_every_panel_has_a_target_a_description_and_a_unit(dashboard: dict[str, Any]) -> None:
    panels = _panels(dashboard)
    assert len(panels) >= 15
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    ids = [p["id"] for p in rows + panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["targets"], f"{panel['title']!r} has no target"
        assert len(panel["description"]) > 40, f"{panel['title']!r} needs a description"
        assert panel["fieldConfig"]["defaults"]["unit"], f"{panel['title']!r} has no unit"


def test_every_metric_is_in_the_contract(dashboard: dict[str, Any]) -> None:
    assert unknown_metrics(dashboard) == set()
    used = {name for expr in _exprs(dashboard) for name in _NAME.findall(expr)}
    # Every metric of the node actor has a panel (nv_inference_count is Triton's, optional).
    missing = (SERIES - TRITON) - used - {f"{h}_{s}" for h in HISTOGRAMS for s in ("sum", "count")}
    assert missing == set(), f"no panel shows {sorted(missing)}"


def test_a_misspelt_metric_is_caught(dashboard_json: str) -> None:
    broken = json.loads(
        dashboard_json.replace("ray_triton_shm_slots_in_use", "ray_triton_shm_slot_in_use")
    )
    assert unknown_metrics(broken) == {"ray_triton_shm_slot_in_use"}
    broken = json.loads(
        dashboard_json.replace("_request_duration_seconds_bucket", "_request_duration_seconds")
    )
    assert unknown_metrics(broken) == {"ray_triton_shm_request_duration_seconds"}


def test_every_query_filters_as_rays_panels_do(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        for target in panel["targets"]:
            selectors = list(_SELECTOR.finditer(target["expr"]))
            assert selectors, f"{panel['title']!r}: {target['expr']}"
            for selector in selectors:
                metric, matchers = selector["metric"], selector["matchers"].split(",")
                if metric in TRITON:  # Triton's series have no node or session label
                    tail = ['model=~"$Model"']
                elif metric in NODE_GAUGES:
                    tail = ['node_id=~"$NodeId"', 'SessionName=~"$SessionName"']
                else:
                    tail = ['model=~"$Model"', 'node_id=~"$NodeId"', 'SessionName=~"$SessionName"']
                tail.append('ray_io_cluster=~"$Cluster"')  # Ray's standard global filter
                assert matchers[-len(tail) :] == tail, target["expr"]
                for extra in matchers[: -len(tail)]:
                    label, _, value = extra.partition("=")
                    assert label == "kind" and value.strip('"') in ERROR_KINDS, extra


def test_every_quantile_is_of_a_histograms_buckets_by_le(dashboard: dict[str, Any]) -> None:
    quantiles = [e for e in _exprs(dashboard) if "histogram_quantile" in e]
    assert len(quantiles) >= 7
    for expr in quantiles:
        inner = re.fullmatch(
            r"(?P<ceil>ceil\()?histogram_quantile\(0\.\d+, sum\(rate\((?P<metric>\w+)\{[^}]*\}"
            r"\[\w+\]\)\) by \((?P<by>[\w, ]+)\)\)(?(ceil)\))",
            expr,
        )
        assert inner, expr
        assert inner["metric"].removesuffix("_bucket") in HISTOGRAMS, expr
        assert inner["metric"].endswith("_bucket"), expr
        assert inner["by"].split(", ")[-1] == "le", expr
        # Whole rows: a quantile interpolated inside the bucket (0, 1] is no 0.5 of a row.
        rows = inner["metric"] == "ray_triton_shm_rows_per_request_bucket"
        assert bool(inner["ceil"]) == rows, expr


def test_node_batching_has_its_row_rows_per_request_and_company_waits(
    dashboard: dict[str, Any],
) -> None:
    """Rows per Triton request: the exact mean (samples over requests, not the histogram's
    ``_sum``, which Ray's recorder counts at its buckets' middles) and two quantiles of the
    rows histogram; how often batches waited for company, and how long."""
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows][:2] == ["Requests", "Node batching"]
    panels = {p["title"]: p for p in _panels(dashboard)}
    rows_panel = panels["Rows per Triton request"]
    legends = [t["legendFormat"] for t in rows_panel["targets"]]
    assert legends == ["{{model}} mean", "{{model}} p50", "{{model}} p99"]
    mean = rows_panel["targets"][0]["expr"]
    assert (
        mean.index("ray_triton_shm_samples_total")
        < mean.index("/")
        < mean.index("ray_triton_shm_requests_total")
    )
    assert all("rows_per_request_bucket" in t["expr"] for t in rows_panel["targets"][1:])
    (waits,) = panels["Batches that waited for company/s"]["targets"]
    assert waits["expr"].startswith("sum(rate(ray_triton_shm_company_waits_total{")
    (mean_wait,) = panels["Company wait (mean)"]["targets"]
    assert mean_wait["expr"].startswith("sum(rate(ray_triton_shm_company_wait_seconds_total{")
    assert (
        mean_wait["expr"].split(" / ")[1].startswith("sum(rate(ray_triton_shm_company_waits_total{")
    )
    assert panels["Company wait (mean)"]["fieldConfig"]["defaults"]["unit"] == "s"


def test_max_is_a_dashed_line_as_in_rays_panels(dashboard: dict[str, Any]) -> None:
    (slots,) = [p for p in _panels(dashboard) if p["title"] == "Slots in use"]
    assert any(t["legendFormat"] == "MAX" for t in slots["targets"])
    (override,) = [o for o in slots["seriesOverrides"] if o["alias"] == "MAX"]
    assert override["dashes"] and not override["stack"]


def test_transport_by_model_counts_the_nodes_of_each_transport(dashboard: dict[str, Any]) -> None:
    (panel,) = [p for p in _panels(dashboard) if p["title"] == "Transport by model"]
    (target,) = panel["targets"]
    assert panel["type"] == "stat" and target["legendFormat"] == "{{model}} {{transport}}"
    assert target["expr"].startswith("count(max(ray_triton_shm_transport{")
    # The series of the transport in use (1), one per node however often its actor restarted.
    assert target["expr"].endswith(
        " == 1) by (model, node_id, transport)) by (model, transport)"
    ), target["expr"]


def test_the_transport_gauge_says_one_transport_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A switch sets the old transport's series to 0: no series left saying both."""
    import numpy as np

    from ray_triton_shm._pools._snapshot import PoolSnapshot
    from ray_triton_shm._slots._header import HISTOGRAMS as HEADER_HISTOGRAMS
    from ray_triton_shm.ray import _metrics

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    class Recorder:
        def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
            self.name = name

        def set(self, value: float, tags: dict[str, str]) -> None:
            values[(self.name, tuple(sorted(tags.items())))] = value

        def inc(self, value: float, tags: dict[str, str]) -> None:
            self.set(value, tags)

        observe = inc

    monkeypatch.setattr(_metrics, "_make", lambda m, **kw: Recorder(m.name))
    fields = dict.fromkeys(PoolSnapshot.__dataclass_fields__, 0)
    snapshot = PoolSnapshot(
        **{
            **fields,
            "region": "rtshm_1-a",
            "limited_by": "",
            "failures": {},
            "counters": dict.fromkeys(("requests", "samples", "bytes_in", "bytes_out"), 0)
            | {"abandoned_requests": 0},
            "histograms": {h: np.zeros(40, np.int64) for h in HEADER_HISTOGRAMS},
        }
    )
    exporter = _metrics.NodeMetrics("n1")

    def transport() -> dict[str, float]:
        return {
            dict(tags)["transport"]: value
            for (name, tags), value in values.items()
            if name == _metrics.TRANSPORT.name and dict(tags)["model"] == "m"
        }

    exporter.export("m", snapshot)
    assert transport() == {}  # not told: not exported
    exporter.export("m", snapshot, transport="shm")
    assert transport() == {"shm": 1, "inline": 0}
    exporter.export("m", snapshot, transport="inline")
    assert transport() == {"shm": 0, "inline": 1}
    assert _metrics.TRANSPORT.prometheus == "ray_triton_shm_transport"
    assert _metrics.TRANSPORT.tags == ("model", "node_id", "transport")


def test_rows_per_request_and_company_waits_are_exported_as_they_grew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rows histogram's buckets are the header's (1, 2, 4, ..., 1024 rows), each request
    observed once strictly inside its bucket (whichever side of a bound Ray counts); the
    company waits are counters, in seconds, zero before the first."""
    import numpy as np

    from ray_triton_shm._pools._snapshot import PoolSnapshot
    from ray_triton_shm._slots._header import HISTOGRAMS as HEADER_HISTOGRAMS
    from ray_triton_shm._slots._header import ROWS_BUCKET_BOUNDS, ROWS_BUCKETS
    from ray_triton_shm.ray import _metrics

    made: dict[str, dict[str, Any]] = {}
    events: list[tuple[str, str, float]] = []

    class Recorder:
        def __init__(self, name: str, **kwargs: Any) -> None:
            self.name = name
            made[name] = kwargs

        def _record(self, value: float, tags: dict[str, str]) -> None:
            events.append((self.name, "zero", value))

        def inc(self, value: float, tags: dict[str, str]) -> None:
            assert tags["model"] == "m"
            events.append((self.name, "inc", value))

        def observe(self, value: float, tags: dict[str, str]) -> None:
            events.append((self.name, "observe", value))

        def set(self, value: float, tags: dict[str, str]) -> None:
            pass

    monkeypatch.setattr(_metrics, "_make", lambda m, **kw: Recorder(m.name, **kw))

    def snapshot(rows: dict[int, int], waits: int, wait_ns: int) -> PoolSnapshot:
        histogram = np.zeros(ROWS_BUCKETS, np.int64)
        for bucket, count in rows.items():
            histogram[bucket] = count
        counters = dict.fromkeys(("requests", "samples", "bytes_in", "bytes_out"), 0)
        return PoolSnapshot(
            **{
                **dict.fromkeys(PoolSnapshot.__dataclass_fields__, 0),
                "region": "rtshm_1-a",
                "limited_by": "",
                "failures": {},
                "counters": counters | {"abandoned_requests": 0},
                "histograms": {h: np.zeros(40, np.int64) for h in HEADER_HISTOGRAMS},
                "node_batching": True,
                "rows_histogram": histogram,
                "company_waits": waits,
                "company_wait_ns": wait_ns,
            }
        )

    exporter = _metrics.NodeMetrics("n1")
    rows, waits, seconds = (
        _metrics.ROWS_PER_REQUEST.name,
        _metrics.COMPANY_WAITS.name,
        _metrics.COMPANY_WAIT_SECONDS.name,
    )
    assert made[rows]["boundaries"] == [float(b) for b in ROWS_BUCKET_BOUNDS[:-1]]
    assert made[rows]["boundaries"][-1] == 1024.0
    exporter.export("m", snapshot({0: 3, 2: 2, ROWS_BUCKETS - 1: 1}, 4, 2_000_000))
    assert (waits, "zero", 0.0) in events and (seconds, "zero", 0.0) in events
    observed = sorted(v for name, kind, v in events if name == rows)
    assert observed == [0.5] * 3 + [3.0] * 2 + [2048.0]  # 1 row; 3 or 4 rows; over 1024
    assert [(k, v) for n, k, v in events if n in (waits, seconds) and k == "inc"] == [
        ("inc", 4),
        ("inc", 0.002),
    ]
    events.clear()
    exporter.export("m", snapshot({0: 3, 2: 3, ROWS_BUCKETS - 1: 1}, 5, 2_500_000))
    assert [v for n, _, v in events if n == rows] == [3.0]  # only what grew
    assert [v for n, _, v in events if n == waits] == [1]
    assert [round(v, 6) for n, _, v in events if n == seconds] == [0.0005]
    assert _metrics.ROWS_PER_REQUEST.prometheus == "ray_triton_shm_rows_per_request"
    assert _metrics.COMPANY_WAITS.prometheus == "ray_triton_shm_company_waits_total"
    assert _metrics.COMPANY_WAIT_SECONDS.prometheus == "ray_triton_shm_company_wait_seconds_total"


def test_the_watching_page_lists_every_metric() -> None:
    from ray_triton_shm.ray._metrics import METRICS

    page = (ROOT / "docs" / "watching.md").read_text()
    # Named whole in a cell of the table: `name` or `name{label}`.
    missing = [m.prometheus for m in METRICS if not re.search(f"`{m.prometheus}[`{{]", page)]
    assert missing == [], f"docs/watching.md's table of metrics lacks {missing}"


def test_the_panel_queries_replace_every_variable(dashboard_json: str) -> None:
    queries = _panel_queries(dashboard_json)
    assert len(queries) == sum(len(p["targets"]) for p in _panels(json.loads(dashboard_json)))
    for title, query in queries:
        assert "$" not in query, (title, query)
    (latency, *_) = [q for t, q in queries if t == "Request latency"]
    assert 'model=~".*",node_id=~".*",SessionName=~".+",ray_io_cluster=~".*"' in latency
    (restarts,) = [q for t, q in queries if t == "Node actor restarts"]
    assert restarts.endswith("[30m:])")
    chosen = _panel_queries(dashboard_json, {"Model": "classifier", "__range": "5m"})
    assert all('model=~".*"' not in q for _, q in chosen)
    assert 'model=~"classifier"' in chosen[0][1]
    with pytest.raises(ValueError, match=r"\$Nope"):
        _panel_queries(dashboard_json.replace("$NodeId", "$Nope"))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_every_panel_query_parses(dashboard_json: str, tmp_path: Path) -> None:
    """promtool parses each query as a recording rule's expression."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"panel_query_{i}", "expr": query}
                    for i, (_, query) in enumerate(_panel_queries(dashboard_json))
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# --- installing it ------------------------------------------------------------------------


def test_install_writes_the_file(tmp_path: Path, dashboard_json: str) -> None:
    path = install_grafana_dashboard(tmp_path / "dashboards")
    assert path == tmp_path / "dashboards" / FILE_NAME
    assert json.loads(path.read_text()) == json.loads(dashboard_json)


def test_install_goes_where_ray_writes_its_dashboards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR, METRICS_OUTPUT_ROOT_ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no Ray session"):
        install_grafana_dashboard()
    assert not (tmp_path / "ray" / "session_latest").exists()

    session = tmp_path / "ray" / "session_1"
    session.mkdir(parents=True)
    (tmp_path / "ray" / "session_latest").symlink_to(session)
    path = install_grafana_dashboard()
    assert path.resolve() == session / "metrics" / "grafana" / "dashboards" / FILE_NAME

    monkeypatch.setenv(METRICS_OUTPUT_ROOT_ENV_VAR, str(tmp_path / "root"))
    assert install_grafana_dashboard() == tmp_path / "root" / "grafana" / "dashboards" / FILE_NAME
    monkeypatch.setenv(GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR, str(tmp_path / "d"))
    assert install_grafana_dashboard() == tmp_path / "d" / FILE_NAME


def test_the_cli_writes_or_prints_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ray_triton_shm._cli import main

    assert main(["grafana", "--out", str(tmp_path)]) == 0
    assert (tmp_path / FILE_NAME).exists()
    capsys.readouterr()
    assert main(["grafana", "--stdout"]) == 0
    assert json.loads(capsys.readouterr().out)["title"]


def test_the_base_json_ships_in_the_wheel() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '"ray_triton_shm.ray" = ["grafana_dashboard_base.json"]' in text
