"""The chart's monitoring objects: the ServiceMonitor, PodMonitor, PrometheusRule and dashboard
ConfigMap, off by default, in the monitoring.coreos.com/v1 shapes when enabled; every metric the
alerts and the dashboard query is one a real node or the operator exports."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_quorum_operator.opmetrics import QUORUM_GAUGES
from kafka_quorum_operator.resources import labels
from monitoring import (
    PROMETHEUS_SERIES,
    chart_objects,
    metric_names,
    node_names,
    one,
    operator_names,
)
from proc_cluster import FAST, ProcessCluster
from test_kq_helm import HELM

needs_helm = pytest.mark.skipif(HELM is None, reason="helm not installed "
                                "(python helm/fetch_helm.py .venv/bin)")
MONITORING = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
ALL_ON = ("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
          "metrics.prometheusRule.enabled=true", "metrics.dashboard.enabled=true")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """What a real node (a one-node quorum, leader) and the operator export."""
    cluster = ProcessCluster.create(tmp_path_factory.mktemp("node"), 1, **FAST)
    try:
        cluster.start_all()
        cluster.wait_for_leader()
        yield node_names(cluster.nodes[1].url) | operator_names() | PROMETHEUS_SERIES
    finally:
        cluster.stop_all()


@needs_helm
def test_monitoring_is_off_by_default() -> None:
    objects = chart_objects()
    assert not [o for o in objects if o["kind"] in MONITORING]
    assert not [o for o in objects if o["kind"] == "ConfigMap"
                and "grafana_dashboard" in o["metadata"]["labels"]]


@needs_helm
def test_the_service_monitor_scrapes_the_operators_metrics_service() -> None:
    objects = chart_objects("metrics.serviceMonitor.enabled=true",
                            "metrics.serviceMonitor.labels.release=prometheus")
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kafka-quorum-system"]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" == service["spec"]["ports"][0]["name"]
    # The per-quorum series keep their namespace label.
    assert endpoint["honorLabels"] is True
    with pytest.raises(RuntimeError, match=r"needs metrics\.enabled"):
        chart_objects("metrics.serviceMonitor.enabled=true", "metrics.enabled=false")


@needs_helm
def test_the_pod_monitor_selects_the_node_pods_the_operator_creates() -> None:
    monitor = one(chart_objects("metrics.podMonitor.enabled=true",
                                "watchNamespaces={team-a,team-b}"), "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels("any").items()
    assert "app.kubernetes.io/instance" not in selector  # every quorum
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    # The node pod's port that serves /metrics (resources.pod: the client listener).
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == \
        ("client", "/metrics", "https")
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
            "targetLabel": "quorum"} in endpoint["relabelings"]
    wide = one(chart_objects("metrics.podMonitor.enabled=true", "clusterWide=true",
                             "metrics.podMonitor.scheme=http"), "PodMonitor")
    assert wide["spec"]["namespaceSelector"] == {"any": True}
    assert wide["spec"]["podMetricsEndpoints"][0]["scheme"] == "http"


@needs_helm
def test_all_monitoring_objects_lint_and_render(tmp_path: Path) -> None:
    assert HELM is not None
    values = tmp_path / "values.yaml"
    values.write_text("metrics:\n" + "".join(
        f"  {v.split('.')[1]}:\n    enabled: true\n" for v in ALL_ON))
    done = subprocess.run([HELM, "lint", "--strict", "-f", str(values),
                           str(Path(__file__).parents[2] / "helm" / "kafka-quorum-operator")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = [o["kind"] for o in chart_objects(*ALL_ON)]
    assert all(kinds.count(kind) == 1 for kind in MONITORING)
    with pytest.raises(RuntimeError, match="helm template failed"):
        chart_objects("metrics.podMonitor.scheme=ftp")
    with pytest.raises(RuntimeError, match="helm template failed"):
        chart_objects("metrics.prometheusRule.noLeaderFor=soon")


@needs_helm
def test_the_alert_rules_read_only_exported_metrics(exported: set[str]) -> None:
    rule = one(chart_objects("metrics.prometheusRule.enabled=true"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert sorted(r["alert"] for r in rules) == [
        "KafkaQuorumBackupTooOld", "KafkaQuorumLost", "KafkaQuorumNoLeader",
        "KafkaQuorumRemediationStuck", "KafkaQuorumVoterChangePending",
        "KafkaQuorumVoterLagging"]
    read = {name for r in rules for name in metric_names(r["expr"])}
    assert read and not read - exported, sorted(read - exported)


@needs_helm
def test_the_dashboard_queries_only_exported_metrics(exported: set[str]) -> None:
    config_map = one(chart_objects("metrics.dashboard.enabled=true"), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["kafka-quorum.json"])
    expressions = [target["expr"] for panel in dashboard["panels"]
                   for target in panel.get("targets", [])]
    expressions += [variable["query"]["query"] for variable in dashboard["templating"]["list"]
                    if isinstance(variable.get("query"), dict)]
    assert len(expressions) > 20
    read = {name for expression in expressions for name in metric_names(expression)}
    assert {"quorum_current_leader", "quorum_voter_lag_seconds",
            "kafka_quorum_operator_reconciles_total"} <= read
    assert not read - exported, sorted(read - exported)


@needs_helm
def test_per_quorum_operator_gauges_are_read_with_max_not_summed() -> None:
    """Every operator replica is scraped (the ServiceMonitor selects them all); only the Lease's
    holder exports a quorum's gauges, but during a handover both may for a moment: the alerts
    and the dashboard take the max by quorum, which counts the quorum once."""
    objects = chart_objects("metrics.prometheusRule.enabled=true",
                            "metrics.dashboard.enabled=true")
    rule = one(objects, "PrometheusRule")
    expressions = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    dashboard = json.loads(one(objects, "ConfigMap")["data"]["kafka-quorum.json"])
    expressions += [target["expr"] for panel in dashboard["panels"]
                    for target in panel.get("targets", [])]
    gauges = {gauge._name for gauge in QUORUM_GAUGES}
    reading = [e for e in expressions if metric_names(e) & gauges]
    assert len(reading) >= 6, reading
    for expression in reading:
        for name in metric_names(expression) & gauges:
            assert re.search(r"\bmax by \((namespace, )?name\) \(" + name, expression), \
                expression


def test_metric_names_are_read_from_promql() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (quorum, le) (rate(quorum_commit_latency_seconds_bucket'
        '{namespace="$namespace", quorum=~"$quorum"}[$__rate_interval])))') == \
        {"quorum_commit_latency_seconds_bucket"}
    assert metric_names('time() - max by (name) (a_b{x="y z"}) > 1e3 or on (n) up == 0') == \
        {"a_b", "up"}
    assert metric_names("label_values(quorum_current_epoch{namespace=\"$namespace\"}, "
                        "quorum)") == {"quorum_current_epoch"}
