"""On-demand backups: the QuorumBackup resource (``crds/quorumbackups.kraft.quorum.dev.yaml``,
docs/backup.md, "On-demand backups"), as CloudNativePG's Backup is to its scheduled backups.

- Taken by the same machinery as a scheduled backup (``backups.BackupScheduler.take``): from a
  caught-up follower, to the KafkaQuorum's ``spec.backup.target``, in the quorum's one backup
  slot (a QuorumBackup waits, Pending, while a scheduled one runs, and the schedule waits for
  it). It does not move the schedule: that is measured from the last scheduled attempt.
- Its name in the store is the schedule's with the QuorumBackup's name after it
  (``<cluster_id>/<YYYYMMDDTHHMMSSZ>-node-<id>-<name>``): still in time order among the
  schedule's, so a restore drill and ``bootstrap.fromBackup`` pick it as they would any, but
  never counted nor deleted by the schedule's retention (``backups.apply_retention``).
- Phases: Pending (waiting for a running quorum or a free slot, the reason in ``message``),
  Running, then Completed or Failed, which are final: it is never retaken. A QuorumBackup found
  Running that this operator process is not running (the operator restarted meanwhile) is
  Failed: what it uploaded may be incomplete, and a new QuorumBackup is one ``kubectl create``
  away.
- Each QuorumBackup gets an owner reference to its KafkaQuorum, so it goes with it.

``next_step`` decides; ``OnDemandBackups`` observes and acts, from the quorum's pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka_quorum_operator import QB_KIND
from kafka_quorum_operator import opmetrics as m
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.backups import BackupJob, BackupScheduler, Event, backup_source
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.status import iso
from quorum_node.backup.manifest import BackupError

logger = logging.getLogger(__name__)

PENDING, RUNNING, COMPLETED, FAILED = "Pending", "Running", "Completed", "Failed"
FINAL = (COMPLETED, FAILED)
INTERRUPTED = ("interrupted: the operator restarted while it was being taken, and what it "
               "uploaded may be incomplete; create a new QuorumBackup")
MESSAGE_MAX = 1000


@dataclass(frozen=True)
class Step:
    """What a pass does with one QuorumBackup: the phase and message to record (None: leave
    the status as it is), and whether to take the backup now."""

    phase: str | None = None
    message: str | None = None
    take: bool = False


def next_step(status: Mapping[str, Any], *, storage: bool, waiting: str | None,
              slot_free: bool, running_here: bool) -> Step:
    """The decision for a QuorumBackup of ``status``: ``storage`` whether its quorum has a
    backup target; ``waiting`` why its quorum cannot be backed up now (None: it can);
    ``slot_free`` no backup of the quorum is running; ``running_here`` this process took or is
    taking this one."""
    phase = status.get("phase")
    if phase in FINAL or running_here:
        return Step()  # running_here: what was read may be older than its own patches
    if phase == RUNNING:
        return Step() if running_here else Step(FAILED, INTERRUPTED)
    if not storage:
        return Step(FAILED, "its KafkaQuorum has no backup storage configured "
                    "(spec.backup.target)")
    if waiting is None and slot_free:
        return Step(RUNNING, None, take=True)
    message = f"waiting: {waiting or 'another backup of the quorum is running'}"
    if phase == PENDING and status.get("message") == message:
        return Step()
    return Step(PENDING, message)


def _ordered(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Oldest first: the QuorumBackups are taken in the order they were asked for."""
    def key(item: Mapping[str, Any]) -> tuple[str, str]:
        meta = item.get("metadata") or {}
        return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")
    return sorted(items, key=key)


@dataclass
class OnDemandBackups:
    """The QuorumBackups of each KafkaQuorum: started in its backup slot, their status kept."""

    kube: Kube
    scheduler: BackupScheduler
    event: Event
    clock: Callable[[], float] = time.time
    # The QuorumBackups this process started (uids), running or done: a list read during or
    # just after one may show a phase older than what it wrote, which is no reason to act.
    started: set[str] = field(default_factory=set)

    async def reconcile(self, job: BackupJob, waiting: str | None) -> None:
        """One pass over the QuorumBackups naming ``job.owner``: owner references, phases, and
        the oldest one waiting started if the quorum can be backed up (``waiting`` is None)."""
        owner = job.owner
        found = await self.kube.list(path(QB_KIND, owner.namespace), {})
        for item in _ordered(found):
            if (item.get("spec") or {}).get("quorum") != owner.name:
                continue
            meta = item.get("metadata") or {}
            await self._own(owner, meta)
            uid = str(meta.get("uid") or meta.get("name"))
            step = next_step(item.get("status") or {}, storage=job.spec.backup is not None,
                             waiting=waiting, slot_free=not self.scheduler.busy(owner),
                             running_here=uid in self.started)
            if step.take:
                self._start(job, str(meta["name"]), uid)
            elif step.phase is not None:
                now = iso(self.clock())
                status: dict[str, Any] = {"phase": step.phase, "message": step.message}
                if step.phase == FAILED:
                    status["completedAt"] = now
                    m.BACKUPS.labels("failed").inc()
                    await self.event(owner, "BackupFailed", f"QuorumBackup {meta['name']}: "
                                     f"{step.message}", "Warning")
                await self._patch_status(owner.namespace, str(meta["name"]), status)

    async def _own(self, owner: r.Owner, meta: Mapping[str, Any]) -> None:
        """An owner reference to the KafkaQuorum (kept beside any other the creator set)."""
        references = list(meta.get("ownerReferences") or [])
        if any(ref.get("uid") == owner.uid for ref in references):
            return
        references.append(owner.reference())
        try:
            await self.kube.patch(path(QB_KIND, owner.namespace, str(meta["name"])),
                                  {"metadata": {"ownerReferences": references}})
        except KubeError as error:
            # Refused (an older chart's RBAC): the backup is still taken; only the garbage
            # collection with the quorum is missing.
            logger.warning("QuorumBackup %s/%s: no owner reference: %s", owner.namespace,
                           meta.get("name"), error)

    def _start(self, job: BackupJob, name: str, uid: str) -> None:
        node_id = backup_source(job.observed)
        if self.scheduler.start(job.owner, self._take(job, name, uid, node_id)):
            self.started.add(uid)

    async def _take(self, job: BackupJob, name: str, uid: str, node_id: int | None) -> None:
        owner = job.owner
        started = self.clock()
        await self._patch_status(owner.namespace, name, {
            "phase": RUNNING, "message": None, "startedAt": iso(started), "node": node_id})
        try:
            taken, _ = await self.scheduler.take(job, node_id, name_suffix=name)
        except BackupError as error:
            m.BACKUPS.labels("failed").inc()
            await self._patch_status(owner.namespace, name, {
                "phase": FAILED, "message": str(error)[:MESSAGE_MAX],
                "completedAt": iso(self.clock()),
                "durationSeconds": round(self.clock() - started, 3)})
            await self.event(owner, "BackupFailed", f"QuorumBackup {name}: {error}", "Warning")
            return
        manifest = taken.manifest
        m.BACKUPS.labels("ok").inc()
        await self._patch_status(owner.namespace, name, {
            "phase": COMPLETED, "message": None, "location": taken.uri,
            "sizeBytes": taken.bytes, "endOffset": manifest.end_offset,
            "completedAt": iso(self.clock()), "durationSeconds": round(self.clock() - started, 3)})
        await self.event(owner, "BackupTaken", (
            f"QuorumBackup {name}: node {node_id}: offsets below {manifest.end_offset} to "
            f"{taken.uri} ({taken.bytes} bytes in {taken.seconds:.1f} s)"), "Normal")

    async def _patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await self.kube.patch(path(QB_KIND, namespace, name) + "/status",
                              {"status": dict(status)})


async def fail_orphan(kube: Kube, body: Mapping[str, Any], clock: Callable[[], float]
                      ) -> str | None:
    """Fail a QuorumBackup whose KafkaQuorum does not exist (no pass of a quorum will ever
    look at it); why, if it was."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    quorum = str((body.get("spec") or {}).get("quorum") or "")
    if ((body.get("status") or {}).get("phase") in FINAL or not quorum
            or await kube.get(path("KafkaQuorum", namespace, quorum)) is not None):
        return None
    message = f"no KafkaQuorum {quorum} in namespace {namespace}"
    await kube.patch(path(QB_KIND, namespace, name) + "/status", {"status": {
        "phase": FAILED, "message": message, "completedAt": iso(clock())}})
    return message
