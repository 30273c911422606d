"""Scheduled backups of a KafkaQuorum to object storage, their retention, and creating a
KafkaQuorum from a backup (docs/operator.md, "Backups").

- Schedule: an interval (``spec.backup.intervalSeconds``), measured from the last attempt, not a
  cron expression: a quorum's backups need a bound on how old the newest is, not wall-clock
  alignment, and an interval has no missed-run rules to get wrong across operator restarts (the
  last attempt is in the status).
- Source: a caught-up follower (caught up with the leader within the fetch timeout, as the
  planner counts it; the least lag first), so that the leader does
  not spend its disk and CPU on it; the leader only in a one-voter quorum. The operator asks the
  node for a backup (``GET /v1/backup``, with its admin client certificate) and writes it to
  ``s3://bucket/prefix/<cluster_id>/<YYYYMMDDTHHMMSSZ>-node-<id>/`` itself (``quorum_node.backup``),
  in a task of its own: a pass never waits for a backup.
- Status ``backup``: the last backup's time, end offset, location and node, and the last
  failure; metrics ``kafka_quorum_operator_backups{result}`` and the last backup's time and end
  offset; an Event for every backup taken (BackupTaken) and every failure (BackupFailed).
- Retention: once a backup is complete, the complete scheduled backups of the cluster beyond
  ``retentionCount`` are deleted oldest first, with any incomplete one older than the newest
  complete one (a failed upload's leftovers); a QuorumBackup's (``ondemand``) is never counted
  nor deleted.
- ``spec.bootstrap.fromBackup``: the cluster id is the backup's, the operator chooses a directory
  id for every voter (status ``restore``), and until the quorum is bootstrapped every pod it
  creates has an init container running ``quorum-node restore`` for its node with those ids
  (``--skip-formatted``: a restarted pod keeps its data).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka_quorum_operator import opmetrics as m
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.observe import Observed
from kafka_quorum_operator.plan import is_caught_up
from kafka_quorum_operator.spec import DATA_MOUNT, LOG_DIR, Bootstrap, ObjectStore, Spec
from kafka_quorum_operator.status import iso
from quorum_node.addresses import address_url
from quorum_node.backup.manifest import (
    MANIFEST_NAME,
    UNSUFFIXED_BACKUP_NAME,
    BackupError,
    BackupManifest,
)
from quorum_node.backup.store import BackupStore, S3Options, open_store
from quorum_node.backup.writer import TakenBackup, take_backup
from quorum_node.storage.kafka_uuid import random_uuid, to_kafka_string

logger = logging.getLogger(__name__)

ACCESS_KEY = "AWS_ACCESS_KEY_ID"
SECRET_KEY = "AWS_SECRET_ACCESS_KEY"
BACKUP_TIMEOUT_S = 300.0
RESTORE_CONTAINER = "restore"

Event = Callable[[r.Owner, str, str, str], Awaitable[None]]
PatchStatus = Callable[[r.Owner, Mapping[str, Any]], Awaitable[None]]


async def s3_options(kube: Kube, namespace: str, secret: str | None, endpoint: str | None,
                     region: str | None) -> S3Options:
    """The object store's options, with the credentials of ``secret`` (if named)."""
    if secret is None:
        return S3Options(endpoint_url=endpoint, region=region)
    found = await kube.get(path("Secret", namespace, secret))
    data = (found or {}).get("data") or {}
    if ACCESS_KEY not in data or SECRET_KEY not in data:
        raise BackupError(f"Secret {secret} is missing, or lacks {ACCESS_KEY} or {SECRET_KEY}")
    return S3Options(endpoint_url=endpoint, region=region,
                     access_key_id=base64.b64decode(data[ACCESS_KEY]).decode(),
                     secret_access_key=base64.b64decode(data[SECRET_KEY]).decode())


def backup_source(observed: Observed) -> int | None:
    """The node to back up: of the caught-up followers (as the planner counts them: caught up
    with the leader within the fetch timeout), the one with the least lag, then the lowest id;
    the leader in a quorum of one voter; None when there is none."""
    quorum = observed.quorum
    if quorum is None:
        return None
    running = {i for i, pod in observed.pods.items() if pod.running and pod.ip}
    followers = sorted((row.lag, row.node_id) for row in quorum.voters
                       if row.node_id != quorum.leader_id and row.node_id in running
                       and is_caught_up(row, quorum, observed.spec.fetch_timeout_ms))
    if followers:
        return followers[0][1]
    if len(quorum.voters) == 1 and quorum.leader_id in running:
        return quorum.leader_id
    return None


def apply_retention(cluster: BackupStore, keep: int) -> list[str]:
    """Delete the complete scheduled backups under ``cluster`` beyond the newest ``keep``, and
    incomplete ones older than the newest complete one; the names deleted. Names start with
    their UTC time, so their order is their age. A QuorumBackup's backup (its name ends with the
    QuorumBackup's) is never counted nor deleted: it was asked for by name, and goes when its
    owner deletes it (docs/backup.md, "On-demand backups")."""
    names = cluster.children()
    complete = [name for name in names if cluster.child(name).read_bytes(MANIFEST_NAME)]
    if not complete:
        return []
    scheduled = [name for name in complete if UNSUFFIXED_BACKUP_NAME.fullmatch(name)]
    doomed = set(scheduled[:-keep]) | {name for name in names
                                       if name not in complete and name < complete[-1]}
    for name in sorted(doomed):
        cluster.child(name).delete_all()
    return sorted(doomed)


def due(spec: Spec, status: Mapping[str, Any], last_attempt: float | None, now: float) -> bool:
    if spec.backup is None:
        return False
    recorded = (status.get("backup") or {}).get("lastAttemptTime")
    last = max([t for t in (last_attempt, seconds_of(recorded)) if t is not None], default=None)
    return last is None or now - last >= spec.backup.interval_seconds


def seconds_of(text: object) -> float | None:
    """An RFC 3339 time written in status, in seconds; None if it is not one."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def export_last_backup(owner: r.Owner, spec: Spec, status: Mapping[str, Any]) -> None:
    """The last-backup gauge from status.backup.lastTime, which an operator that restarted still
    has (the chart's KafkaQuorumBackupTooOld alert reads the gauge); none for a quorum without
    spec.backup, whose old backups nobody waits on."""
    gauge = m.LAST_BACKUP
    if spec.backup is None:
        with contextlib.suppress(KeyError):
            gauge.remove(owner.namespace, owner.name)
        return
    recorded = seconds_of((status.get("backup") or {}).get("lastTime"))
    if recorded is not None:
        gauge.labels(owner.namespace, owner.name).set(recorded)


@dataclass(frozen=True)
class BackupJob:
    """One backup, as a pass decided it: of which quorum, from what it observed."""

    owner: r.Owner
    spec: Spec
    observed: Observed
    cluster_id: str
    tls: ssl.SSLContext | None  # the operator's client context (None: TLS off)


@dataclass
class BackupScheduler:
    """The running backup of each KafkaQuorum (one at a time) and when each was last tried."""

    kube: Kube
    event: Event
    patch_status: PatchStatus
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    last_attempt: dict[str, float] = field(default_factory=dict)

    def maybe_start(self, job: BackupJob, status: Mapping[str, Any]) -> None:
        """Start a backup in a task of its own if one is due and none is running."""
        export_last_backup(job.owner, job.spec, status)
        key = job.owner.uid or job.owner.name
        running = self.tasks.get(key)
        if running is not None and not running.done():
            return
        if not due(job.spec, status, self.last_attempt.get(key), job.observed.now):
            return
        self.last_attempt[key] = job.observed.now
        self.tasks[key] = asyncio.get_running_loop().create_task(self._run(job))

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def start(self, owner: r.Owner, run: Coroutine[Any, Any, None]) -> bool:
        """Run ``run`` (a QuorumBackup's backup) in the quorum's backup slot, if free; False
        (and ``run`` closed) if a backup of the quorum is running."""
        key = owner.uid or owner.name
        running = self.tasks.get(key)
        if running is not None and not running.done():
            run.close()
            return False
        self.tasks[key] = asyncio.get_running_loop().create_task(run)
        return True

    def busy(self, owner: r.Owner) -> bool:
        running = self.tasks.get(owner.uid or owner.name)
        return running is not None and not running.done()

    async def take(self, job: BackupJob, node_id: int | None, name_suffix: str = ""
                   ) -> tuple[TakenBackup, BackupStore]:
        """Back node ``node_id`` of the quorum up to its spec.backup target (BackupError when
        there is no source or the backup fails); the backup, and the target."""
        owner, spec, observed, tls = job.owner, job.spec, job.observed, job.tls
        if spec.backup is None:
            raise BackupError(f"KafkaQuorum {owner.name} has no backup storage configured "
                              f"(spec.backup.target)")
        if node_id is None:
            raise BackupError("no caught-up follower to take it from")
        pod = observed.pods[node_id]
        assert pod.ip is not None  # backup_source picks a running pod with an address
        store = await _store(self.kube, owner.namespace, spec.backup.store)
        scheme = "https" if tls is not None else "http"
        taken = await asyncio.to_thread(
            take_backup, address_url(scheme, pod.ip, spec.port), store, tls=tls,
            server_name=r.node_host(owner.name, owner.namespace, node_id),
            name_suffix=name_suffix, timeout_s=BACKUP_TIMEOUT_S)
        return taken, store

    async def _run(self, job: BackupJob) -> None:
        owner, spec, observed = job.owner, job.spec, job.observed
        event, patch_status = self.event, self.patch_status
        assert spec.backup is not None
        attempt = iso(observed.now)
        node_id = backup_source(observed)
        try:
            taken, store = await self.take(job, node_id)
            deleted = await asyncio.to_thread(apply_retention, store.child(job.cluster_id),
                                              spec.backup.retention_count)
        except BackupError as error:
            m.BACKUPS.labels("failed").inc()
            await patch_status(owner, {"backup": {"lastAttemptTime": attempt, "lastFailure": {
                "time": attempt, "message": str(error)[:1000]}}})
            await event(owner, "BackupFailed", f"backup of node {node_id}: {error}"
                        if node_id is not None else f"backup: {error}", "Warning")
            return
        manifest = taken.manifest
        m.BACKUPS.labels("ok").inc()
        # As status.backup.lastTime records it (export_last_backup reads that after a restart).
        m.LAST_BACKUP.labels(owner.namespace, owner.name).set(
            seconds_of(manifest.created_at) or observed.now)
        m.LAST_BACKUP_END_OFFSET.labels(owner.namespace, owner.name).set(manifest.end_offset)
        await patch_status(owner, {"backup": {
            "lastAttemptTime": attempt, "lastTime": manifest.created_at,
            "lastEndOffset": manifest.end_offset, "lastLocation": taken.uri,
            "lastNodeId": node_id, "lastFailure": None}})
        await event(owner, "BackupTaken", (
            f"node {node_id}: offsets below {manifest.end_offset} to {taken.uri} "
            f"({taken.bytes} bytes in {taken.seconds:.1f} s)"), "Normal")
        if deleted:
            await event(owner, "BackupsDeleted", f"retention ({spec.backup.retention_count}): "
                        f"deleted {', '.join(deleted)}", "Normal")


async def _store(kube: Kube, namespace: str, target: ObjectStore) -> BackupStore:
    options = await s3_options(kube, namespace, target.credentials_secret, target.endpoint,
                               target.region)
    location = f"s3://{target.bucket}/{target.prefix}".rstrip("/")
    return await asyncio.to_thread(open_store, location, options)


async def restore_plan(kube: Kube, namespace: str, bootstrap: Bootstrap, voter_ids: range
                       ) -> tuple[str, dict[str, Any]]:
    """(the backup's cluster id, status ``restore``: the location and a new directory id for
    every voter). BackupError if the backup's manifest cannot be read."""
    options = await s3_options(kube, namespace, bootstrap.credentials_secret,
                               bootstrap.endpoint, bootstrap.region)

    def read() -> BackupManifest:
        store = open_store(bootstrap.from_backup, options)
        raw = store.read_bytes(MANIFEST_NAME)
        if raw is None:
            raise BackupError(f"{bootstrap.from_backup}: no {MANIFEST_NAME}: not a backup, or "
                              f"an incomplete one")
        return BackupManifest.parse(raw, f"{bootstrap.from_backup}/{MANIFEST_NAME}")

    manifest = await asyncio.to_thread(read)
    return manifest.cluster_id, {
        "location": bootstrap.from_backup, "endOffset": manifest.end_offset,
        "directoryIds": {str(i): to_kafka_string(random_uuid()) for i in voter_ids}}


def restore_init_container(spec: Spec, restore: Mapping[str, Any], node_id: int
                           ) -> dict[str, Any] | None:
    """The init container that restores node ``node_id``'s directory (None: no plan for it)."""
    bootstrap = spec.bootstrap
    ids: Mapping[str, str] = restore.get("directoryIds") or {}
    if bootstrap is None or str(node_id) not in ids:
        return None
    voters = ",".join(f"{i}:{d}" for i, d in sorted(ids.items(), key=lambda kv: int(kv[0])))
    command = ["quorum-node", "restore", "--from", str(restore["location"]), "--voters", voters,
               "--node-id", str(node_id), "--log-dir", LOG_DIR, "--skip-formatted"]
    if bootstrap.endpoint:
        command += ["--endpoint-url", bootstrap.endpoint]
    container: dict[str, Any] = {
        "name": RESTORE_CONTAINER, "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy, "command": command,
        "volumeMounts": [{"name": "data", "mountPath": DATA_MOUNT}],
        # The restore stages the backup beside the log directory, on the volume.
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    with_store_credentials(container, bootstrap.region, bootstrap.credentials_secret)
    return container


def with_store_credentials(container: dict[str, Any], region: str | None,
                           credentials_secret: str | None) -> None:
    """The object store's region and credentials Secret as the container's environment."""
    if region:
        container["env"] = [{"name": "AWS_REGION", "value": region}]
    if credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": credentials_secret}}]
