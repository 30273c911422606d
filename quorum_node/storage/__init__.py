"""Durable storage for a quorum node: the log directory's lock and identity (``meta.properties``),
the segmented replicated log (and its repair), and the ``quorum-state`` file."""

from quorum_node.storage.dir_lock import DirectoryInUseError, DirectoryLock, lock_directory
from quorum_node.storage.errors import (
    CorruptLogError,
    MetaPropertiesError,
    NotFormattedError,
    QuorumStateError,
    StorageError,
)
from quorum_node.storage.meta_properties import (
    MetaProperties,
    format_log_dir,
    load_meta_properties,
    random_cluster_id,
)
from quorum_node.storage.quorum_state import QuorumStateStore
from quorum_node.storage.segment_log import LogDamage, SegmentLog
from quorum_node.storage.snapshot_store import FileSnapshotStore

__all__ = [
    "CorruptLogError",
    "DirectoryInUseError",
    "DirectoryLock",
    "FileSnapshotStore",
    "LogDamage",
    "MetaProperties",
    "MetaPropertiesError",
    "NotFormattedError",
    "QuorumStateError",
    "QuorumStateStore",
    "SegmentLog",
    "StorageError",
    "format_log_dir",
    "load_meta_properties",
    "lock_directory",
    "random_cluster_id",
]
