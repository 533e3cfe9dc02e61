"""``deployments/prometheus/``: the Prometheus rules are valid, unit-tested, and speak the contract.

* **promtool.** ``promtool check rules`` accepts the rules file, ``promtool test rules`` passes
  its unit tests (each alert fires on series that should trigger it and not on healthy ones or
  short blips; each recording rule's value), and ``promtool check config`` accepts the example
  ``prometheus.yml``. promtool is Debian's ``prometheus`` package (``make test`` installs it);
  without it these tests fail, saying so, as the browser tests do without Chromium.
* **Names.** Every ``ray_triton_shm_*`` and ``nv_*`` name the rules use (expressions and
  annotations) is one of the metrics the node actor and Triton export, every ``kind`` /
  ``reason`` / ``direction`` value one they set, and every recorded name used is recorded:
  promtool cannot tell a misspelt metric from one that is merely absent.
* **Alerts.** Each is named ``TritonShm...``, has a severity and a summary, description and
  runbook (what it means, what to check, what to do), and the unit tests make it fire and stay
  quiet; each recording rule is checked by a unit test.

Each check is shown to catch a broken copy. Nothing here starts Triton or Ray.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ray_triton_shm._exceptions import ERROR_KINDS

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deployments" / "prometheus"
RULES = PROMETHEUS / "ray-triton-shm-rules.yaml"
RULES_TEST = PROMETHEUS / "ray-triton-shm-rules.test.yaml"
CONFIG = PROMETHEUS / "prometheus.yml"

# ---- the contract: what the node actor and Triton export, as Prometheus sees it ------------

_COUNTERS = (
    "requests",
    "samples",
    "input_bytes",
    "output_bytes",
    "errors",
    "abandoned_requests",
    "layout_changes",
    "pool_resizes",
    "company_waits",
    "company_wait_seconds",
    "triton_restarts",
)
_HISTOGRAMS = (
    "request_duration_seconds",
    "slot_wait_seconds",
    "abandoned_settle_seconds",
    "rows_per_request",
)
_GAUGES = (
    "slots",
    "slots_max",
    "slots_in_use",
    "callers_waiting",
    "slots_abandoned",
    "growth_limited",
    "transport",
    "triton_up",
    "node_actor_start_time_seconds",
    "dead_owner_regions",
)
#: Every series name of the library's metrics (Ray prefixes ``ray_``), and the histograms'
#: base names (which runbooks may name).
LIBRARY_NAMES = frozenset(
    [f"ray_triton_shm_{c}_total" for c in _COUNTERS]
    + [f"ray_triton_shm_{h}{s}" for h in _HISTOGRAMS for s in ("", "_bucket", "_sum", "_count")]
    + [f"ray_triton_shm_{g}" for g in _GAUGES]
)
#: Triton's own metrics the rules may use.
TRITON_NAMES = frozenset(
    {
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_request_success",
        "nv_inference_count",
    }
)
#: The values of the library's labels with a fixed set of them.
LABEL_VALUES = {
    "kind": frozenset(ERROR_KINDS),
    "reason": frozenset({"max_slots", "shm_budget", "shm_full"}),
    "direction": frozenset({"grow", "shrink"}),
    "transport": frozenset({"shm", "inline"}),
}
SEVERITIES = frozenset({"critical", "warning", "info"})
#: What the runbooks, together, must tell the reader to run and to set.
RUNBOOK_MUST_NAME = (
    "`ray-triton-shm doctor",
    "`ray-triton-shm status --ray`",
    "`ray-triton-shm reclaim`",
    "max_slots",
    "max_waiting",
    "shm_budget_bytes",
)

# A metric name where it starts a word (not inside a recorded name, after its level's colon).
_METRIC = re.compile(r"(?<![\w:])(?:ray_triton_shm_|nv_)\w+")
_RECORDED = re.compile(r"(?<![\w:])[a-z_]+:[a-z0-9_]+:[a-z0-9_]+(?![\w:])")
_RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")
_MATCHER = re.compile(r"\b(kind|reason|direction|transport)\s*(=~|!~|=|!=)\s*\"([^\"]*)\"")
_TEMPLATE_LABEL = re.compile(r"\$labels\.(\w+)")
_ALERTS_LABELS = re.compile(r"(\w+)=\"([^\"]*)\"")

Rules = dict[str, Any]


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _rules(doc: Rules) -> list[dict[str, Any]]:
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alerts(doc: Rules) -> list[dict[str, Any]]:
    return [r for r in _rules(doc) if "alert" in r]


def _records(doc: Rules) -> list[dict[str, Any]]:
    return [r for r in _rules(doc) if "record" in r]


def _texts(rule: dict[str, Any]) -> list[str]:
    """The rule's expression and annotations: where metric names appear."""
    return [str(rule["expr"]), *map(str, rule.get("annotations", {}).values())]


# ---- the checks --------------------------------------------------------------------------


def name_problems(doc: Rules) -> list[str]:
    """Names and label values the rules use that nothing exports or records, one line each."""
    problems = []
    recorded = {r["record"] for r in _records(doc)}
    for rule in _rules(doc):
        where = rule.get("alert") or rule["record"]
        if "record" in rule and not _RECORD_NAME.match(rule["record"]):
            problems.append(f"{where}: not named level:metric:operations")
        if "alert" in rule and not rule["alert"].startswith("TritonShm"):
            problems.append(f"{where}: an alert's name does not start with TritonShm")
        for text in _texts(rule):
            for name in _METRIC.findall(text):
                if name not in LIBRARY_NAMES | TRITON_NAMES:
                    problems.append(f"{where}: {name} is no metric of the library or Triton")
            for name in _RECORDED.findall(text):
                if name not in recorded:
                    problems.append(f"{where}: {name} is not recorded by these rules")
            for label, op, value in _MATCHER.findall(text):
                values = value.split("|") if "~" in op else [value]
                for v in values:
                    if v not in LABEL_VALUES[label]:
                        problems.append(f"{where}: {label}={v!r} is not a value the library sets")
    return problems


def alert_problems(doc: Rules) -> list[str]:
    """Alerts without a severity or without what an on-call reader needs, one line each."""
    problems = []
    for alert in _alerts(doc):
        name = alert["alert"]
        severity = alert.get("labels", {}).get("severity")
        if severity not in SEVERITIES:
            problems.append(f"{name}: severity {severity!r} is not one of {sorted(SEVERITIES)}")
        annotations = alert.get("annotations", {})
        for key in ("summary", "description", "runbook"):
            if not str(annotations.get(key, "")).strip():
                problems.append(f"{name}: no {key} annotation")
        runbook = str(annotations.get("runbook", ""))
        for part in ("Meaning:", "Check:", "Do:"):
            if runbook and part not in runbook:
                problems.append(f"{name}: its runbook does not say {part!r}")
    runbooks = " ".join(str(a.get("annotations", {}).get("runbook", "")) for a in _alerts(doc))
    for must in RUNBOOK_MUST_NAME:
        if must not in " ".join(runbooks.split()):
            problems.append(f"no runbook names {must}")
    return problems


def _firing_labels(tests: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """``{alert: [labels of each firing ALERTS sample the unit tests expect]}``."""
    firing: dict[str, list[dict[str, str]]] = {}
    for case in tests["tests"]:
        for expr_test in case.get("promql_expr_test", []):
            for sample in expr_test.get("exp_samples") or []:
                if not sample["labels"].startswith("ALERTS{"):
                    continue
                labels = dict(_ALERTS_LABELS.findall(sample["labels"]))
                if labels.get("alertstate") == "firing":
                    firing.setdefault(labels["alertname"], []).append(labels)
    return firing


def coverage_problems(doc: Rules, tests: dict[str, Any]) -> list[str]:
    """Alerts and records the unit tests leave unchecked, one line each: each alert must be
    expected to fire (an ALERTS sample) and not to (an empty ``exp_alerts``), with every label
    its annotations name; each record must be in a ``promql_expr_test``."""
    problems = []
    firing = _firing_labels(tests)
    quiet = {
        t["alertname"]
        for case in tests["tests"]
        for t in case.get("alert_rule_test", [])
        if not t.get("exp_alerts")
    }
    exprs = " ".join(
        str(t["expr"]) for case in tests["tests"] for t in case.get("promql_expr_test", [])
    )
    for alert in _alerts(doc):
        name = alert["alert"]
        if name not in firing:
            problems.append(f"{name}: no unit test makes it fire")
        if name not in quiet:
            problems.append(f"{name}: no unit test checks that it stays quiet")
        used = set(_TEMPLATE_LABEL.findall(" ".join(_texts(alert)[1:])))
        for labels in firing.get(name, []):
            missing = sorted(used - set(labels))
            if missing:
                problems.append(f"{name}: its annotations name labels it lacks: {missing}")
    for record in _records(doc):
        if not re.search(rf"(?<![\w:]){re.escape(record['record'])}(?![\w:])", exprs):
            problems.append(f"{record['record']}: no unit test checks its value")
    return problems


# ---- promtool ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: apt-get install prometheus (make test does)")
    return found


def _promtool(promtool: str, *args: str | Path, cwd: Path = PROMETHEUS) -> str:
    """``promtool args``: its output; fails the test, with that output, if it fails."""
    done = subprocess.run(
        [promtool, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def test_promtool_accepts_the_rules(promtool: str) -> None:
    output = _promtool(promtool, "check", "rules", RULES)
    assert f"SUCCESS: {len(_rules(_load(RULES)))} rules found" in output


def test_the_unit_tests_of_the_rules_pass(promtool: str) -> None:
    assert "SUCCESS" in _promtool(promtool, "test", "rules", RULES_TEST.name)


@pytest.mark.parametrize("first", ["records", "alerts"])
def test_the_unit_tests_pass_in_either_group_order(
    promtool: str, tmp_path: Path, first: str
) -> None:
    """Prometheus evaluates groups independently (promtool in any order): an alert on a record
    may see it one evaluation late. The unit tests hold with the alerts' group first or last."""
    groups = [g["name"] for g in _load(RULES)["groups"]]
    assert len(groups) == 2
    tests = _load(RULES_TEST)
    tests["group_eval_order"] = sorted(groups, key=lambda g: not g.endswith(f".{first}"))
    (tmp_path / RULES_TEST.name).write_text(yaml.safe_dump(tests, sort_keys=False))
    shutil.copy(RULES, tmp_path)
    assert "SUCCESS" in _promtool(promtool, "test", "rules", RULES_TEST.name, cwd=tmp_path)


def test_promtool_accepts_the_example_config(promtool: str) -> None:
    config = _load(CONFIG)
    assert config["rule_files"] == [RULES.name]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["ray"]["file_sd_configs"] == [
        {"files": ["/tmp/ray/prom_metrics_service_discovery.json"]}
    ]
    assert jobs["triton"]["static_configs"] == [{"targets": ["localhost:8002"]}]
    _promtool(promtool, "check", "config", CONFIG.name)


def test_the_unit_tests_catch_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    """A copy whose Triton-down alert waits 10 minutes instead of 1 fails the unit tests."""
    doc = _load(RULES)
    (down,) = (a for a in _alerts(doc) if a["alert"] == "TritonShmTritonDown")
    down["for"] = "10m"
    (tmp_path / RULES.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(RULES_TEST, tmp_path)
    done = subprocess.run(
        [promtool, "test", "rules", RULES_TEST.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "TritonShmTritonDown" in done.stdout + done.stderr


# ---- names, alerts, coverage -------------------------------------------------------------


def test_the_rules_use_only_the_contract_names() -> None:
    assert name_problems(_load(RULES)) == []


def test_the_contract_is_every_metric_the_node_actor_exports() -> None:
    """The names here are those of ``ray_triton_shm/ray/_metrics.py``, no more, no fewer."""
    pytest.importorskip("ray")
    from ray_triton_shm.ray._metrics import METRICS

    suffixes = {"histogram": ("", "_bucket", "_sum", "_count")}
    exported = {m.prometheus + s for m in METRICS for s in suffixes.get(m.kind, ("",))}
    assert exported == LIBRARY_NAMES


def test_every_alert_has_a_severity_and_a_runbook() -> None:
    assert alert_problems(_load(RULES)) == []


def test_every_alert_and_record_is_unit_tested() -> None:
    assert coverage_problems(_load(RULES), _load(RULES_TEST)) == []


def _alert(doc: Rules, name: str) -> dict[str, Any]:
    return next(a for a in _alerts(doc) if a["alert"] == name)


def _record(doc: Rules, name: str) -> dict[str, Any]:
    return next(r for r in _records(doc) if r["record"] == name)


def _replace(rule: dict[str, Any], old: str, new: str) -> None:
    assert old in rule["expr"]
    rule["expr"] = rule["expr"].replace(old, new)


BROKEN: dict[str, tuple[Callable[[Rules], Any], Callable[[Rules], list[str]], str]] = {
    "a misspelt metric": (
        lambda d: _replace(
            _alert(d, "TritonShmSlotsAbandoned"), "slots_abandoned", "slot_abandoned"
        ),
        name_problems,
        "ray_triton_shm_slot_abandoned is no metric",
    ),
    "a counter without _total": (
        lambda d: _replace(
            _record(d, "model_node:ray_triton_shm_requests:rate5m"), "requests_total", "requests"
        ),
        name_problems,
        "ray_triton_shm_requests is no metric",
    ),
    "a misspelt Triton metric": (
        lambda d: _replace(
            _record(d, "instance_model:nv_inference_queue_seconds_per_request:rate5m"),
            "nv_inference_queue_duration_us",
            "nv_inference_queue_duration_ms",
        ),
        name_problems,
        "nv_inference_queue_duration_ms is no metric",
    ),
    "a misspelt error kind": (
        lambda d: _replace(_alert(d, "TritonShmTritonRefusesKeys"), "access_denied", "denied"),
        name_problems,
        "kind='denied' is not a value",
    ),
    "a record used but not recorded": (
        lambda d: _replace(
            _alert(d, "TritonShmSlotWaitHigh"), "slot_wait_seconds:p99_5m", "slot_wait:p99_5m"
        ),
        name_problems,
        "model_node:ray_triton_shm_slot_wait:p99_5m is not recorded",
    ),
    "an alert named otherwise": (
        lambda d: _alert(d, "TritonShmTritonDown").update(alert="TritonDown"),
        name_problems,
        "does not start with TritonShm",
    ),
    "no runbook": (
        lambda d: _alert(d, "TritonShmOverloaded")["annotations"].pop("runbook"),
        alert_problems,
        "TritonShmOverloaded: no runbook annotation",
    ),
    "no severity": (
        lambda d: _alert(d, "TritonShmDeadOwnerRegions").pop("labels"),
        alert_problems,
        "TritonShmDeadOwnerRegions: severity None",
    ),
    "a runbook that says not what to do": (
        lambda d: _alert(d, "TritonShmSlotsAbandoned")["annotations"].update(
            runbook="Meaning: slots are lost. Check: the logs."
        ),
        alert_problems,
        "does not say 'Do:'",
    ),
    "an alert without a test": (
        lambda d: d["groups"][1]["rules"].append(
            {"alert": "TritonShmNew", "expr": "vector(1)", "labels": {"severity": "info"}}
        ),
        lambda d: coverage_problems(d, _load(RULES_TEST)),
        "TritonShmNew: no unit test makes it fire",
    ),
    "a label the alert lacks": (
        lambda d: _alert(d, "TritonShmTritonDown")["annotations"].update(
            summary="Triton for {{ $labels.model }} does not answer"
        ),
        lambda d: coverage_problems(d, _load(RULES_TEST)),
        "TritonShmTritonDown: its annotations name labels it lacks: ['model']",
    ),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_copy_is_caught(broken: str) -> None:
    change, check, expected = BROKEN[broken]
    doc = copy.deepcopy(_load(RULES))
    change(doc)
    problems = check(doc)
    assert any(expected in p for p in problems), problems


def test_promtool_alone_misses_a_misspelt_metric(promtool: str, tmp_path: Path) -> None:
    """Why the name check exists: promtool accepts a rule on a metric nothing exports."""
    doc = copy.deepcopy(_load(RULES))
    _replace(_alert(doc, "TritonShmSlotsAbandoned"), "slots_abandoned", "slot_abandoned")
    broken = tmp_path / RULES.name
    broken.write_text(yaml.safe_dump(doc, sort_keys=False))
    _promtool(promtool, "check", "rules", broken)
    assert name_problems(doc)
