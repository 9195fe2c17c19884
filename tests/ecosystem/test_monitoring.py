"""The chart's Grafana dashboard and Prometheus alerts, checked by Prometheus's own tools.

Every alert is exercised by ``promtool test rules`` (promtool built from Prometheus's Go
module) on series shaped like the ones the operator and the drivers export; every dashboard
query is parsed by Prometheus's PromQL parser and may only name metrics the code exports
(read from eop_operator.metrics and eop_spark.runtime.metrics now, so a renamed metric fails here).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.charts.test_chart import Helm, render
from tests.ecosystem.tools import exported_metrics, promql_metrics, series_names, tool

pytestmark = pytest.mark.ecosystem

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "eop"
RULES = CHART / "rules" / "eop-alerts.yaml"
RULES_TEST = Path(__file__).with_name("promtool") / "eop-alerts-test.yaml"
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
#: Labels Prometheus adds to a scraped series (the target's), not the exporter's own.
TARGET_LABELS = {"job", "instance", "pod", "container", "endpoint", "service"}
#: What Grafana puts in place of the dashboard's variables before it queries.
VARIABLES = {"$__rate_interval": "1m", "$namespace": "shop", "$pipeline": "orders"}


def alerts() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tool("promtool")), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_every_alert_fires_as_tested_by_promtool() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", str(RULES_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    names = {a["alert"] for a in alerts()}
    assert names == {
        "EopPipelineDegraded",
        "EopPipelineStalled",
        "EopPipelineLagGrowing",
        "EopDriverCrashLooping",
        "EopTransactionsFenced",
        "EopPipelineStuck",
        "EopHealthChecksFailing",
        "EopReconcileFailing",
        "EopNoOperatorLeader",
    }
    cases = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {t["alertname"] for case in cases for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == names  # each alert is seen firing (and not firing) in a test


def own_labels() -> dict[str, set[str]]:
    """Each exported sample name and the labels the code gives it."""
    from prometheus_client.parser import text_string_to_metric_families

    from eop_operator import metrics as operator_metrics
    from eop_spark.runtime.metrics import Counters

    labels: dict[str, set[str]] = {}
    for value in vars(operator_metrics).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name
            kind = value._type
            names = set(value._labelnames)
            if kind == "counter":
                labels[f"{name}_total"] = names
            elif kind == "histogram":
                labels.update({f"{name}_bucket": names | {"le"}, f"{name}_count": names})
                labels[f"{name}_sum"] = names
            else:
                labels[name] = names
    for family in text_string_to_metric_families(Counters().render_prometheus("ns.p")):
        for sample in family.samples:
            # The PodMonitor adds the driver pod's namespace.
            labels[sample.name] = set(sample.labels) | {"namespace"}
    return labels


def test_the_alert_tests_use_series_shaped_like_the_exported_ones() -> None:
    exported = own_labels()
    assert set(exported) == exported_metrics()
    cases = yaml.safe_load(RULES_TEST.read_text())["tests"]
    series = [s["series"] for case in cases for s in case["input_series"]]
    assert series_names(RULES_TEST.read_text()) <= set(exported)
    for text in series:
        name, _, body = text.partition("{")
        found = set(re.findall(r'(\w+)="', body))
        assert found - TARGET_LABELS == exported[name], text


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL query of a dashboard (label_values(...) variables: their selector)."""
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.*), *\w+\)", variable["definition"])
            assert match, variable["definition"]
            exprs.append(match.group(1))
    for name, value in VARIABLES.items():
        exprs = [e.replace(name, value) for e in exprs]
    assert all("$" not in e for e in exprs), [e for e in exprs if "$" in e]
    return exprs


def test_every_dashboard_query_parses_and_uses_exported_metrics() -> None:
    assert DASHBOARDS, "no dashboard in charts/eop/dashboards"
    exported = exported_metrics()
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        queries = dashboard_queries(dashboard)
        verdicts = promql_metrics(queries)
        errors = [(v["expr"], v["error"]) for v in verdicts if v.get("error")]
        assert errors == [], f"{path.name}: {errors}"
        used = {name for v in verdicts for name in v["metrics"]}
        assert used - exported == set(), f"{path.name} queries metrics nobody exports"
        # What the dashboard promises to show.
        for metric in (
            "eop_pipeline_lag_records",
            "eop_partition_lag_records",
            "eop_rows_in_total",
            "eop_batch_duration_seconds_bucket",
            "eop_transaction_seconds_bucket",
            "eop_driver_restarts_total",
            "eop_upgrades_total",
            "eop_pipeline_phase",
        ):
            assert metric in used, f"{path.name} does not show {metric}"
    rule_verdicts = promql_metrics([a["expr"] for a in alerts()])
    assert [v.get("error") for v in rule_verdicts if v.get("error")] == []
    assert {n for v in rule_verdicts for n in v["metrics"]} <= exported


def test_the_chart_ships_them_only_when_asked(helm: Helm) -> None:
    default = render(helm)
    assert not [o for o in default if o["kind"] == "PrometheusRule"]
    assert not [o for o in default if o["kind"] == "ConfigMap"]

    objects = render(
        helm,
        "dashboards.enabled=true",
        "prometheusRule.enabled=true",
        "prometheusRule.labels.release=prom",
        "metrics.serviceMonitor.enabled=true",
    )
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())  # {{ $labels }} left to Prometheus
    maps = {
        key: value
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"
        for key, value in o["data"].items()
    }
    assert {k: json.loads(v) for k, v in maps.items()} == {
        p.name: json.loads(p.read_text()) for p in DASHBOARDS
    }
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    # The operator's series name the pipeline's namespace; Prometheus must keep that label.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
