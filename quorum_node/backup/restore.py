"""Restoring a backup as a new quorum, in the spirit of ``etcdutl snapshot restore``: the log
directories of new voters, each with a new directory id, holding the backup's committed log and
snapshot, followed by one VotersRecord that names the new voter set, and a quorum-state in the
backup's last epoch (no leader, no vote: a new voter's).

The old voters' directories are gone, and their directory ids with them: the voter set the log
defines must name the new directories, or no new node could vote. So every restored log gets the
same last batch, at the backup's end offset and in its last epoch: a VotersRecord of the new
voters (as a leader's bootstrap record, KIP-856). All restored logs are identical, so the first
leader the new quorum elects (in a later epoch) holds that batch and commits it with its own.

The backup is checked whole before anything is written, with the node's own checks where the
node has one, so that nothing is restored that a node would then refuse: the manifest, every
file's size and sha256, meta.properties, the snapshot's framing and CRCs and its records (the
key-value store's ``check_snapshot_records``), the segments as the node's recovery checks them
(``SegmentLog.find_damage``), that they run contiguously from ``log_start_offset`` to
``end_offset``, and that the last epoch leaves room for a next one (``epoch_in_bounds``).

Reading: a backup holds regular files only, and no symbolic link is followed below its root
(``BackupStore.open``); no file is read past the size its manifest gives. Everything is copied
into a staging directory beside the first target (``.restore-*``), and each directory is built
under a temporary name beside its target (``.<name>.restoring``) and renamed into place when
complete. Both are locked (``dir_lock``) while in use and removed when the restore ends, however
it ends short of SIGKILL; what a killed restore left, the next one removes (a directory still
locked belongs to a restore still running, and is left alone). Files are created ``0600`` and
directories ``0700``, whatever the umask.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from quorum_node.backup.manifest import MANIFEST_NAME, BackupError, BackupManifest, FileEntry
from quorum_node.backup.store import BackupStore
from quorum_node.kv.machine import check_snapshot_records
from quorum_node.raft.records import encode_batch, read_batch_header
from quorum_node.raft.snapshot_format import check_snapshot, iter_snapshot_records
from quorum_node.raft.snapshots import CorruptSnapshotError
from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import MAX_EPOCH, ReplicaKey, epoch_in_bounds
from quorum_node.raft.voters import voters_record
from quorum_node.storage.dir_lock import DirectoryInUseError, DirectoryLock, lock_directory
from quorum_node.storage.errors import StorageError
from quorum_node.storage.fsutil import (
    atomic_write,
    ensure_directory,
    fsync_directory,
    open_private,
    write_all,
)
from quorum_node.storage.kafka_uuid import is_reserved, random_uuid, to_kafka_string
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import (
    META_PROPERTIES,
    MetaProperties,
    read_meta_properties,
    validate_cluster_id,
)
from quorum_node.storage.quorum_state import QuorumStateStore
from quorum_node.storage.segment_log import SegmentLog

_CHUNK = 1 << 20
STAGING_PREFIX = ".restore-"
BUILDING_SUFFIX = ".restoring"
# A manifest takes a few hundred bytes per file: this bounds what is read before it is parsed.
MAX_MANIFEST_BYTES = 16 << 20


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
    raw = source.read_bytes(MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
    if raw is None:
        raise BackupError(f"{source.uri}: no {MANIFEST_NAME}: not a backup, or an incomplete one")
    manifest = BackupManifest.parse(raw, f"{source.uri}/{MANIFEST_NAME}")
    for entry in manifest.files:
        _stage(source, entry, staging / entry.path)
    _check_contents(manifest, staging, source.uri)
    return VerifiedBackup(manifest, staging)


def _stage(source: BackupStore, entry: FileEntry, local: Path) -> None:
    """Copy one file of the backup, never more of it than the manifest says it holds: a larger
    one is refused at its first byte too many, not read to its end (a segment that was a link
    to /dev/zero once had 2 GiB staged before its size was compared)."""
    ensure_directory(local.parent)
    digest = hashlib.sha256()
    size = 0
    with source.open(entry.path) as stream, \
            open(open_private(local, os.O_WRONLY | os.O_EXCL), "wb") as output:
        while chunk := stream.read(min(_CHUNK, entry.size - size + 1)):
            size += len(chunk)
            if size > entry.size:
                raise BackupError(f"{source.uri}/{entry.path}: larger than the {entry.size} "
                                  f"bytes the manifest says: damaged backup")
            digest.update(chunk)
            output.write(chunk)
    if size != entry.size or digest.hexdigest() != entry.sha256:
        raise BackupError(f"{source.uri}/{entry.path}: checksum mismatch ({size} bytes, "
                          f"sha256 {digest.hexdigest()[:12]}..., the manifest says "
                          f"{entry.size} bytes, {entry.sha256[:12]}...): damaged backup")


@contextlib.contextmanager
def mapped(path: Path) -> Iterator[memoryview]:
    """A staged file's bytes, mapped rather than read (a snapshot or segment may be large)."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            yield memoryview(b"")
            return
        with (mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) as region,
              memoryview(region) as data):
            yield data


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
    snapshot_end = _check_snapshot(manifest, paths, files, uri)
    segments = sorted(path for path in paths if path.endswith(".log"))
    if segments:
        damage = SegmentLog.find_damage(files / METADATA_PARTITION_DIR)
        if damage is not None:
            # What a node's recovery would refuse, or cut at its start: either way not a backup.
            raise BackupError(f"{uri}/{METADATA_PARTITION_DIR}/{damage.path.name}: damaged at "
                              f"byte {damage.position}: {damage.reason}")
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
        with mapped(files / segment) as data:
            position = 0
            while position < len(data):
                # find_damage checked every batch's header and CRC32C.
                header = read_batch_header(data, position, verify_crc=False)
                if header.base_offset != expected:
                    raise BackupError(f"{uri}/{segment}: batch at byte {position} has offset "
                                      f"{header.base_offset}, expected {expected}")
                expected, last_epoch, position = header.next_offset, header.epoch, header.end
    end = max(expected, snapshot_end)
    if end != manifest.end_offset or last_epoch != manifest.last_epoch:
        raise BackupError(f"{uri}: the files end at offset {end} in epoch {last_epoch}, the "
                          f"manifest says {manifest.end_offset} in epoch {manifest.last_epoch}")
    if not epoch_in_bounds(last_epoch):
        # The restored log ends in this epoch (the new voters' batch too): a node refuses to
        # start on it, since no election could follow.
        raise BackupError(f"{uri}: the last epoch {last_epoch} is not below {MAX_EPOCH}: the "
                          f"log holds batches no correct leader wrote, and a node would refuse "
                          f"it")


def _check_snapshot(manifest: BackupManifest, paths: set[str], files: Path, uri: str) -> int:
    """Check the backup's snapshot as a node checks one it is sent, framing and records;
    its end offset (0 without one)."""
    snapshots = sorted(path for path in paths if path.endswith(".checkpoint"))
    if manifest.snapshot is None:
        if snapshots:
            raise BackupError(f"{uri}: a snapshot file the manifest does not name")
        return 0
    name = f"{manifest.snapshot.end_offset:020d}-{manifest.snapshot.epoch:010d}.checkpoint"
    if snapshots != [f"{METADATA_PARTITION_DIR}/{name}"]:
        raise BackupError(f"{uri}: the manifest's snapshot {name} is not its one snapshot file")
    if not epoch_in_bounds(manifest.snapshot.epoch):
        raise BackupError(f"{uri}/{snapshots[0]}: epoch {manifest.snapshot.epoch} is not below "
                          f"{MAX_EPOCH}: a node would refuse it")
    try:
        with mapped(files / snapshots[0]) as data:
            check_snapshot(data)
            check_snapshot_records(iter_snapshot_records(data))
    except CorruptSnapshotError as error:
        raise BackupError(f"{uri}/{snapshots[0]}: damaged snapshot: {error}") from None
    return manifest.snapshot.end_offset


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
            cluster_id: str | None = None,
            on_leftover: Callable[[Path], None] = lambda path: None) -> list[RestoredNode]:
    """Build the log directory of each voter in ``node_ids`` (default: every voter) at
    ``log_dir_of(id)`` from the backup at ``source``. ``cluster_id``: a new cluster id (default:
    the backup's). Every target must be missing or empty; nothing is written unless the backup
    checks out. ``on_leftover`` is told of each directory a killed restore left, before it is
    removed."""
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
    targets = [log_dir_of(node_id) for node_id in chosen]
    staging_parent = targets[0].parent
    missing = staging_parent  # the outermost directory this creates, removed on a refusal
    while not missing.parent.exists():
        missing = missing.parent
    created = not missing.exists()
    ensure_directory(staging_parent)
    try:
        _remove_leftovers(targets, on_leftover)
        staging, lock = _new_staging(staging_parent)
        try:
            backup = fetch_verified(source, staging)
            restored = []
            for node_id, target in zip(chosen, targets, strict=True):
                key = by_id[node_id]
                assert key.directory_id is not None
                _build(backup, target, MetaProperties(cluster_id or backup.manifest.cluster_id,
                                                      node_id, key.directory_id), voters)
                restored.append(RestoredNode(node_id, key.directory_id, target))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            lock.release()
    except BaseException:
        if created:
            shutil.rmtree(missing, ignore_errors=True)
        raise
    return restored


def _remove_leftovers(targets: Sequence[Path], on_leftover: Callable[[Path], None]) -> None:
    """Remove the staging and building directories a killed restore left beside ``targets``;
    those a running restore holds are left to it (its building directory of a target of ours
    is an error: two restores would write the same directory)."""
    leftovers = [path for parent in dict.fromkeys(target.parent for target in targets)
                 for path in sorted(parent.glob(f"{STAGING_PREFIX}*"))]
    building = {target.with_name(f".{target.name}{BUILDING_SUFFIX}") for target in targets}
    leftovers += sorted(path for path in building if path.exists())
    for path in leftovers:
        try:
            lock = lock_directory(path, what="directory of a running restore")
        except DirectoryInUseError as error:
            if path in building:
                raise BackupError(str(error)) from None
            continue  # another restore's staging directory
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            on_leftover(path)
            shutil.rmtree(path)
        finally:
            lock.release()


def _new_staging(parent: Path) -> tuple[Path, DirectoryLock]:
    """A new staging directory in ``parent``, locked: another restore that starts meanwhile
    can tell it from a killed restore's leftover, which it removes."""
    for _ in range(5):
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))  # 0700
        try:
            return staging, lock_directory(staging, what="restore staging directory")
        except (FileNotFoundError, DirectoryInUseError):
            # Taken for a leftover by a restore starting at the same moment: try another.
            continue
    raise BackupError(f"{parent}: could not create a staging directory (other restores keep "
                      f"removing them)")


def _build(backup: VerifiedBackup, target: Path, meta: MetaProperties,
           voters: Sequence[ReplicaKey]) -> None:
    building = target.with_name(f".{target.name}{BUILDING_SUFFIX}")
    # Locked until renamed into place; the lock file becomes the node's own (``dir_lock``).
    try:
        lock = lock_directory(building, create=True, what="directory of a running restore")
    except DirectoryInUseError as error:
        raise BackupError(str(error)) from None
    try:
        _fill(backup, building, meta, voters)
        if target.exists():
            target.rmdir()  # empty (checked)
        building.rename(target)
        fsync_directory(target.parent)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    finally:
        lock.release()


def _fill(backup: VerifiedBackup, building: Path, meta: MetaProperties,
          voters: Sequence[ReplicaKey]) -> None:
    """The restored directory's contents: the backup's files, then the new voters' batch."""
    manifest = backup.manifest
    partition = building / METADATA_PARTITION_DIR
    ensure_directory(partition)
    for entry in manifest.files:
        if entry.path != META_PROPERTIES:
            _copy_private(backup.files / entry.path, building / entry.path)
    segments = sorted(p for p in partition.iterdir() if p.name.endswith(".log"))
    last = segments[-1] if segments else partition / f"{manifest.end_offset:020d}.log"
    batch = encode_batch(manifest.end_offset, manifest.last_epoch, [voters_record(voters)],
                         int(time.time() * 1000), is_control=True)
    fd = open_private(last, os.O_WRONLY)
    try:
        write_all(fd, batch, os.fstat(fd).st_size)
        os.fsync(fd)
    finally:
        os.close(fd)
    # The election state of a voter that has seen the log's last epoch and voted in none: what
    # the node would start from anyway, written so that it does not take a clean restore's
    # missing file for a quorum-state that fell behind its log (a warning about damage).
    QuorumStateStore(partition).write(ElectionState(manifest.last_epoch))
    atomic_write(building / META_PROPERTIES, meta.to_properties().encode("utf-8"),
                 replace=False)
    fsync_directory(partition)
    fsync_directory(building)


def _copy_private(source: Path, destination: Path) -> None:
    """Copy a staged file (``FILE_MODE``, whatever the umask) and fsync it."""
    with source.open("rb") as input_file, \
            open(open_private(destination, os.O_WRONLY | os.O_EXCL), "wb") as output:
        shutil.copyfileobj(input_file, output, _CHUNK)
        output.flush()
        os.fsync(output.fileno())
