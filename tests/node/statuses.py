"""Node statuses for the tests of what reads them (the story, the metrics' watcher)."""

from __future__ import annotations

import dataclasses
from typing import Any

from quorum_node.raft.state import RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import ReplicaKey

BASE = NodeStatus(
    as_of_ms=0, node_id=1, directory_id=None, cluster_id="c", state=RaftState.UNATTACHED,
    epoch=0, leader_id=None, voted_for=None, is_voter=True, high_watermark=None,
    leader_has_committed=False, voters_unheard=(), log_start_offset=0, log_end_offset=0,
    log_end_epoch=0, flushed_offset=0, voters=(ReplicaKey(1), ReplicaKey(2), ReplicaKey(3)),
    pending_voter_change=None, snapshot_id=None, refused_snapshots=0, quorum=None)


def status(**changes: Any) -> NodeStatus:
    """Node 1 of voters 1, 2 and 3, Unattached in epoch 0, but for ``changes``."""
    return dataclasses.replace(BASE, **changes)
