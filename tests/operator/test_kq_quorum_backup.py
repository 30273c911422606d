"""QuorumBackup, an on-demand backup of a KafkaQuorum: the CRD (kept as the KafkaQuorum's is:
strict, structural, the chart's identical copy, its CEL rule), the operator's decisions as a
table, retention that never counts it, and its lifecycle in the operator's harness (the emulated
API server, real node processes, moto's S3 server): taken once from a caught-up follower,
status filled, owned by its quorum; Failed for a quorum without storage or without a
KafkaQuorum. Restore drills (spec.backup.restoreDrill): the Job, when one is due, its outcome;
and in the harness a drill Job run for real (the harness's kubelet runs its pod's command) with
its report in status.backup.lastDrill."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kafka_quorum_operator import API_VERSION, GROUP, KIND, MANAGER, QB_KIND, QB_PLURAL
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.backups import apply_retention
from kafka_quorum_operator.drills import (
    drill_due,
    drill_job,
    drill_location,
    drill_result,
    job_outcome,
)
from kafka_quorum_operator.kube import path
from kafka_quorum_operator.ondemand import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    PENDING,
    RUNNING,
    Step,
    next_step,
)
from kafka_quorum_operator.reconcile import CR_API
from kafka_quorum_operator.spec import RestoreDrill, parse_spec
from kq_cluster import NAME, Cluster
from kq_harness import NAMESPACE, cr_path, quorum_object
from test_kq_backup import BUCKET, CREDENTIALS, SECRET, s3_endpoint
from test_kq_manifests import K8S_VERSION, cel_errors, schema_errors, to_jsonschema, walk

from quorum_node.backup.drill_report import DrillReport
from quorum_node.backup.manifest import MANIFEST_NAME
from quorum_node.backup.store import LocalStore, S3Options, open_store
from quorum_node.client import QuorumClient

__all__ = ["s3_endpoint"]  # the fixture, used here too

ROOT = Path(__file__).resolve().parents[2]
QB_CRD_PATH = ROOT / "crds" / f"{QB_PLURAL}.{GROUP}.yaml"
QB_CHART_CRD = ROOT / "helm" / "kafka-quorum-operator" / "files" / QB_CRD_PATH.name
QB_CRD = yaml.safe_load(QB_CRD_PATH.read_text())
QB_VERSION = QB_CRD["spec"]["versions"][0]
QB_SCHEMA = QB_VERSION["schema"]["openAPIV3Schema"]
QB_VALIDATOR = jsonschema.Draft4Validator(to_jsonschema(QB_SCHEMA))


def qb_errors(obj: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in QB_VALIDATOR.iter_errors(obj)]


# --- the CRD ------------------------------------------------------------------------------------


def test_the_crd_is_valid_structural_and_carried_by_the_chart() -> None:
    kubernetes_validate.validate(QB_CRD, K8S_VERSION, strict=True)
    for where, node in walk(QB_SCHEMA):
        assert "type" in node, f"{where or '(root)'} has no type"
    assert QB_CHART_CRD.read_text() == QB_CRD_PATH.read_text(), \
        f"copy {QB_CRD_PATH.relative_to(ROOT)} to {QB_CHART_CRD.relative_to(ROOT)}"
    spec = QB_CRD["spec"]
    names = spec["names"]
    assert (spec["group"], spec["scope"], names["kind"], names["plural"], names["shortNames"]) \
        == (GROUP, "Namespaced", QB_KIND, QB_PLURAL, ["qbk"])
    assert f"{spec['group']}/{QB_VERSION['name']}" == API_VERSION
    assert QB_VERSION["subresources"] == {"status": {}}
    assert [c["name"] for c in QB_VERSION["additionalPrinterColumns"]
            if not c.get("priority")] == ["Quorum", "Phase", "Location", "Age"]


def test_spec_quorum_is_required_and_immutable() -> None:
    doc = {"apiVersion": API_VERSION, "kind": QB_KIND, "metadata": {"name": "b"},
           "spec": {"quorum": "kq"}}
    assert qb_errors(doc) == []
    assert qb_errors({**doc, "spec": {}}) == ["spec: 'quorum' is a required property"]
    spec_schema = QB_SCHEMA["properties"]["spec"]
    assert cel_errors(spec_schema, {"quorum": "kq"}, {"quorum": "kq"}) == []
    assert cel_errors(spec_schema, {"quorum": "other"}, {"quorum": "kq"}) == [
        "spec.quorum is immutable; create another QuorumBackup"]


def test_the_status_the_operator_writes_fits_the_schema() -> None:
    doc = {"apiVersion": API_VERSION, "kind": QB_KIND, "metadata": {"name": "b"},
           "spec": {"quorum": "kq"}, "status": {
               "phase": COMPLETED, "location": "s3://b/p/C/x-node-2-b",
               "sizeBytes": 1977, "endOffset": 5, "node": 2,
               "startedAt": "2026-01-01T00:00:00Z", "completedAt": "2026-01-01T00:00:01Z",
               "durationSeconds": 1.25}}
    assert qb_errors(doc) == []
    assert qb_errors({**doc, "status": {"phase": "Done"}}) != []


# --- the decisions ------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "storage", "waiting", "slot_free", "running_here", "step"), [
    # New: taken at once when it can be; else Pending, saying why.
    ({}, True, None, True, False, Step(RUNNING, None, take=True)),
    ({}, True, None, False, False,
     Step(PENDING, "waiting: another backup of the quorum is running")),
    ({}, True, "the KafkaQuorum is paused", True, False,
     Step(PENDING, "waiting: the KafkaQuorum is paused")),
    # Pending with the same reason: nothing to write.
    ({"phase": PENDING, "message": "waiting: another backup of the quorum is running"}, True,
     None, False, False, Step()),
    ({"phase": PENDING, "message": "waiting: x"}, True, None, True, False,
     Step(RUNNING, None, take=True)),
    # No storage: Failed, whatever else holds.
    ({}, False, None, True, False,
     Step(FAILED, "its KafkaQuorum has no backup storage configured (spec.backup.target)")),
    ({"phase": PENDING}, False, "the quorum is not running yet", False, False,
     Step(FAILED, "its KafkaQuorum has no backup storage configured (spec.backup.target)")),
    # Running: left to the task that runs it; one nobody here runs was interrupted.
    ({"phase": RUNNING}, True, None, False, True, Step()),
    ({"phase": RUNNING}, True, None, True, False, Step(FAILED, INTERRUPTED)),
    # A list read before this process's own patches (its task just started or finished).
    ({}, True, None, False, True, Step()),
    ({"phase": PENDING}, True, None, True, True, Step()),
    # Final: never retaken, never rewritten.
    ({"phase": COMPLETED}, True, None, True, False, Step()),
    ({"phase": FAILED}, True, None, True, False, Step()),
    ({"phase": COMPLETED}, False, "the quorum has lost its majority", False, False, Step()),
])
def test_next_step(status: dict[str, Any], storage: bool, waiting: str | None, *,
                   slot_free: bool, running_here: bool, step: Step) -> None:
    assert next_step(status, storage=storage, waiting=waiting, slot_free=slot_free,
                     running_here=running_here) == step


def test_retention_never_counts_nor_deletes_an_on_demand_backup(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    scheduled = ["20260101T000000Z-node-2", "20260101T020000Z-node-3", "20260101T040000Z-node-2"]
    on_demand = ["20260101T010000Z-node-3-before-upgrade", "20260101T050000Z-node-2-nightly"]
    for name in sorted(scheduled + on_demand):
        store.child(name).write_bytes("meta.properties", b"x")
        store.child(name).write_bytes(MANIFEST_NAME, b"{}")
    # A QuorumBackup's upload that failed before its manifest, older than the newest complete.
    store.child("20260101T030000Z-node-2-failed").write_bytes("meta.properties", b"x")
    assert apply_retention(store, 1) == [*scheduled[:2], "20260101T030000Z-node-2-failed"]
    assert store.children() == sorted([scheduled[2], *on_demand])


# --- in the harness -----------------------------------------------------------------------------


def _qb_path(name: str | None = None) -> str:
    return path(QB_KIND, NAMESPACE, name)


async def _create(cluster: Cluster, name: str, quorum: str) -> None:
    await cluster.kube.create(_qb_path(), {
        "apiVersion": API_VERSION, "kind": QB_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"quorum": quorum}})


async def _final(cluster: Cluster, name: str, timeout_s: float = 120) -> dict[str, Any]:
    async def final() -> dict[str, Any] | None:
        body = await cluster.kube.get(_qb_path(name)) or {}
        status = body.get("status") or {}
        return body if status.get("phase") in (COMPLETED, FAILED) else None
    found: dict[str, Any] = await cluster.wait(f"QuorumBackup {name} final", final, timeout_s)
    return found


async def test_a_quorum_backup_is_taken_once_from_a_follower_and_owned_by_its_quorum(
        cluster: Cluster, s3_endpoint: str) -> None:
    await cluster.kube.create(path("Secret", NAMESPACE), {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in CREDENTIALS.items()}})
    # A schedule keeping one backup, every 2 s: its retention runs all along.
    backup = {"intervalSeconds": 2, "retentionCount": 1, "target": {
        "endpoint": s3_endpoint, "bucket": BUCKET, "prefix": "fleet",
        "credentialsSecret": SECRET}}
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API),
                              quorum_object(NAME, 3, backup=backup))
    await cluster.ready_with(3)
    credentials = await cluster.credentials()
    with QuorumClient(cluster.addresses(range(1, 4)), timeout_s=20,
                      credentials=credentials) as client:
        marker = client.put("marker", "before the QuorumBackup").offset
    await _create(cluster, "before-upgrade", NAME)
    await _create(cluster, "stray", "no-such-quorum")

    body = await _final(cluster, "before-upgrade")
    status = body["status"]
    quorum = await cluster.get()
    cluster_id = quorum["status"]["clusterId"]
    assert status["phase"] == COMPLETED, status
    assert status["location"].startswith(f"s3://{BUCKET}/fleet/{cluster_id}/")
    assert status["location"].endswith("-before-upgrade")
    assert status["endOffset"] > marker and status["sizeBytes"] > 0
    assert status["node"] != await cluster.leader(), "taken from a follower"
    assert status["startedAt"] <= status["completedAt"] and status["durationSeconds"] >= 0
    assert status.get("message") is None
    assert qb_errors(body) == []
    assert body["metadata"]["ownerReferences"] == [{
        "apiVersion": API_VERSION, "kind": KIND, "name": NAME,
        "uid": quorum["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    assert any(reason == "BackupTaken" and "QuorumBackup before-upgrade" in message
               for reason, message in await cluster.events())

    stray = (await _final(cluster, "stray"))["status"]
    assert stray["phase"] == FAILED
    assert stray["message"] == f"no KafkaQuorum no-such-quorum in namespace {NAMESPACE}"

    async def stray_event() -> dict[str, Any] | None:
        """Its Warning Event, on the QuorumBackup itself (no KafkaQuorum to post it on)."""
        return next((e for e in await cluster.kube.list(path("Event", NAMESPACE), {})
                     if e.get("reason") == "BackupFailed" and
                     e.get("involvedObject", {}).get("name") == "stray"), None)

    event = await cluster.wait("the stray QuorumBackup's Event", stray_event, 30)
    assert event["type"] == "Warning" and event["message"] == stray["message"]
    assert event["involvedObject"]["kind"] == QB_KIND
    assert event["reportingComponent"] == MANAGER

    # The schedule's retention (1) has run since, and kept it; it is never taken again.
    options = S3Options(endpoint_url=s3_endpoint, access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    store = open_store(f"s3://{BUCKET}/fleet/{cluster_id}", options)

    async def deleted_since() -> bool | None:
        events = await cluster.events()
        return True if sum(reason == "BackupsDeleted" for reason, _ in events) >= 2 else None

    await cluster.wait("two retention runs", deleted_since, 60)
    names = store.children()
    ours = [name for name in names if name.endswith("-before-upgrade")]
    assert len(ours) == 1 and store.child(ours[0]).read_bytes(MANIFEST_NAME), names
    again = await cluster.kube.get(_qb_path("before-upgrade")) or {}
    assert again["status"] == status

    # A restore drill (the harness's kubelet runs the Job's pod, its command for real): the
    # schedule's interval made long first, so that no retention deletes what it restores.
    drills = {**backup, "intervalSeconds": 3600, "restoreDrill": {
        "intervalSeconds": 3600, "nodes": 1, "timeoutSeconds": 120}}
    await cluster.kube.patch(cr_path(NAME), {"spec": {"backup": drills}})

    async def drilled() -> dict[str, Any] | None:
        last = ((await cluster.status()).get("backup") or {}).get("lastDrill") or {}
        return last if last.get("outcome") in ("Passed", "Failed") else None

    last = await cluster.wait("a restore drill", drilled, 240)
    assert last["outcome"] == "Passed", last
    assert last["backup"].startswith(f"s3://{BUCKET}/fleet/{cluster_id}/")
    assert last["endOffset"] >= status["endOffset"] and last["keys"] >= 1
    assert last["durationSeconds"] > 0 and last["startedAt"] <= last["time"]
    jobs = await cluster.kube.list(path("Job", NAMESPACE), {})
    assert [job["metadata"]["name"] for job in jobs] == [last["job"]]
    assert jobs[0]["metadata"]["ownerReferences"][0]["uid"] == quorum["metadata"]["uid"]
    reasons = [reason for reason, _ in await cluster.events()]
    assert "RestoreDrillStarted" in reasons and "RestoreDrillPassed" in reasons

    # Without storage: Failed, saying so.
    await cluster.kube.patch(cr_path(NAME), {"spec": {"backup": None}})
    await _create(cluster, "no-storage", NAME)
    failed = (await _final(cluster, "no-storage"))["status"]
    assert failed["phase"] == FAILED
    assert failed["message"] == ("its KafkaQuorum has no backup storage configured "
                                 "(spec.backup.target)")


# --- restore drills: the parts ------------------------------------------------------------------


DRILL_SPEC = {"replicas": 3, "backup": {
    "target": {"bucket": "kq-backups", "prefix": "fleet", "endpoint": "http://s3:9000",
               "credentialsSecret": SECRET},
    "restoreDrill": {"intervalSeconds": 86400}}}
OWNER = r.Owner("kq", "default", "0b6f2a52-7c1e-4c43-8d43-1ac39b0d2d3e")


def test_a_drill_job_runs_restore_drill_in_the_node_image() -> None:
    spec = parse_spec(DRILL_SPEC)
    assert spec.backup is not None
    assert spec.backup.restore_drill == RestoreDrill(86400, nodes=3, timeout_seconds=600)
    job = drill_job(OWNER, spec, "CLUSTER")
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == spec.image
    assert container["command"] == [
        "quorum-node", "restore-drill", "--from", "s3://kq-backups/fleet/CLUSTER",
        "--nodes", "3", "--timeout", "600", "--work-dir", "/drill/run",
        "--report", "/dev/termination-log", "--endpoint-url", "http://s3:9000"]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["envFrom"] == [{"secretRef": {"name": SECRET}}]
    assert job["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert job["spec"]["backoffLimit"] == 0
    assert drill_location(replace(spec.backup.store, prefix=""), "C") == "s3://kq-backups/C"


@pytest.mark.parametrize(("last", "now", "due"), [
    ({}, 0.0, True),
    ({"startedAt": "2026-01-01T00:00:00Z", "outcome": "Passed"}, 1767225600.0 + 86399, False),
    ({"startedAt": "2026-01-01T00:00:00Z", "outcome": "Failed"}, 1767225600.0 + 86400, True),
])
def test_a_drill_is_due_an_interval_after_the_last_one_started(
        last: dict[str, Any], now: float, due: bool) -> None:
    assert drill_due(RestoreDrill(86400), last, now) is due


def test_a_drill_outcome_is_its_report_else_what_the_job_says() -> None:
    job = {"metadata": {"name": "kq-drill-x"}, "status": {}}
    assert job_outcome(job) is None
    done = {**job, "status": {"succeeded": 1,
                              "conditions": [{"type": "Complete", "status": "True"}]}}
    assert job_outcome(done) == "Passed"
    report = DrillReport(passed=True, message="ok", backup="s3://b/p/C/x", end_offset=7,
                         keys=3, leader=1, epoch=2, started_at="2026-01-01T00:00:00Z",
                         completed_at="2026-01-01T00:00:05Z", duration_seconds=5.0)
    pod = {"status": {"containerStatuses": [{"name": "restore-drill", "state": {
        "terminated": {"exitCode": 0, "message": report.model_dump_json(by_alias=True)}}}]}}
    assert drill_result(done, [pod], 0.0) == {
        "job": "kq-drill-x", "startedAt": "2026-01-01T00:00:00Z",
        "time": "2026-01-01T00:00:05Z", "outcome": "Passed", "backup": "s3://b/p/C/x",
        "endOffset": 7, "keys": 3, "durationSeconds": 5.0, "message": "ok"}
    deadline = {**job, "status": {"failed": 1, "conditions": [{
        "type": "Failed", "status": "True", "reason": "DeadlineExceeded",
        "message": "Job was active longer than specified deadline"}]}}
    assert job_outcome(deadline) == "Failed"
    result = drill_result(deadline, [], 0.0)
    assert result["outcome"] == "Failed" and result["message"] == (
        "the drill's Job ended without a report: Job was active longer than specified deadline")
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "kq"},
           "spec": DRILL_SPEC, "status": {"backup": {"lastDrill": {
               k: v for k, v in result.items() if v is not None}}}}
    assert schema_errors(doc) == []
