"""Linearizable reads on the leader (Raft's ReadIndex, as etcd serves them).

A read takes a barrier at the leader's high watermark; it is confirmed once a majority of voters
(this leader included) has fetched after it was taken (no other leader can have been elected by
then: each fetch proves it by echoing the barrier, ``ReadBarrier``), times out at its deadline,
or is abandoned with the leadership. The barriers themselves are the ``LeaderState``'s
(``begin_read``, ``settle_reads``, ``abandon_reads``); this room numbers them, hurries the
confirming fetches along and hands the outcomes to the ``Outbox``.
"""

from __future__ import annotations

from quorum_node.raft.leader import LeaderState, ReadBarrier
from quorum_node.raft.outbox import Outbox
from quorum_node.raft.replication import LeaderReplication
from quorum_node.raft.types import ReplicaKey


class LinearizableReads:
    def __init__(self, *, local_key: ReplicaKey, replication: LeaderReplication,
                 outbox: Outbox) -> None:
        self._local_key = local_key
        self._replication = replication
        self._outbox = outbox
        self._next_read_id = 0

    def begin(self, now_ms: int, leader: LeaderState, timeout_ms: int) -> ReadBarrier | None:
        """A barrier at the high watermark, settled by a ``ReadOutcome`` effect; None while the
        leader has no high watermark yet (its LeaderChange is not committed).

        Parked fetches are answered at once, naming the barrier, so that followers fetch again
        right away: their next fetches, echoing it, are what confirm that this replica is still
        the leader."""
        if leader.high_watermark is None:
            return None
        self._next_read_id += 1
        barrier = leader.begin_read(self._next_read_id, leader.high_watermark,
                                    now_ms + timeout_ms)
        for parked in leader.parked:
            parked.progress.read_barrier_released = barrier.id
        self._replication.complete_parked_fetches(leader, lambda parked: True)
        return barrier

    def settle(self, now_ms: int, leader: LeaderState) -> None:
        """Confirm the barriers a majority has echoed; time out the late ones."""
        self._outbox.effects.reads.extend(leader.settle_reads(now_ms, self._local_key))

    def abandon(self, leader: LeaderState, leader_id: int | None, epoch: int) -> None:
        """The leadership is lost: every barrier is abandoned, with where it went."""
        self._outbox.effects.reads.extend(leader.abandon_reads(leader_id, epoch))
