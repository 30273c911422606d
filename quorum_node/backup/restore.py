"""Restoring a backup as a new quorum, in the spirit of ``etcdutl snapshot restore``: the log
directories of new voters, each with a new directory id, holding the backup's committed log and
snapshot, followed by one VotersRecord that names the new voter set.

The old voters' directories are gone, and their directory ids with them: the voter set the log
defines must name the new directories, or no new node could vote. So every restored log gets the
same last batch, at the backup's end offset and in its last epoch: a VotersRecord of the new
voters (as a leader's bootstrap record, KIP-856). All restored logs are identical, so the first
leader the new quorum elects (in a later epoch) holds that batch and commits it with its own.

The backup is checked whole before anything is written: the manifest, every file's size and
sha256, meta.properties, the snapshot's framing and every segment batch's CRC, and that the
segments run contiguously from ``log_start_offset`` to ``end_offset``. A directory is built
under a temporary name beside its target and renamed into place when complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from quorum_node.backup.manifest import MANIFEST_NAME, BackupError, BackupManifest
from quorum_node.backup.store import BackupStore
from quorum_node.raft.records import CorruptRecordError, encode_batch, read_batch_header
from quorum_node.raft.snapshot_format import check_snapshot
from quorum_node.raft.snapshots import CorruptSnapshotError
from quorum_node.raft.types import ReplicaKey
from quorum_node.raft.voters import voters_record
from quorum_node.storage.errors import StorageError
from quorum_node.storage.fsutil import fsync_directory
from quorum_node.storage.kafka_uuid import is_reserved, random_uuid, to_kafka_string
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import (
    META_PROPERTIES,
    MetaProperties,
    read_meta_properties,
    validate_cluster_id,
)

_CHUNK = 1 << 20


@dataclass(frozen=True)
class RestoredNode:
    node_id: int
    directory_id: uuid.UUID
    log_dir: Path


@dataclass(frozen=True)
class VerifiedBackup:
    manifest: BackupManifest
    files: Path  # a local copy of the backup's files, checked


def fetch_verified(source: BackupStore, staging: Path) -> VerifiedBackup:
    """Copy the backup at ``source`` into ``staging`` (an empty local directory), checking it
    whole; BackupError (one line) naming the first defect."""
    raw = source.read_bytes(MANIFEST_NAME)
    if raw is None:
        raise BackupError(f"{source.uri}: no {MANIFEST_NAME}: not a backup, or an incomplete one")
    manifest = BackupManifest.parse(raw, f"{source.uri}/{MANIFEST_NAME}")
    for entry in manifest.files:
        local = staging / entry.path
        local.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        with source.open(entry.path) as stream, local.open("wb") as output:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                output.write(chunk)
        if size != entry.size or digest.hexdigest() != entry.sha256:
            raise BackupError(f"{source.uri}/{entry.path}: checksum mismatch ({size} bytes, "
                              f"sha256 {digest.hexdigest()[:12]}..., the manifest says "
                              f"{entry.size} bytes, {entry.sha256[:12]}...): damaged backup")
    _check_contents(manifest, staging, source.uri)
    return VerifiedBackup(manifest, staging)


def _check_contents(manifest: BackupManifest, files: Path, uri: str) -> None:
    paths = {entry.path for entry in manifest.files}
    if META_PROPERTIES not in paths:
        raise BackupError(f"{uri}: the manifest lists no {META_PROPERTIES}")
    try:
        meta = read_meta_properties(files / META_PROPERTIES)
    except StorageError as error:
        raise BackupError(f"{uri}/{META_PROPERTIES}: {error}") from None
    if meta.cluster_id != manifest.cluster_id or meta.node_id != manifest.node_id:
        raise BackupError(f"{uri}: {META_PROPERTIES} (cluster {meta.cluster_id}, node "
                          f"{meta.node_id}) does not match the manifest")
    snapshot_end = 0
    snapshots = sorted(path for path in paths if path.endswith(".checkpoint"))
    if manifest.snapshot is not None:
        name = f"{manifest.snapshot.end_offset:020d}-{manifest.snapshot.epoch:010d}.checkpoint"
        if snapshots != [f"{METADATA_PARTITION_DIR}/{name}"]:
            raise BackupError(f"{uri}: the manifest's snapshot {name} is not its one snapshot "
                              f"file")
        try:
            check_snapshot((files / snapshots[0]).read_bytes())
        except CorruptSnapshotError as error:
            raise BackupError(f"{uri}/{snapshots[0]}: damaged snapshot: {error}") from None
        snapshot_end = manifest.snapshot.end_offset
    elif snapshots:
        raise BackupError(f"{uri}: a snapshot file the manifest does not name")
    segments = sorted(path for path in paths if path.endswith(".log"))
    expected = manifest.log_start_offset
    if not segments and expected != snapshot_end:
        raise BackupError(f"{uri}: no segments, but the log starts at {expected}")
    if expected > snapshot_end:
        raise BackupError(f"{uri}: the log starts at {expected}, after the snapshot's end "
                          f"{snapshot_end}: offsets are missing")
    last_epoch = manifest.snapshot.epoch if manifest.snapshot is not None else 0
    for segment in segments:
        base = int(Path(segment).name[:20])
        if base != expected:
            raise BackupError(f"{uri}/{segment}: starts at {base}, expected {expected}")
        data = (files / segment).read_bytes()
        position = 0
        while position < len(data):
            try:
                header = read_batch_header(data, position)
            except CorruptRecordError as error:
                raise BackupError(f"{uri}/{segment}: damaged batch at byte {position}: {error}"
                                  ) from None
            if header.base_offset != expected:
                raise BackupError(f"{uri}/{segment}: batch at byte {position} has offset "
                                  f"{header.base_offset}, expected {expected}")
            expected, last_epoch, position = header.next_offset, header.epoch, header.end
    end = max(expected, snapshot_end)
    if end != manifest.end_offset or last_epoch != manifest.last_epoch:
        raise BackupError(f"{uri}: the files end at offset {end} in epoch {last_epoch}, the "
                          f"manifest says {manifest.end_offset} in epoch {manifest.last_epoch}")


def new_voter_set(voters: Sequence[tuple[int, uuid.UUID | None]], generate: bool
                  ) -> list[ReplicaKey]:
    """The new voters, each with its directory id (a new random one where none is given, if
    ``generate``)."""
    ids = [voter_id for voter_id, _ in voters]
    if not ids:
        raise BackupError("no voters given")
    if len(set(ids)) != len(ids):
        raise BackupError(f"a voter id is given twice: {sorted(ids)}")
    keys = []
    for voter_id, given in voters:
        directory_id = given
        if directory_id is None:
            if not generate:
                raise BackupError(f"voter {voter_id} needs its directory id (ID:DIRECTORY_ID) "
                                  f"when one node's directory is restored")
            directory_id = random_uuid()
        elif is_reserved(directory_id):
            raise BackupError(f"voter {voter_id}: directory id {to_kafka_string(directory_id)} "
                              f"is reserved")
        keys.append(ReplicaKey(voter_id, directory_id))
    return keys


def restore(source: BackupStore, voters: Sequence[ReplicaKey],
            log_dir_of: Callable[[int], Path], *, node_ids: Sequence[int] | None = None,
            cluster_id: str | None = None) -> list[RestoredNode]:
    """Build the log directory of each voter in ``node_ids`` (default: every voter) at
    ``log_dir_of(id)`` from the backup at ``source``. ``cluster_id``: a new cluster id (default:
    the backup's). Every target must be missing or empty; nothing is written unless the backup
    checks out."""
    by_id = {key.id: key for key in voters}
    chosen = list(node_ids) if node_ids is not None else sorted(by_id)
    for node_id in chosen:
        if node_id not in by_id:
            raise BackupError(f"node {node_id} is not among the voters {sorted(by_id)}")
        target = log_dir_of(node_id)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise BackupError(f"{target}: not empty; restore writes new directories only")
    if cluster_id is not None:
        try:
            validate_cluster_id(cluster_id)
        except ValueError as error:
            raise BackupError(str(error)) from None
    staging_parent = log_dir_of(chosen[0]).parent
    missing = staging_parent  # the outermost directory this creates, removed on a refusal
    while not missing.parent.exists():
        missing = missing.parent
    created = not missing.exists()
    staging_parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=".restore-", dir=staging_parent) as staging:
            backup = fetch_verified(source, Path(staging))
            restored = []
            for node_id in chosen:
                key = by_id[node_id]
                assert key.directory_id is not None
                target = log_dir_of(node_id)
                _build(backup, target, MetaProperties(cluster_id or backup.manifest.cluster_id,
                                                      node_id, key.directory_id), voters)
                restored.append(RestoredNode(node_id, key.directory_id, target))
    except BaseException:
        if created:
            shutil.rmtree(missing, ignore_errors=True)
        raise
    return restored


def _build(backup: VerifiedBackup, target: Path, meta: MetaProperties,
           voters: Sequence[ReplicaKey]) -> None:
    manifest = backup.manifest
    building = target.with_name(f".{target.name}.restoring")
    shutil.rmtree(building, ignore_errors=True)
    partition = building / METADATA_PARTITION_DIR
    partition.mkdir(parents=True)
    for entry in manifest.files:
        if entry.path != META_PROPERTIES:
            shutil.copyfile(backup.files / entry.path, building / entry.path)
    segments = sorted(p for p in partition.iterdir() if p.name.endswith(".log"))
    last = segments[-1] if segments else partition / f"{manifest.end_offset:020d}.log"
    batch = encode_batch(manifest.end_offset, manifest.last_epoch, [voters_record(voters)],
                         int(time.time() * 1000), is_control=True)
    with last.open("ab") as output:
        output.write(batch)
    (building / META_PROPERTIES).write_text(meta.to_properties(), encoding="utf-8")
    for path in [*partition.iterdir(), building / META_PROPERTIES]:
        with path.open("rb+") as file:
            os.fsync(file.fileno())
    fsync_directory(partition)
    fsync_directory(building)
    if target.exists():
        target.rmdir()  # empty (checked)
    building.rename(target)
    fsync_directory(target.parent)
