"""Restore drills (``spec.backup.restoreDrill``, docs/backup.md, "Restore drills"): a backup is
worth what a restore of it serves, so the operator has one restored, on a schedule, and records
whether it served.

- A drill is a Job in the node's image running ``quorum-node restore-drill`` (the command a user
  runs by hand): the newest complete backup of the quorum's cluster (under
  ``s3://bucket/prefix/<cluster_id>``, scheduled or on-demand) restored as a scratch quorum on
  the pod's loopback, with a new cluster id, checked to elect a leader and to serve every key
  of the backup by a linearizable read, then stopped and removed. A Job, not the operator: the
  restore takes the backup's size in disk and the scratch quorum its memory and CPU, which the
  operator's pod has not to spare, and a Job's pod is scheduled where there is room, with the
  namespace's limits, and torn down with what it used (an emptyDir).
- Schedule: an interval from the last drill's start (``lastDrill.startedAt``), as the backups'
  is; one drill at a time per quorum; none before the quorum runs and the schedule has taken a
  backup (``status.backup.lastTime``).
- Outcome: the drill writes its report (JSON, ``DrillReport``) to its container's termination
  message; the operator reads it once the Job has finished and records it in
  ``status.backup.lastDrill`` (outcome Passed or Failed, the backup drilled, its end offset,
  keys served, duration, message), with an Event (RestoreDrillPassed, or RestoreDrillFailed as
  a Warning). A Job that ends without a report (deadline, an image that does not start) is a
  failed drill, saying what the Job says. Finished Jobs are deleted by Kubernetes a day later
  (``ttlSecondsAfterFinished``), their pods with them; the Job is owned by the quorum.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kafka_quorum_operator import resources as r
from kafka_quorum_operator.backups import Event, PatchStatus, seconds_of, with_store_credentials
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.spec import ObjectStore, RestoreDrill, Spec
from kafka_quorum_operator.status import iso
from quorum_node.backup.drill_report import MAX_MESSAGE, DrillReport

DRILL_COMPONENT = "restore-drill"
DRILL_CONTAINER = "restore-drill"
SCRATCH_MOUNT = "/drill"
REPORT_PATH = "/dev/termination-log"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
RUNNING, PASSED, FAILED = "Running", "Passed", "Failed"
# Beyond the drill's own timeout: fetching and checking the backup, and the pod's start.
DEADLINE_MARGIN_S = 900
FINISHED_TTL_S = 24 * 3600


def drill_due(drill: RestoreDrill, last: Mapping[str, Any], now: float) -> bool:
    started = seconds_of(last.get("startedAt"))
    return started is None or now - started >= drill.interval_seconds


def drill_location(store: ObjectStore, cluster_id: str) -> str:
    """Where the cluster's backups are: the drill takes the newest complete one there."""
    return "/".join(part for part in (f"s3://{store.bucket}", store.prefix, cluster_id) if part)


def drill_job(owner: r.Owner, spec: Spec, cluster_id: str) -> dict[str, Any]:
    """The drill's Job (named by the API server after the quorum: ``generateName``)."""
    assert spec.backup is not None and spec.backup.restore_drill is not None
    store, drill = spec.backup.store, spec.backup.restore_drill
    command = ["quorum-node", "restore-drill", "--from", drill_location(store, cluster_id),
               "--nodes", str(drill.nodes), "--timeout", str(drill.timeout_seconds),
               "--work-dir", f"{SCRATCH_MOUNT}/run", "--report", REPORT_PATH]
    if store.endpoint:
        command += ["--endpoint-url", store.endpoint]
    container: dict[str, Any] = {
        "name": DRILL_CONTAINER, "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy, "command": command,
        "terminationMessagePath": REPORT_PATH, "terminationMessagePolicy": "File",
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH_MOUNT}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    with_store_credentials(container, store.region, store.credentials_secret)
    labels = r.labels(owner.name, DRILL_COMPONENT)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": r.NODE_USER,
                            "runAsGroup": r.NODE_USER, "fsGroup": r.NODE_USER,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    if spec.template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.template.image_pull_secrets]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"generateName": f"{owner.name}-drill-", "namespace": owner.namespace,
                     "labels": labels, "ownerReferences": [owner.reference()]},
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": FINISHED_TTL_S,
                 "activeDeadlineSeconds": drill.timeout_seconds + DEADLINE_MARGIN_S,
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }


def job_outcome(job: Mapping[str, Any]) -> str | None:
    """PASSED or FAILED once the Job has finished; None while it runs."""
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []
                  if c.get("status") == "True"}
    if status.get("succeeded") or "Complete" in conditions:
        return PASSED
    if status.get("failed") or "Failed" in conditions:
        return FAILED
    return None


def drill_result(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: float
                 ) -> dict[str, Any]:
    """status.backup.lastDrill for a finished Job: its report, else what the Job says."""
    name = (job.get("metadata") or {}).get("name")
    report = next((found for pod in pods if (found := _report(pod)) is not None), None)
    if report is not None:
        return {"job": name, "startedAt": report.started_at, "time": report.completed_at,
                "outcome": PASSED if report.passed else FAILED, "backup": report.backup,
                "endOffset": report.end_offset, "keys": report.keys,
                "durationSeconds": report.duration_seconds, "message": report.message}
    conditions = (job.get("status") or {}).get("conditions") or []
    failed: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Failed"
                                      and c.get("status") == "True"), {})
    why = failed.get("message") or failed.get("reason") or "no report"
    return {"job": name, "time": iso(now), "outcome": FAILED, "backup": None,
            "endOffset": None, "keys": None, "durationSeconds": None,
            "message": f"the drill's Job ended without a report: {why}"[:MAX_MESSAGE]}


def _report(pod: Mapping[str, Any]) -> DrillReport | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if status.get("name") == DRILL_CONTAINER and terminated.get("message"):
            try:
                return DrillReport.model_validate(json.loads(terminated["message"]))
            except (ValueError, ValidationError):
                return None
    return None


@dataclass
class Drills:
    """Each KafkaQuorum's restore drills: started when due, their outcome recorded."""

    kube: Kube
    event: Event
    patch_status: PatchStatus
    clock: Callable[[], float]

    async def reconcile(self, owner: r.Owner, spec: Spec, status: Mapping[str, Any],
                        cluster_id: str, ready: bool) -> None:
        """One pass: record the running drill's outcome once its Job has finished; else start
        one if due (``ready``: the quorum runs), once the schedule has taken a backup."""
        last: Mapping[str, Any] = (status.get("backup") or {}).get("lastDrill") or {}
        jobs = await self.kube.list(path("Job", owner.namespace),
                                    r.labels(owner.name, DRILL_COMPONENT))
        now = self.clock()
        if last.get("outcome") == RUNNING:
            await self._finish(owner, last, {j["metadata"]["name"]: j for j in jobs}, now)
            return
        drill = spec.backup.restore_drill if spec.backup is not None else None
        backed_up = bool((status.get("backup") or {}).get("lastTime"))
        if drill is None or not ready or not backed_up or not drill_due(drill, last, now) \
                or any(job_outcome(job) is None for job in jobs):
            return
        created = await self.kube.create(path("Job", owner.namespace),
                                         drill_job(owner, spec, cluster_id))
        name = (created.get("metadata") or {}).get("name")
        await self.patch_status(owner, {"backup": {"lastDrill": {
            "job": name, "startedAt": iso(now), "outcome": RUNNING, "time": None,
            "backup": None, "endOffset": None, "keys": None, "durationSeconds": None,
            "message": None}}})
        await self.event(owner, "RestoreDrillStarted", f"Job {name}: restoring the newest "
                         f"backup under {drill_location(spec.backup.store, cluster_id)}"
                         if spec.backup is not None else f"Job {name}", "Normal")

    async def _finish(self, owner: r.Owner, last: Mapping[str, Any],
                      jobs: Mapping[str, Mapping[str, Any]], now: float) -> None:
        name = str(last.get("job"))
        job = jobs.get(name)
        if job is None:
            result = {**last, "time": iso(now), "outcome": FAILED,
                      "message": f"its Job {name} is gone before its outcome was read"}
        elif job_outcome(job) is None:
            return
        else:
            pods = await self.kube.list(path("Pod", owner.namespace), {JOB_NAME_LABEL: name})
            # The schedule counts from the start the operator recorded.
            result = {**drill_result(job, pods, now), "startedAt": last.get("startedAt")}
        await self.patch_status(owner, {"backup": {"lastDrill": result}})
        if result["outcome"] == PASSED:
            await self.event(owner, "RestoreDrillPassed", f"Job {name}: {result['message']}",
                             "Normal")
        else:
            await self.event(owner, "RestoreDrillFailed", f"Job {name}: {result['message']}",
                             "Warning")
