"""What an append is told when its node stops on a failure after proposing it."""

from __future__ import annotations

from pathlib import Path

import pytest
from secured_cluster import InProcessCluster, plain_configs

from quorum_node.node.runtime import CommitUnknownError
from quorum_node.raft.records import Record


def test_a_node_failing_after_the_proposal_leaves_the_outcome_unknown(tmp_path: Path) -> None:
    cluster = InProcessCluster(plain_configs(tmp_path, 1))
    try:
        node = cluster.nodes[1]
        cluster.run(node.append([Record(b"first")], 10))  # a leader that takes writes

        def failing_flush() -> int:
            raise OSError(5, "Input/output error")

        node.log_dir.log.flush = failing_flush  # type: ignore[method-assign]
        # The write is proposed, then its fsync fails and the node stops: the records may be on
        # other replicas, so this is no "not the leader" (which invites a retry).
        with pytest.raises(CommitUnknownError, match="may still commit"):
            cluster.run(node.append([Record(b"second")], 10))
        assert node.failure is not None
    finally:
        cluster.stop()
