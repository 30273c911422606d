"""The key-value content a restored log directory holds: its snapshot's entries with its log's
operations applied up to an offset, computed from the files, as a node's start-up replays them.
What a restore drill expects the restored quorum to serve."""

from __future__ import annotations

from pathlib import Path

from quorum_node.backup.manifest import BackupManifest
from quorum_node.backup.restore import mapped
from quorum_node.kv.store import KvStore
from quorum_node.raft.snapshot_format import iter_snapshot_records
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR


def restored_content(log_dir: Path, manifest: BackupManifest) -> KvStore:
    """The store as of ``manifest.end_offset``, from the restored directory ``log_dir`` (whose
    files ``restore`` checked: the backup's snapshot and segments, and the new voters' batch,
    which holds no key-value operation)."""
    store = KvStore()
    partition = log_dir / METADATA_PARTITION_DIR
    if manifest.snapshot is not None:
        name = f"{manifest.snapshot.end_offset:020d}-{manifest.snapshot.epoch:010d}.checkpoint"
        with mapped(partition / name) as data:
            store.load_snapshot(iter_snapshot_records(data), manifest.snapshot.end_offset)
    for segment in sorted(partition.glob("*.log")):
        with mapped(segment) as data:
            store.apply_encoded(bytes(data), manifest.end_offset)
    return store
