"""One replica's state at one instant, in one frozen shape (as etcd's ``Status()``): what
``RaftCore.status`` returns, and the one shape the node's ``GET /v1/node``, its Prometheus
collector, its story log, its backups and its Kafka listener read.

Built from the core in one call between steps, so every field holds at the same instant (the
core never changes between two of its reads), and frozen, so that a reader may keep it and
compare it with a later one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from quorum_node.raft.leader import QuorumDescription
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import ReplicaKey, VoterChangeKind
from quorum_node.raft.voters import VoterSet


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """``as_of_ms``: the core's time (the driver's clock) the status was taken at, which the
    leader's ``quorum`` rows are relative to."""

    as_of_ms: int
    node_id: int
    directory_id: uuid.UUID | None  # None: a static quorum (kraft.version 0)
    cluster_id: str
    state: RaftState
    epoch: int
    leader_id: int | None  # a leader (and a resigned one) names itself
    voted_for: ReplicaKey | None  # in the current epoch
    is_voter: bool
    high_watermark: int | None  # None until this replica has learned one in this run
    leader_has_committed: bool  # a leader whose LeaderChange is committed: it serves
    # On a new quorum's first leader: the voters it must hear from before it takes writes.
    voters_unheard: tuple[int, ...]
    log_start_offset: int
    log_end_offset: int
    log_end_epoch: int  # the epoch of the last batch in the log
    flushed_offset: int  # the end of the log known durable
    voters: VoterSet
    pending_voter_change: tuple[VoterChangeKind, ReplicaKey] | None  # on a leader
    snapshot_id: SnapshotId | None  # the latest complete snapshot
    refused_snapshots: int  # downloaded from a leader and refused, since start
    # The leader's record of every replica (DescribeQuorum: end offsets, last fetch and last
    # caught-up times); None on any other replica.
    quorum: QuorumDescription | None

    @property
    def role(self) -> tuple[RaftState, int, int | None]:
        """What a change of role is a change of: the state, the epoch and the leader."""
        return self.state, self.epoch, self.leader_id
