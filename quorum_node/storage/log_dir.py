"""A node's log directory as a whole: its identity, the metadata partition's log, snapshots and
quorum-state, opened together and only after the identity checks out.

Layout, as Kafka's::

    <log_dir>/.lock                                held by the process using the directory
    <log_dir>/meta.properties                      cluster id, node id, directory id
    <log_dir>/__cluster_metadata-0/<offset>.log    segments
    <log_dir>/__cluster_metadata-0/<offset>-<epoch>.checkpoint    snapshots
    <log_dir>/__cluster_metadata-0/quorum-state    election state
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from quorum_node.storage.dir_lock import DirectoryLock, lock_directory
from quorum_node.storage.fsutil import restrict_permissions
from quorum_node.storage.meta_properties import MetaProperties, load_meta_properties
from quorum_node.storage.quorum_state import QuorumStateStore
from quorum_node.storage.segment_log import DEFAULT_SEGMENT_BYTES, SegmentLog
from quorum_node.storage.snapshot_store import FileSnapshotStore

logger = logging.getLogger(__name__)

METADATA_PARTITION_DIR = "__cluster_metadata-0"


@dataclass(frozen=True)
class LogDirectory:
    path: Path
    meta: MetaProperties
    log: SegmentLog
    quorum_state: QuorumStateStore
    snapshots: FileSnapshotStore
    lock: DirectoryLock  # held until close()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        cluster_id: str,
        node_id: int,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        lock: DirectoryLock | None = None,
    ) -> LogDirectory:
        """Open a formatted directory for ``node_id`` of ``cluster_id``. Raises a StorageError
        (and touches nothing) when another process holds the directory's lock, when
        meta.properties is missing or names another node or cluster, before the log is even looked
        at, or when the latest snapshot is damaged.

        The directory's lock is taken here, or ``lock`` (already held by the caller, who formatted
        the directory under it) is used; either way the open directory holds it until ``close``.
        A ``lock`` passed in stays the caller's to release if opening fails.

        Once the directory checks out, what this user owns in it and others could read (files
        an older version created under the umask) is made the owner's only."""
        root = Path(path)
        if lock is not None:
            return cls._open_locked(root, cluster_id, node_id, segment_bytes, lock)
        # A directory that is not this node's is refused before even the lock file is created.
        load_meta_properties(root, cluster_id, node_id)
        own_lock = lock_directory(root)
        try:
            return cls._open_locked(root, cluster_id, node_id, segment_bytes, own_lock)
        except BaseException:
            own_lock.release()
            raise

    @classmethod
    def _open_locked(
        cls, root: Path, cluster_id: str, node_id: int, segment_bytes: int, lock: DirectoryLock
    ) -> LogDirectory:
        meta = load_meta_properties(root, cluster_id, node_id)  # again: now nobody else writes
        partition = root / METADATA_PARTITION_DIR
        # Snapshots first: the log reconciles its start with the latest one, which must be
        # whole (the log below it may be deleted, so a damaged one is refused, not skipped).
        snapshots = FileSnapshotStore(partition)
        latest = snapshots.latest()
        if latest is not None:
            snapshots.check(latest)
        log = SegmentLog(partition, segment_bytes, latest)
        _restrict_permissions(root, partition)
        return cls(root, meta, log, QuorumStateStore(partition), snapshots, lock)

    def close(self) -> None:
        self.log.close()
        self.lock.release()


def _restrict_permissions(root: Path, partition: Path) -> None:
    """Make what an older version left readable by everyone (its files were created under the
    umask, 0644 by default) its owner's only, as everything is created now: the directory,
    meta.properties, the partition, its segments, snapshots and quorum-state."""
    changed = restrict_permissions([root, *root.iterdir(), *partition.iterdir()])
    if changed:
        logger.info("%s: %d files and directories were readable by other users: now by their "
                    "owner only", root, changed)
