"""The chart's alert rules against what a real quorum exports: three node processes on loopback,
scraped in a healthy state and in failing ones, and the operator's metrics while it runs a quorum
(backups to moto's S3 server, a replaced volume, a majority of volumes lost) on the emulated
cluster of tests/operator; each state's scrapes become ``promtool test rules`` input series
(held for an hour, as a quorum stuck in that state would be), and the test asserts which alerts
fire in each.

The series carry the labels the chart's PodMonitor gives them (namespace, quorum from the pod's
app.kubernetes.io/instance, pod), and ``up`` is 0 for a node that does not answer, as Prometheus
records it. promtool is built from the Go module proxy by ``bash e2e/promtool/build.sh`` (cached;
a CI step of its own); without it the test skips.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka_quorum_operator import KIND
from kafka_quorum_operator.kube import path
from kafka_quorum_operator.reconcile import CR_API
from kq_cluster import NAME, running_cluster
from kq_harness import NAMESPACE as OPERATOR_NAMESPACE
from kq_harness import condition, quorum_object
from monitoring import ROOT, chart_objects, one, scrape
from proc_cluster import FAST, ProcessCluster, http_json
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_kq_backup import BUCKET, CREDENTIALS, SECRET, s3_endpoint
from test_kq_helm import HELM

from quorum_node.storage.meta_properties import format_log_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAMESPACE, QUORUM = "quorum", "metadata"
HELD_MINUTES = 60  # each state's series span this long; the alerts are read at the end
# Thresholds for a quick test; the `for` durations are the chart's defaults.
BACKUP_MAX_AGE_S = 60
VALUES = ("metrics.prometheusRule.enabled=true", "metrics.prometheusRule.voterLagSeconds=5",
          f"metrics.prometheusRule.backupMaxAgeSeconds={BACKUP_MAX_AGE_S}")
State = tuple[list[dict[str, str]], list[dict[str, Any]]]  # input series, firing alerts
__all__ = ["s3_endpoint"]  # the fixture, from the backup tests


def promtool() -> str | None:
    done = subprocess.run(["bash", str(ROOT / "e2e" / "promtool" / "build.sh"), "--locate"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 else None


PROMTOOL = promtool()
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None or HELM is None,
    reason="promtool not built (bash e2e/promtool/build.sh)" if PROMTOOL is None
    else "helm not installed (python helm/fetch_helm.py .venv/bin)")


def pod(node_id: int) -> str:
    return f"{QUORUM}-{node_id}"


Sample = tuple[str, dict[str, str], float]


def held(samples: list[Sample], target: dict[str, str]) -> list[dict[str, str]]:
    """promtool input series: each sample with the target's labels (the sample's own win, as
    with honorLabels), constant over ``HELD_MINUTES``."""
    out = []
    for name, labels, value in samples:
        selector = ", ".join(f"{k}={json.dumps(v)}" for k, v in
                             sorted({**target, **labels}.items()))
        out.append({"series": f"{name}{{{selector}}}", "values": f"{value!r}+0x{HELD_MINUTES}"})
    return out


def parsed(text: str) -> list[Sample]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def series(scrapes: dict[int, str | None]) -> list[dict[str, str]]:
    """Each node's scrape and ``up``, with the PodMonitor's target labels."""
    out = []
    for node_id, text in sorted(scrapes.items()):
        up: Sample = ("up", {}, 1.0 if text is not None else 0.0)
        out += held([up, *(parsed(text) if text is not None else [])],
                    {"namespace": NAMESPACE, "quorum": QUORUM, "pod": pod(node_id)})
    return out


def operator_series() -> list[dict[str, str]]:
    """The operator's metrics now (the registry its metrics server serves; the operator runs in
    this process), this test's quorum's only. A timestamp keeps its age: promtool's clock reads
    ``HELD_MINUTES`` at the end of the series, so it is moved by as much as that is before now."""
    shift = HELD_MINUTES * 60 - time.time()
    samples = [(name, labels, value + shift if name.endswith("_timestamp_seconds") else value)
               for name, labels, value in parsed(generate_latest(REGISTRY).decode())
               if name.startswith("kafka_quorum_operator_")
               and labels.get("namespace", OPERATOR_NAMESPACE) == OPERATOR_NAMESPACE
               and labels.get("name", NAME) == NAME]
    return held(samples, {"namespace": OPERATOR_NAMESPACE, "pod": "kafka-quorum-operator"})


def firing(*alerts: tuple[str, str, dict[str, str]]) -> list[dict[str, Any]]:
    """ALERTS samples of firing alerts: (name, severity, the labels its expression keeps)."""
    return [{"labels": "ALERTS{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(
        {"alertname": name, "alertstate": "firing", "severity": severity, **labels}.items()))
        + "}", "value": 1} for name, severity, labels in alerts]


def check(tmp_path: Path, states: dict[str, State]) -> None:
    """``promtool test rules``: in each state, exactly the expected alerts fire."""
    assert PROMTOOL is not None
    rule = one(chart_objects(*VALUES), "PrometheusRule")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests = {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [
        {"name": state, "interval": "1m", "input_series": input_series,
         "promql_expr_test": [{"expr": 'ALERTS{alertstate="firing"}',
                               "eval_time": f"{HELD_MINUTES}m", "exp_samples": expected}]}
        for state, (input_series, expected) in states.items()]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def scrape_all(cluster: ProcessCluster, node_ids: list[int]) -> dict[int, str | None]:
    """Each node's /metrics; None for one that does not answer (stopped or paused)."""
    out: dict[int, str | None] = {}
    for node_id in node_ids:
        try:
            out[node_id] = scrape(cluster.nodes[node_id].url)
        except OSError:
            out[node_id] = None
    return out


def wait(what: str, check_: Any, cluster: ProcessCluster, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check_()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.logs()}")


def quorum(cluster: ProcessCluster, node_id: int) -> dict[str, Any]:
    described = cluster.quorum(node_id)
    assert described is not None
    return described


@needs_promtool
def test_which_alerts_fire_in_each_state_of_a_real_quorum(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    cluster = ProcessCluster.create(tmp_path / "nodes", 3, **FAST)
    every = [1, 2, 3]
    states: dict[str, State] = {}
    try:
        cluster.start_all()
        cluster.wait_all_serving()
        leader = cluster.wait_for_leader()
        http_json("POST", f"{cluster.nodes[leader].url}/v1/records", ["a", "b", "c"])
        followers = [i for i in every if i != leader]

        # Healthy: every voter caught up (the leader knows each one's directory from its
        # fetches), nothing fires.
        def caught_up() -> bool:
            voters = quorum(cluster, leader)["voters"]
            return len(voters) == 3 and all(v["directory_id"] for v in voters)

        wait("every voter to fetch", caught_up, cluster)
        states["healthy"] = (series(scrape_all(cluster, every)), [])

        # A voter down: the leader reports it further behind every second.
        lagging, other = followers
        cluster.kill(lagging)
        time.sleep(7)
        lag = firing(("KafkaQuorumVoterLagging", "warning",
                      {"namespace": NAMESPACE, "quorum": QUORUM, "voter_id": str(lagging)}))
        states["a voter down"] = (series(scrape_all(cluster, every)), lag)

        # Its volume replaced (a new directory): it comes back as an observer; AddVoter of the
        # new directory waits for it to catch up, which it cannot while paused.
        log_dir = tmp_path / "nodes" / f"node-{lagging}"
        shutil.rmtree(log_dir)
        format_log_dir(log_dir, cluster.cluster_id, lagging)
        cluster.start(lagging)

        def observer() -> str | None:
            return next((o["directory_id"] for o in quorum(cluster, leader)["observers"]
                         if o["id"] == lagging and o["could_be_voter"]), None)

        directory = wait("the new volume to fetch as an observer", observer, cluster)
        cluster.signal(lagging, signal.SIGSTOP)
        time.sleep(2)  # beyond the catch-up window (the fetch timeout)
        adding = threading.Thread(target=_add_voter, daemon=True, args=(
            f"{cluster.nodes[leader].url}/v1/quorum/voters",
            {"id": lagging, "directory_id": directory, "timeout_ms": 600000}))
        adding.start()

        def pending() -> bool:
            text = scrape(cluster.nodes[leader].url)
            return "quorum_pending_add_voter 1.0" in text

        wait("the AddVoter to be pending", pending, cluster)
        states["a voter change that cannot finish"] = (series(scrape_all(cluster, every)), [
            *lag, *firing(("KafkaQuorumVoterChangePending", "warning",
                           {"namespace": NAMESPACE, "quorum": QUORUM}))])

        # A majority down: the leader steps down (check-quorum); no node leads.
        cluster.kill(other)

        def leaderless() -> bool:
            text = scrape(cluster.nodes[leader].url)
            return 'quorum_current_state{state="leader"} 0.0' in text

        wait("the leader to step down", leaderless, cluster)
        states["a majority down"] = (series(scrape_all(cluster, every)), firing(
            ("KafkaQuorumNoLeader", "critical", {"namespace": NAMESPACE, "quorum": QUORUM})))
    finally:
        cluster.stop_all()
    check(tmp_path, states)


def _add_voter(url: str, body: dict[str, Any]) -> None:
    """AddVoter, which does not finish here: the node is stopped under it at the end."""
    with contextlib.suppress(OSError):  # urllib's HTTPError too
        http_json("POST", url, body, timeout_s=600)


@needs_promtool
async def test_which_operator_alerts_fire_on_the_operators_metrics(
        tmp_path: Path, s3_endpoint: str) -> None:
    """A quorum backed up once (the next one an hour away), then a volume replaced (the new
    replica must be caught up for an hour first: the remediation stays in progress), then a
    second voter's volume lost (a majority): the operator's own metrics in each state."""
    states: dict[str, State] = {}
    quorum = {"namespace": OPERATOR_NAMESPACE, "name": NAME}
    async with running_cluster(tmp_path, KQ_OPERATOR_INTERVAL="0.5") as cluster:
        await cluster.kube.create(path("Secret", OPERATOR_NAMESPACE), {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": OPERATOR_NAMESPACE},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in CREDENTIALS.items()}})
        backup = {"intervalSeconds": 3600, "target": {
            "endpoint": s3_endpoint, "bucket": BUCKET, "credentialsSecret": SECRET}}
        await cluster.kube.create(path(KIND, OPERATOR_NAMESPACE, api=CR_API), quorum_object(
            NAME, 3, backup=backup, remediation={"minCaughtUpSeconds": 3600}))
        await cluster.ready_with(3)

        async def backed_up() -> float | None:
            taken = ((await cluster.status()).get("backup") or {}).get("lastTime")
            return _seconds(taken) if taken else None

        taken_at = await cluster.wait("a backup", backed_up, 90)
        assert time.time() - taken_at < BACKUP_MAX_AGE_S / 2, "the backup took too long"
        states["operator: a fresh backup"] = (operator_series(), [])

        leader = await cluster.leader()
        replaced = next(i for i in (1, 2, 3) if i != leader)
        await cluster.wipe(replaced)

        async def remediating() -> bool:
            last = (await cluster.status()).get("lastRemediation") or {}
            return last.get("result") == "InProgress" and last.get("nodeId") == replaced

        await cluster.wait("the replacement to begin", remediating, 90)
        await _until_older_than(taken_at, BACKUP_MAX_AGE_S)
        states["operator: a replacement in progress, the backup old"] = (operator_series(), [
            *firing(("KafkaQuorumRemediationStuck", "warning", quorum),
                    ("KafkaQuorumBackupTooOld", "warning", quorum))])

        await cluster.wipe(next(i for i in (1, 2, 3) if i not in (leader, replaced)))

        async def lost() -> bool:
            return condition(await cluster.get(), "QuorumLost") == "True"

        await cluster.wait("the quorum to be lost", lost, 90)
        still = await remediating()
        states["operator: a majority of volumes lost"] = (operator_series(), [
            *firing(("KafkaQuorumLost", "critical", quorum),
                    ("KafkaQuorumBackupTooOld", "warning", quorum)),
            *(firing(("KafkaQuorumRemediationStuck", "warning", quorum)) if still else [])])
    check(tmp_path, states)


def _seconds(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def _until_older_than(moment: float, seconds: float) -> None:
    await asyncio.sleep(max(0.0, moment + seconds + 1 - time.time()))
