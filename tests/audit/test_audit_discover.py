"""Which directories the audit takes for replicas, and which for backups still being written
(``quorum_audit.discover``): no Spark needed."""

from __future__ import annotations

import datetime
from pathlib import Path

from quorum_audit.discover import discover
from quorum_node.backup.manifest import default_backup_name
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id


def test_a_backup_without_its_manifest_is_incomplete_scheduled_or_on_demand(
        tmp_path: Path) -> None:
    """An on-demand backup (the operator's QuorumBackup) carries its resource's name after the
    scheduled name; cut off before its manifest, it is as incomplete as a scheduled one, not a
    replica with files missing."""
    cluster_id = random_cluster_id()
    moment = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    scheduled = tmp_path / default_backup_name(cluster_id, 1, moment)
    on_demand = tmp_path / default_backup_name(cluster_id, 2, moment, "before-upgrade")
    for root, node_id in ((scheduled, 1), (on_demand, 2)):
        format_log_dir(root, cluster_id, node_id)  # the first file a backup writes

    found = discover([str(tmp_path)])
    assert found.incomplete_backups == sorted([str(scheduled), str(on_demand)])
    assert found.replicas == []
    assert found.problems == []
