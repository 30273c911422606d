"""Forged peer messages from node ids that are no member of the cluster: Vote, BeginQuorumEpoch,
EndQuorumEpoch, Fetch and FetchSnapshot with random but well-formed contents (epochs anywhere up
to and including MAX_EPOCH), delivered to running nodes over the network. What an outsider who
got past the transport's authentication, or a misconfigured node, could send: the invariants must
hold regardless, and the quorum must keep its liveness. Their answers go nowhere (no node has the
forger's id)."""

from __future__ import annotations

import random
import uuid

from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchSnapshotRequest,
    RaftRequest,
    ReplicaInfo,
    SnapshotIdField,
    VoteRequest,
)
from quorum_node.raft.types import MAX_EPOCH, ReplicaKey
from quorum_node.sim.cluster import CLUSTER_ID, Cluster

# Forger ids, far from every node's.
FIRST_FORGED_ID = 1000
FORGED_IDS = 50


class Forger:
    """Sends a forged request every ``min_interval_ms``..``max_interval_ms`` while on."""

    def __init__(self, cluster: Cluster, rng: random.Random, *, min_interval_ms: int = 5,
                 max_interval_ms: int = 100) -> None:
        self._cluster = cluster
        self._rng = rng
        self._min_interval_ms = min_interval_ms
        self._max_interval_ms = max_interval_ms
        self._running = False
        self._correlation_id = 0
        self.sent = 0

    def start(self) -> None:
        if not self._running:
            self._running = True
            self._schedule()

    def stop(self) -> None:
        self._running = False

    def _schedule(self) -> None:
        delay = self._rng.randint(self._min_interval_ms, self._max_interval_ms)
        self._cluster.loop.after(delay, self._forge_one)

    def _forge_one(self) -> bool:
        if not self._running:
            return False
        self._schedule()
        alive = list(self._cluster.alive())
        if not alive:
            return False
        target = self._rng.choice(alive)
        source = FIRST_FORGED_ID + self._rng.randrange(FORGED_IDS)
        request = self._request(source, target.node_id)
        self._correlation_id += 1
        correlation_id = self._correlation_id
        incarnation = target.incarnation

        def deliver() -> bool:
            if not target.alive or target.incarnation != incarnation:
                return False
            target.handle_request(source, correlation_id, request)
            return True

        self.sent += 1
        self._cluster.network.send(source, target.node_id, deliver)
        return True

    def _epoch(self) -> int:
        """Near the epochs the cluster is at, or anywhere up to the bound (and at it)."""
        rng = self._rng
        roll = rng.random()
        if roll < 0.6:
            return rng.randint(0, 30)
        if roll < 0.9:
            return rng.randint(0, MAX_EPOCH - 1)
        return MAX_EPOCH

    def _offset(self) -> int:
        return self._rng.randint(0, 400) if self._rng.random() < 0.8 else self._rng.randint(
            0, 2**40)

    def _directory(self) -> uuid.UUID | None:
        return None if self._rng.random() < 0.5 else uuid.UUID(int=self._rng.getrandbits(128),
                                                               version=4)

    def _request(self, source: int, destination: int) -> RaftRequest:
        rng = self._rng
        kind = rng.randrange(5)
        if kind == 0:
            epoch = self._epoch()
            pre_vote = rng.random() < 0.5
            last_epoch = rng.randint(0, epoch if pre_vote else max(epoch - 1, 0))
            return VoteRequest(cluster_id=CLUSTER_ID, voter_id=destination,
                               replica_epoch=epoch, replica_id=source,
                               replica_directory_id=self._directory(),
                               last_offset_epoch=last_epoch, last_offset=self._offset(),
                               pre_vote=pre_vote)
        if kind == 1:
            return BeginQuorumEpochRequest(cluster_id=CLUSTER_ID, leader_id=source,
                                           leader_epoch=self._epoch(), voter_id=destination)
        if kind == 2:
            successors = rng.sample(list(self._cluster.nodes),
                                    rng.randint(0, len(self._cluster.nodes)))
            return EndQuorumEpochRequest(
                cluster_id=CLUSTER_ID, leader_id=source, leader_epoch=self._epoch(),
                voter_id=destination,
                preferred_successors=tuple(ReplicaInfo.of(ReplicaKey(s)) for s in successors))
        epoch = self._epoch()
        if kind == 3:
            return FetchRequest(cluster_id=CLUSTER_ID, replica_id=source,
                                replica_directory_id=self._directory(),
                                max_wait_ms=rng.randint(0, 500), current_leader_epoch=epoch,
                                fetch_offset=self._offset(), last_fetch_epoch=rng.randint(0, epoch),
                                high_watermark=None if rng.random() < 0.5 else self._offset())
        return FetchSnapshotRequest(
            cluster_id=CLUSTER_ID, replica_id=source, replica_directory_id=self._directory(),
            current_leader_epoch=epoch,
            snapshot_id=SnapshotIdField(end_offset=self._offset(), epoch=rng.randint(0, epoch)),
            position=self._offset())
