"""The core's rooms built on their own, wired as ``RaftCore`` wires them, around a ``MemoryLog``:
for the tests of one room's logic without the dispatcher in front of it."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.follower_fetch import FollowerFetcher
from quorum_node.raft.leader import LeaderState
from quorum_node.raft.log import MemoryLog
from quorum_node.raft.memory_snapshots import MemorySnapshotStore
from quorum_node.raft.outbox import Outbox, WarningLimiter
from quorum_node.raft.quorum_rpcs import QuorumRpcs
from quorum_node.raft.quorum_state import QuorumState, TransitionCause
from quorum_node.raft.reads import LinearizableReads
from quorum_node.raft.records import Record
from quorum_node.raft.replication import LeaderReplication
from quorum_node.raft.requests import RequestManager
from quorum_node.raft.snapshot_transfer import SnapshotTransfer
from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import ReplicaKey
from quorum_node.raft.voter_change import VoterChangeHandler
from quorum_node.raft.voter_history import VoterHistory
from quorum_node.raft.watermarks import Watermarks


def key(node_id: int) -> ReplicaKey:
    return ReplicaKey(node_id, uuid.UUID(int=node_id))


CLUSTER_ID = "rooms-cluster"
LOCAL = key(1)
VOTERS = (LOCAL, key(2), key(3))


@dataclass
class Rooms:
    log: MemoryLog
    snapshots: MemorySnapshotStore
    config: QuorumConfig
    voters: VoterHistory
    quorum: QuorumState
    requests: RequestManager
    outbox: Outbox
    watermarks: Watermarks
    replication: LeaderReplication
    reads: LinearizableReads
    transfer: SnapshotTransfer
    follower: FollowerFetcher
    rpcs: QuorumRpcs
    voters_changed: int = 0  # how often a room said the voter set changed

    def lead(self) -> LeaderState:
        """Make the local replica leader of the next epoch, from the log's end."""
        self.quorum.to_candidate(0, TransitionCause.ELECTION_TIMEOUT)
        return self.quorum.to_leader(0, self.log.end_offset)


def build(log_epochs: Iterable[tuple[int, int]] = (),
          static_voters: tuple[ReplicaKey, ...] = VOTERS) -> Rooms:
    log, snapshots = MemoryLog(), MemorySnapshotStore()
    for epoch, count in log_epochs:  # one leader batch per (epoch, record count)
        log.append_as_leader([Record(value=b"r%d" % i) for i in range(count)], epoch, 0)
    log.flush()
    config = QuorumConfig(high_watermark_linger_ms=0, leader_flush_delay_ms=0)
    voters = VoterHistory(local_key=LOCAL, static_voters=static_voters, log=log,
                          snapshots=snapshots)
    quorum = QuorumState(local_key=LOCAL, config=config, random=random.Random(0),
                         voters=lambda: voters.voters, on_leave=lambda old: None,
                         stored=ElectionState.initial(), log_epoch=log.last_fetched_epoch(),
                         log_end_offset=log.end_offset, now_ms=0)
    requests = RequestManager(config.request_timeout_ms, config.retry_backoff_ms)
    warnings = WarningLimiter()
    outbox = Outbox(node_id=LOCAL.id, requests=requests, warnings=warnings)
    watermarks = Watermarks(node_id=LOCAL.id, flushed_offset=log.end_offset)
    def voters_changed() -> None:  # called once ``rooms`` is built
        rooms.voters_changed += 1

    replication = LeaderReplication(
        local_key=LOCAL, cluster_id=CLUSTER_ID, config=config, log=log, snapshots=snapshots,
        quorum=quorum, voters=voters,
        voter_changes=VoterChangeHandler(local_key=LOCAL, static_ids=voters.static_ids,
                                         fetch_timeout_ms=config.fetch_timeout_ms),
        fetcher_ids=voters.static_ids, watermarks=watermarks, outbox=outbox, warnings=warnings,
        voters_changed=voters_changed)
    rooms = Rooms(log, snapshots, config, voters, quorum, requests, outbox, watermarks,
                  replication, LinearizableReads(local_key=LOCAL, replication=replication,
                                                 outbox=outbox),
                  transfer=None, follower=None, rpcs=None)  # type: ignore[arg-type]

    rooms.transfer = SnapshotTransfer(
        local_key=LOCAL, config=config, log=log, snapshots=snapshots, quorum=quorum,
        voters=voters, replication=replication, watermarks=watermarks, requests=requests,
        outbox=outbox, warnings=warnings, check_snapshot_records=None,
        voters_changed=voters_changed)
    rooms.follower = FollowerFetcher(
        local_key=LOCAL, cluster_id=CLUSTER_ID, config=config, log=log, snapshots=snapshots,
        quorum=quorum, voters=voters, transfer=rooms.transfer, watermarks=watermarks,
        requests=requests, outbox=outbox, voters_changed=voters_changed)
    rooms.rpcs = QuorumRpcs(local_key=LOCAL, cluster_id=CLUSTER_ID, config=config, log=log,
                            quorum=quorum, voters=voters, requests=requests, outbox=outbox,
                            warnings=warnings)
    return rooms
