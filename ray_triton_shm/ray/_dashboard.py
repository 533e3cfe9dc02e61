"""A Grafana dashboard of the node actors' metrics, generated the way Ray generates its own.

The panels are a table (:data:`_ROWS`), read into Ray's ``Panel`` and ``Target`` objects in a
``DashboardConfig`` named ``RAY_TRITON_SHM`` and rendered by Ray's own dashboard factory on
``grafana_dashboard_base.json`` (shipped beside this module). So Ray's environment overrides
apply as they do to Ray's dashboards: ``RAY_GRAFANA_RAY_TRITON_SHM_DASHBOARD_UID``,
``RAY_GRAFANA_RAY_TRITON_SHM_DASHBOARD_GLOBAL_FILTERS`` (extra label matchers, comma-separated,
added to every query) and ``RAY_GRAFANA_RAY_TRITON_SHM_LOG_LINK_URL``.

Every query of the library's metrics filters ``model=~"$Model"``, ``node_id=~"$NodeId"``,
``SessionName=~"$SessionName"`` and the global filters (Ray's ``ray_io_cluster=~"$Cluster"``,
then the overrides); Triton's own metrics (``nv_inference_*``, from its metrics port) carry
``model`` but neither ``node_id`` nor ``SessionName``, so their queries filter only by model and
the global filters.

Ray's dashboard modules are imported only when a dashboard is made: importing this module (and
:mod:`ray_triton_shm.ray`) stays cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ._metrics import (
    ABANDONED_REQUESTS,
    ABANDONED_SETTLE,
    CALLERS_WAITING,
    COMPANY_WAIT_SECONDS,
    COMPANY_WAITS,
    DEAD_OWNER_REGIONS,
    ERRORS,
    GROWTH_LIMITED,
    INPUT_BYTES,
    LAYOUT_CHANGES,
    NODE_ACTOR_START_TIME,
    OUTPUT_BYTES,
    POOL_RESIZES,
    REQUEST_DURATION,
    REQUESTS,
    ROWS_PER_REQUEST,
    SAMPLES,
    SLOT_WAIT,
    SLOTS,
    SLOTS_ABANDONED,
    SLOTS_IN_USE,
    SLOTS_MAX,
    TRANSPORT,
    TRITON_UP,
)
from ._ray_internals import dashboard_classes, default_temp_dir, render_grafana_dashboard

__all__ = ["grafana_dashboard", "install_grafana_dashboard"]

#: The name Ray's environment overrides are keyed by (``RAY_GRAFANA_<NAME>_DASHBOARD_UID``, ...).
DASHBOARD_NAME = "RAY_TRITON_SHM"
#: The dashboard's uid unless ``RAY_GRAFANA_RAY_TRITON_SHM_DASHBOARD_UID`` says otherwise.
DEFAULT_UID = "rayTritonShmDashboard"
#: The file name, beside Ray's ``default_grafana_dashboard.json`` and the others.
FILE_NAME = "ray_triton_shm_grafana_dashboard.json"
#: Our base JSON (template variables, title, time range), shipped as package data.
BASE_JSON = Path(__file__).resolve().parent / "grafana_dashboard_base.json"

#: Ray's own variables for where it writes its dashboards (``metrics_head.py``).
GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR = "RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"
METRICS_OUTPUT_ROOT_ENV_VAR = "RAY_METRICS_OUTPUT_ROOT"
#: Ray's environment overrides of a dashboard, by name (``grafana_dashboard_factory.py``).
_OVERRIDE_ENV_VARS = tuple(
    f"RAY_GRAFANA_{DASHBOARD_NAME}_{suffix}"
    for suffix in ("DASHBOARD_UID", "DASHBOARD_GLOBAL_FILTERS", "LOG_LINK_URL")
)

# Label matchers. Ray str.format()s every expr with global_filters=..., so the braces of a
# selector are doubled (see _series) and {global_filters} is left for Ray to fill.
_BY_MODEL = 'model=~"$Model",node_id=~"$NodeId",SessionName=~"$SessionName",{global_filters}'
_BY_NODE = 'node_id=~"$NodeId",SessionName=~"$SessionName",{global_filters}'
_TRITON = 'model=~"$Model",{global_filters}'

#: The range of every rate(), as in Ray's panels.
_RATE = "5m"


def _series(metric: str, selector: str, *matchers: str) -> str:
    """``metric{matchers,selector}`` with its braces doubled for Ray's ``str.format``."""
    return metric + "{{" + ",".join((*matchers, selector)) + "}}"


def _rate(metric: str, selector: str = _BY_MODEL, *matchers: str) -> str:
    return f"rate({_series(metric, selector, *matchers)}[{_RATE}])"


def _quantile(q: float, histogram: str) -> str:
    """The ``q`` quantile of a histogram of ours, by model, over the last 5 minutes."""
    return f"histogram_quantile({q}, sum({_rate(histogram + '_bucket')}) by (model, le))"


def _per(numerator: str, denominator: str) -> str:
    """The rate of one counter of ours over another's, by model: a mean per event."""
    return f"sum({_rate(numerator)}) by (model) / sum({_rate(denominator)}) by (model)"


def _triton_per_request(counter: str) -> str:
    """Triton's cumulative ``counter`` (microseconds) per successful request, by model."""
    return (
        f"sum({_rate(counter, _TRITON)}) by (model) / "
        f"sum({_rate('nv_inference_request_success', _TRITON)}) by (model)"
    )


@dataclass(frozen=True)
class _PanelSpec:
    """One panel of the dashboard, as data: :func:`_panel` makes Ray's ``Panel`` of it.

    Attributes:
        id: Its id in the dashboard.
        title: Its title.
        description: What it shows (Grafana's tooltip of the title).
        unit: Grafana's unit of its values.
        targets: Its queries, each ``(PromQL, legend)``.
        style: ``"area"`` (Ray's default: stacked filled areas), ``"lines"`` (unstacked lines)
            or ``"stat"`` (a number per series, coloured by ``thresholds``).
        thresholds: A stat panel's colours, by value.
    """

    id: int
    title: str
    description: str
    unit: str
    targets: tuple[tuple[str, str], ...]
    style: str = "area"
    thresholds: tuple[dict[str, Any], ...] = ()


_REQUESTS = (
    _PanelSpec(
        id=1,
        title="Requests/s",
        description="Requests Triton answered through shared memory, per second, by model "
        "(every process of every selected node). Stacked: the top is the total.",
        unit="reqps",
        targets=((f"sum({_rate(REQUESTS.prometheus)}) by (model)", "{{model}}"),),
    ),
    _PanelSpec(
        id=2,
        title="Request latency",
        description="p50, p90 and p99 of a request's time, from its caller's first wait "
        "for a slot to Triton's answer read back: the latency a replica or predictor sees, "
        "slot wait included.",
        unit="s",
        targets=tuple(
            (_quantile(q, REQUEST_DURATION.prometheus), f"{{{{model}}}} p{round(q * 100)}")
            for q in (0.5, 0.9, 0.99)
        ),
        style="lines",
    ),
    _PanelSpec(
        id=3,
        title="Slot wait p99",
        description="99th percentile of how long a request waited for a free slot of its "
        "model's pool on its node (every request counts, those that did not wait with 0). "
        "Long waits with the pool at its max: raise max_slots, or add Triton capacity.",
        unit="s",
        targets=((_quantile(0.99, SLOT_WAIT.prometheus), "{{model}}"),),
        style="lines",
    ),
    _PanelSpec(
        id=4,
        title="Bytes/s in and out",
        description="Bytes written into shared memory for Triton (in) and read back from "
        "its outputs (out), per second, by model.",
        unit="Bps",
        targets=(
            (f"sum({_rate(INPUT_BYTES.prometheus)}) by (model)", "{{model}} in"),
            (f"sum({_rate(OUTPUT_BYTES.prometheus)}) by (model)", "{{model}} out"),
        ),
        style="lines",
    ),
    _PanelSpec(
        id=5,
        title="Samples per request",
        description="Samples (rows of the batch dimension) per request, by model: how well "
        "callers batch (@serve.batch, Ray Data's batch_size, node batching) against the "
        "model's max_batch_size.",
        unit="short",
        targets=((_per(SAMPLES.prometheus, REQUESTS.prometheus), "{{model}}"),),
        style="lines",
    ),
)
_NODE_BATCHING = (
    _PanelSpec(
        id=20,
        title="Rows per Triton request",
        description="Rows (samples) per request Triton answered, by model: the mean, and the "
        "median and 99th percentile of the rows histogram (buckets 1, 2, 4, ..., 1024 rows; "
        "a quantile is rounded up to whole rows within its bucket). Above 1 where node "
        "batching merges small calls of the node's processes into one request.",
        unit="short",
        targets=(
            (_per(SAMPLES.prometheus, REQUESTS.prometheus), "{{model}} mean"),
            *(
                (f"ceil({_quantile(q, ROWS_PER_REQUEST.prometheus)})", f"{{{{model}}}} p{p}")
                for q, p in ((0.5, 50), (0.99, 99))
            ),
        ),
        style="lines",
    ),
    _PanelSpec(
        id=21,
        title="Batches that waited for company/s",
        description="Node batches per second whose sender waited for company (other callers' "
        "rows) because the model's earlier batches were still in Triton, by model. A caller "
        "alone never waits; none here at low load is as it should be.",
        unit="reqps",
        targets=((f"sum({_rate(COMPANY_WAITS.prometheus)}) by (model)", "{{model}}"),),
    ),
    _PanelSpec(
        id=22,
        title="Company wait (mean)",
        description="How long a node batch that waited for company waited, on average, by "
        "model: bounded by its NodeBatching's max_delay_s (the bound the user sets, as Triton's "
        "max_queue_delay_microseconds), and less as batches fill up.",
        unit="s",
        targets=((_per(COMPANY_WAIT_SECONDS.prometheus, COMPANY_WAITS.prometheus), "{{model}}"),),
        style="lines",
    ),
)
_SLOTS = (
    _PanelSpec(
        id=6,
        title="Slots in use",
        description="Slots in use and the pool's size now, by model, summed over the "
        "selected nodes; MAX (dashed) is the slots the selected pools may grow to "
        "(max_slots), summed over models and nodes: select one model to read its pool "
        "against its own max.",
        unit="short",
        targets=(
            (f"sum({_series(SLOTS_IN_USE.prometheus, _BY_MODEL)}) by (model)", "{{model}} in use"),
            (f"sum({_series(SLOTS.prometheus, _BY_MODEL)}) by (model)", "{{model}} slots"),
            (f"sum({_series(SLOTS_MAX.prometheus, _BY_MODEL)})", "MAX"),
        ),
        style="lines",
    ),
    _PanelSpec(
        id=7,
        title="Callers waiting",
        description="Callers waiting for a free slot now, by model. Waiting callers make a "
        "pool that follows its load grow; at max_waiting more callers are refused "
        "(overloads).",
        unit="short",
        targets=(
            (f"sum({_series(CALLERS_WAITING.prometheus, _BY_MODEL)}) by (model)", "{{model}}"),
        ),
    ),
    _PanelSpec(
        id=8,
        title="Pool growth limited",
        description="1 while callers wait and a pool cannot grow, by model and reason: "
        "max_slots (at its max), shm_budget (the node's /dev/shm budget is spent) or "
        "shm_full (/dev/shm is full).",
        unit="short",
        targets=(
            (
                f"max({_series(GROWTH_LIMITED.prometheus, _BY_MODEL)}) by (model, reason)",
                "{{model}} {{reason}}",
            ),
        ),
        style="lines",
    ),
    _PanelSpec(
        id=9,
        title="Abandoned slots",
        description="Slots out of use until Triton finishes a request whose caller gave up "
        "(timeout, cancellation) or died, by model. They come back by themselves once "
        "Triton is done; many at once shrink the pool that callers can use.",
        unit="short",
        targets=(
            (f"sum({_series(SLOTS_ABANDONED.prometheus, _BY_MODEL)}) by (model)", "{{model}}"),
        ),
    ),
    _PanelSpec(
        id=10,
        title="Abandoned slot settle time p99",
        description="99th percentile of how long an abandoned slot stayed out of use, "
        "from its caller giving up until Triton was done with its request, by model.",
        unit="s",
        targets=((_quantile(0.99, ABANDONED_SETTLE.prometheus), "{{model}}"),),
        style="lines",
    ),
)
_ERRORS = (
    _PanelSpec(
        id=11,
        title="Overloads/s",
        description="Callers refused at once because max_waiting callers already waited "
        "for a slot (OverloadedError; HTTP 503 in the example Serve app), per second, by "
        "model.",
        unit="reqps",
        targets=(
            (
                "sum(" + _rate(ERRORS.prometheus, _BY_MODEL, 'kind="overloaded"') + ") by (model)",
                "{{model}}",
            ),
        ),
    ),
    _PanelSpec(
        id=12,
        title="Errors/s by kind",
        description="Failed requests per second, by model and kind: overloaded, deadline "
        "(a timeout passed), access_denied (keys), tls, unavailable (Triton unreachable), "
        "model_changed, bad_input, other.",
        unit="reqps",
        targets=((f"sum({_rate(ERRORS.prometheus)}) by (model, kind)", "{{model}} {{kind}}"),),
    ),
    _PanelSpec(
        id=13,
        title="Abandoned requests/s",
        description="Requests given up while Triton ran them (their caller timed out, was "
        "cancelled or died), per second, by model; each leaves its slot abandoned until "
        "Triton is done.",
        unit="reqps",
        targets=((f"sum({_rate(ABANDONED_REQUESTS.prometheus)}) by (model)", "{{model}}"),),
    ),
    _PanelSpec(
        id=14,
        title="Layout changes and pool resizes",
        description="Over the dashboard's time range, by model: times the model changed on "
        "Triton (inputs or outputs) and its pool was laid out anew, and times a pool grew or "
        "shrank with its load.",
        unit="short",
        targets=(
            (
                f"sum(increase({_series(LAYOUT_CHANGES.prometheus, _BY_MODEL)}[$__range])) "
                "by (model)",
                "{{model}} layout changes",
            ),
            (
                f"sum(increase({_series(POOL_RESIZES.prometheus, _BY_MODEL)}[$__range])) "
                "by (model, direction)",
                "{{model}} {{direction}}",
            ),
        ),
        style="stat",
        thresholds=({"color": "blue", "value": None},),
    ),
)
_TRITON_AND_NODES = (
    _PanelSpec(
        id=15,
        title="Triton queue and compute time per request",
        description="From Triton's own metrics (its metrics port): the mean time a request "
        "waited in Triton's queue, and the mean compute time of the inference that "
        "served it, by model. They count every client of Triton, not only ours; Triton's "
        "series have no node or session label, so only Model and Cluster filter them.",
        unit="µs",
        targets=(
            (_triton_per_request("nv_inference_queue_duration_us"), "{{model}} queue"),
            (_triton_per_request("nv_inference_compute_infer_duration_us"), "{{model}} compute"),
        ),
        style="lines",
    ),
    _PanelSpec(
        id=16,
        title="Triton up",
        description="1 while the node actor reaches its node's Triton (live), "
        "0 while it does not, by node.",
        unit="short",
        targets=((f"min({_series(TRITON_UP.prometheus, _BY_NODE)}) by (node_id)", "{{node_id}}"),),
        style="lines",
    ),
    _PanelSpec(
        id=17,
        title="Node actor restarts",
        description="Times a node's node actor started again over the dashboard's time "
        "range (its start time changed), by node. A restarted actor takes its pools back "
        "from the regions; frequent restarts deserve a look at its logs.",
        unit="short",
        targets=(
            (
                # max by node: a restarted actor may export a new series (a new pid or
                # worker label); the node's latest start time changes either way.
                f"changes((max({_series(NODE_ACTOR_START_TIME.prometheus, _BY_NODE)}) "
                "by (node_id))[$__range:])",
                "{{node_id}}",
            ),
        ),
        style="stat",
        thresholds=({"color": "green", "value": None}, {"color": "orange", "value": 1}),
    ),
    _PanelSpec(
        id=18,
        title="Dead-owner regions",
        description="Shared-memory regions on a node whose owner process is gone and that "
        "are not yet reclaimed, by node. The node actor reclaims them; ones that stay "
        "need `ray-triton-shm reclaim` (and a look at what killed their owners).",
        unit="short",
        targets=(
            (
                f"max({_series(DEAD_OWNER_REGIONS.prometheus, _BY_NODE)}) by (node_id)",
                "{{node_id}}",
            ),
        ),
    ),
    _PanelSpec(
        id=19,
        title="Transport by model",
        description="Nodes whose pool of each model reaches Triton through shared memory "
        "(shm), or by value, in the requests (inline: Triton cannot map the node's "
        "/dev/shm, as on another host, in another container or as another user; or "
        "transport='inline' was asked for). `ray-triton-shm status --ray` and `doctor` "
        "say why.",
        unit="short",
        targets=(
            (
                # One per node: a restarted node actor exports new series (its WorkerId).
                f"count(max({_series(TRANSPORT.prometheus, _BY_MODEL)} == 1) "
                "by (model, node_id, transport)) by (model, transport)",
                "{{model}} {{transport}}",
            ),
        ),
        style="stat",
        thresholds=({"color": "blue", "value": None},),
    ),
)
#: The dashboard's rows, each ``(id, title, panels)``, top first.
_ROWS = (
    (100, "Requests", _REQUESTS),
    (104, "Node batching", _NODE_BATCHING),
    (101, "Slots", _SLOTS),
    (102, "Errors", _ERRORS),
    (103, "Triton and nodes", _TRITON_AND_NODES),
)


def _panel(spec: _PanelSpec, ray_classes: ModuleType) -> Any:
    """``spec`` as Ray's ``Panel``."""
    style: dict[str, Any] = {}
    if spec.style == "lines":  # Ray stacks filled areas by default
        style = {"fill": 0, "stack": False}
    elif spec.style == "stat":
        style = {"template": ray_classes.PanelTemplate.STAT, "thresholds": list(spec.thresholds)}
    return ray_classes.Panel(
        id=spec.id,
        title=spec.title,
        description=spec.description,
        unit=spec.unit,
        targets=[ray_classes.Target(expr=expr, legend=legend) for expr, legend in spec.targets],
        **style,
    )


def _dashboard_config() -> Any:
    """The dashboard (:data:`_ROWS`) as Ray's ``DashboardConfig`` (imports Ray's modules)."""
    ray_classes = dashboard_classes()
    return ray_classes.DashboardConfig(
        name=DASHBOARD_NAME,
        default_uid=DEFAULT_UID,
        standard_global_filters=['ray_io_cluster=~"$Cluster"'],
        base_json_file_name=str(BASE_JSON),  # absolute: Ray's os.path.join(its dir, ...) keeps it
        rows=[
            ray_classes.Row(
                title=title, id=row_id, panels=[_panel(spec, ray_classes) for spec in panels]
            )
            for row_id, title, panels in _ROWS
        ],
    )


def grafana_dashboard() -> str:
    """The Grafana dashboard of the library's metrics, as JSON.

    Rendered by Ray's dashboard factory, as Ray renders its own dashboards, so Ray's environment
    overrides apply: ``RAY_GRAFANA_RAY_TRITON_SHM_DASHBOARD_UID`` (the uid, default
    ``rayTritonShmDashboard``), ``RAY_GRAFANA_RAY_TRITON_SHM_DASHBOARD_GLOBAL_FILTERS`` (label
    matchers added to every query, e.g. ``namespace="prod"``) and
    ``RAY_GRAFANA_RAY_TRITON_SHM_LOG_LINK_URL``.

    Returns:
        The dashboard's JSON, for Grafana's import or a provisioned folder.

    Raises:
        ImportError: Ray is not installed.
    """
    return render_grafana_dashboard(_dashboard_config())


def _ray_dashboards_dir() -> tuple[Path, bool]:
    """Where Ray writes its dashboards, and whether that is a directory Ray named by env var.

    As Ray's ``metrics_head.py``: ``$RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR``, else
    ``$RAY_METRICS_OUTPUT_ROOT/grafana/dashboards``, else the latest session's
    ``metrics/grafana/dashboards``.
    """
    if os.environ.get(GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR):
        return Path(os.environ[GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR]), True
    if os.environ.get(METRICS_OUTPUT_ROOT_ENV_VAR):
        return Path(os.environ[METRICS_OUTPUT_ROOT_ENV_VAR]) / "grafana" / "dashboards", True
    return default_temp_dir() / "session_latest" / "metrics" / "grafana" / "dashboards", False


def install_grafana_dashboard(directory: str | os.PathLike[str] | None = None) -> Path:
    """Writes the dashboard as ``ray_triton_shm_grafana_dashboard.json`` beside Ray's own.

    By default into the folder Ray writes its dashboards to and provisions its Grafana from:
    ``$RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR``, else
    ``$RAY_METRICS_OUTPUT_ROOT/grafana/dashboards``, else
    ``/tmp/ray/session_latest/metrics/grafana/dashboards`` (the head node's latest session),
    so a Grafana started with Ray's ``grafana.ini`` shows it in its ``Ray`` folder. Ray empties
    that folder whenever the head starts: install again after ``ray start --head``.

    Args:
        directory: Write into this folder instead (made if missing), e.g. a folder that your
            own Grafana provisions dashboards from.

    Returns:
        The path of the file written.

    Raises:
        FileNotFoundError: ``directory`` is not given and no Ray session was started on this
            machine (there is no ``session_latest`` to write into).
        ImportError: Ray is not installed.
    """
    if directory is not None:
        target = Path(directory)
    else:
        target, named = _ray_dashboards_dir()
        session = target.parents[2]
        # session_latest is Ray's symlink: making it a directory would break the next session.
        if not named and not session.exists():
            raise FileNotFoundError(
                f"no Ray session at {session}: start Ray on this node first "
                "(ray start --head), or name the folder to write into "
                "(directory=..., or ray-triton-shm grafana --out DIR)"
            )
    target.mkdir(parents=True, exist_ok=True)
    path = target / FILE_NAME
    path.write_text(grafana_dashboard())
    return path


# --------------------------------------------------------------------------------------
# The checked-in copies (deployments/) and the queries of the panels
# --------------------------------------------------------------------------------------

#: The checked-in copies, relative to the repository's root.
DEPLOYMENT_JSON = Path("deployments") / "grafana" / FILE_NAME
DEPLOYMENT_CONFIGMAP = Path("deployments") / "kuberay" / "grafana-dashboard-configmap.yaml"
#: How to regenerate them, for the messages of the test that compares them.
REGENERATE = "python deployments/grafana/generate.py (or: make grafana)"

_CONFIGMAP_HEADER = f"""\
# Generated by `{REGENERATE.split(" (")[0]}` from ray_triton_shm/ray/_dashboard.py: do not edit.
# The ray-triton-shm Grafana dashboard for Grafana's dashboard sidecar (kube-prometheus-stack's
# grafana.sidecar.dashboards, which loads ConfigMaps labelled grafana_dashboard: "1"). Apply it
# in a namespace the sidecar watches (kube-prometheus-stack's own, by default):
#   kubectl apply -n monitoring -f deployments/kuberay/grafana-dashboard-configmap.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: ray-triton-shm-grafana-dashboard
  labels:
    grafana_dashboard: "1"
data:
  {FILE_NAME}: |-
"""


@contextlib.contextmanager
def _without_overrides() -> Iterator[None]:
    """Ray's environment overrides of this dashboard unset for the block (then restored)."""
    saved = {name: os.environ.pop(name) for name in _OVERRIDE_ENV_VARS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _deployment_files() -> dict[Path, str]:
    """The checked-in files as the generator makes them now, by path under the repository.

    Made without Ray's environment overrides, so they do not depend on who generates them.
    """
    with _without_overrides():
        content = grafana_dashboard()
    configmap = _CONFIGMAP_HEADER + "".join(f"    {line}\n" for line in content.splitlines())
    return {DEPLOYMENT_JSON: content + "\n", DEPLOYMENT_CONFIGMAP: configmap}


def _write_deployments(root: str | os.PathLike[str]) -> list[Path]:
    """Regenerates the checked-in dashboard and ConfigMap under the repository ``root``.

    Returns:
        The paths written.
    """
    written = []
    for relative, text in _deployment_files().items():
        path = Path(root) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


#: What Grafana's built-in variables stand for in :func:`_panel_queries` unless told otherwise:
#: the dashboard's default time range (30 minutes) and Prometheus' default scrape interval.
_BUILTINS = {"__range": "30m", "__rate_interval": "1m", "__interval": "15s"}
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _panel_queries(
    dashboard_json: str, substitutions: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """Every panel's PromQL as Prometheus can run it, with the Grafana variables replaced.

    For a test that runs each panel's query against a real Prometheus. A template variable
    becomes what Grafana sends for "All": its ``allValue`` (``.*`` for ``Model``, ``NodeId``
    and ``Cluster``, ``.+`` for ``SessionName``, which so still requires the label Ray adds to
    every metric); ``$__range`` becomes ``30m``, ``$__rate_interval`` ``1m`` and ``$__interval``
    ``15s``. The dashboard should be made without global filter overrides (as the checked-in
    one is): Ray's standard one, ``ray_io_cluster=~"$Cluster"``, then matches every series.

    Args:
        dashboard_json: The dashboard, e.g. :func:`grafana_dashboard`'s result.
        substitutions: Values for variables, by name without the ``$`` (``{"Model":
            "classifier", "__range": "5m"}``), over the defaults above.

    Returns:
        ``(panel title, query)`` for every target of every panel, those in collapsed rows
        included, in the dashboard's order.

    Raises:
        ValueError: A query uses a variable that is neither the dashboard's nor Grafana's
            built-in ones above, nor in ``substitutions``.
    """
    dashboard = json.loads(dashboard_json)
    values = dict(_BUILTINS)
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            values[variable["name"]] = variable.get("allValue") or ".*"
    values.update(substitutions or {})

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise ValueError(f"unknown Grafana variable ${name} in {match.string!r}")
        return values[name]

    panels: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return [
        (panel["title"], _VARIABLE.sub(substitute, target["expr"]))
        for panel in panels
        for target in panel.get("targets", [])
    ]
