"""The data directory ``quorum-node local`` runs a quorum from, as far as others write one:
``restore --local`` builds it from a backup, so that ``local`` starts the restored quorum as it
is, as it would restart one it had formatted itself.

    DATA_DIR/cluster.id     the quorum's cluster id (one line)
    DATA_DIR/node-<i>/      node i's log directory, for i in 1..N

``local`` writes the rest (``node-<i>.properties``, the peer secret) on every start.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from quorum_node.backup.manifest import BackupError
from quorum_node.backup.restore import RestoredNode, new_voter_set, restore
from quorum_node.backup.store import BackupStore
from quorum_node.storage.fsutil import atomic_write
from quorum_node.storage.meta_properties import META_PROPERTIES, read_meta_properties

CLUSTER_ID_FILE = "cluster.id"


def node_dir(data_dir: Path, node_id: int) -> Path:
    return data_dir / f"node-{node_id}"


def restore_local(source: BackupStore, data_dir: Path, nodes: int, *,
                  cluster_id: str | None = None,
                  on_leftover: Callable[[Path], None] = lambda path: None
                  ) -> tuple[str, list[RestoredNode]]:
    """Restore the backup at ``source`` as the data directory of a local quorum of voters
    1..``nodes`` (missing or empty, as ``local`` takes only a new directory or its own); the
    restored cluster id (the backup's unless ``cluster_id``) and nodes. BackupError, having
    written nothing, when the backup or the directory is refused."""
    if nodes < 1:
        raise BackupError(f"--nodes must be at least 1, got {nodes}")
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise BackupError(f"{data_dir}: not empty; restore writes a new data directory only")
    voters = new_voter_set([(node_id, None) for node_id in range(1, nodes + 1)], generate=True)
    restored = restore(source, voters, lambda node_id: node_dir(data_dir, node_id),
                       cluster_id=cluster_id, on_leftover=on_leftover)
    restored_id = read_meta_properties(restored[0].log_dir / META_PROPERTIES).cluster_id
    # Last: a directory without it is one local refuses (a restore interrupted before it).
    atomic_write(data_dir / CLUSTER_ID_FILE, f"{restored_id}\n".encode("ascii"), replace=False)
    return restored_id, restored
