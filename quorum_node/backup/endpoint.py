"""The names of ``GET /v1/backup``, which the node serves (``quorum_node.node.api.backup``) and a
backup's writer asks (``quorum_node.backup.writer``): its path, and the response headers that
name the backup before its body is read (its cluster, node, time and end offset), so that a
writer can choose where it goes."""

from __future__ import annotations

BACKUP_PATH = "/v1/backup"
CLUSTER_ID_HEADER = "X-Backup-Cluster-Id"
NODE_ID_HEADER = "X-Backup-Node-Id"
CREATED_AT_HEADER = "X-Backup-Created-At"
END_OFFSET_HEADER = "X-Backup-End-Offset"
