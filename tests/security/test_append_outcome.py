"""A node that stops on a failure after proposing a write: what the append is told, and what
its shutdown still closes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from secured_cluster import InProcessCluster, plain_configs

from quorum_node.node.runtime import CommitUnknownError, QuorumNode
from quorum_node.raft.records import Record
from quorum_node.storage.dir_lock import lock_directory


def _fail_its_next_flush(node: QuorumNode) -> None:
    def failing_flush() -> int:
        raise OSError(5, "Input/output error")

    node.log_dir.log.flush = failing_flush  # type: ignore[method-assign]


def test_a_node_failing_after_the_proposal_leaves_the_outcome_unknown(tmp_path: Path) -> None:
    cluster = InProcessCluster(plain_configs(tmp_path, 1))
    try:
        node = cluster.nodes[1]
        cluster.run(node.append([Record(b"first")], 10))  # a leader that takes writes
        _fail_its_next_flush(node)
        # The write is proposed, then its fsync fails and the node stops: the records may be on
        # other replicas, so this is no "not the leader" (which invites a retry).
        with pytest.raises(CommitUnknownError, match="may still commit"):
            cluster.run(node.append([Record(b"second")], 10))
        assert node.failure is not None
    finally:
        cluster.stop()


def test_the_shutdown_of_a_failed_node_closes_its_tasks_listeners_and_directory(
        tmp_path: Path) -> None:
    """A process embedding a node (or a supervisor restarting one in-process) gets back its
    ports and its log directory, and no task of the node is left pending."""
    cluster = InProcessCluster(plain_configs(tmp_path, 1))
    node = cluster.nodes[1]
    port = node.config.client_listeners[0].port
    try:
        cluster.run(node.append([Record(b"first")], 10))
        _fail_its_next_flush(node)
        with pytest.raises(CommitUnknownError):
            cluster.run(node.append([Record(b"second")], 10))
        assert node.failure is not None
    finally:
        cluster.stop()
    assert not node._tasks, f"tasks left pending: {node._tasks}"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    lock_directory(node.config.log_dir).release()
