"""The states of a replica without a leader to follow, as Kafka keeps them (``UnattachedState``,
``ProspectiveState``, ``CandidateState``, ``ResignedState``): their timers, their elections, and
whom each may give its vote to (``can_grant_vote``, Kafka's grant matrix of KIP-595 and KIP-996 as
shipped; ``FollowerState`` and ``LeaderState`` answer it too). ``QuorumState`` moves between
them, ``RaftCore`` sends the votes; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorum_node.raft.election import EpochElection
from quorum_node.raft.types import NEVER, ReplicaKey


def _grant_without_leader(voted_key: ReplicaKey | None, leader_id: int | None,
                          candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
    """Unattached and Prospective: a pre-vote to any candidate with a log as new as ours; a
    vote to the one already voted for, else (no leader known) to the first up-to-date one."""
    if pre_vote:
        return up_to_date
    if voted_key is not None:
        return voted_key.id == candidate.id and (
            voted_key.directory_id is None or voted_key.directory_id == candidate.directory_id)
    if leader_id is not None:
        return False
    return up_to_date


@dataclass(slots=True)
class UnattachedState:
    epoch: int
    leader_id: int | None
    voted_key: ReplicaKey | None
    election_deadline_ms: int  # NEVER for observers
    next_discovery_ms: int = 0

    def can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        return _grant_without_leader(self.voted_key, self.leader_id, candidate, up_to_date,
                                     pre_vote)


@dataclass(slots=True)
class ProspectiveState:
    epoch: int
    leader_id: int | None
    voted_key: ReplicaKey | None
    election: EpochElection
    election_deadline_ms: int
    # When the voters that rejected the pre-vote are asked again: a follower that still heard
    # from its leader when asked (KAFKA-17641) grants once its own fetch timeout has passed.
    # Without this, the one replica with the newest log may time out first, be told no, wait
    # out its election timeout and a whole fetch timeout again while the others, behind it,
    # cannot win.
    ask_again_ms: int = NEVER
    # It granted the pre-vote of a voter with a lower id, which stands: this one does not, in
    # this round. The followers of a leader gone silent time out within a jitter of each other;
    # two that turn prospective a round trip apart grant each other's pre-votes, and both
    # standing split the vote (each votes for itself): a wasted round of an election timeout.
    # The one with the lower id stands: a voter grants pre-votes only to logs at least as new as
    # its own, so the one it stands down for has one. A round it fails ends at the election
    # timer as any.
    yielded: bool = False

    def can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        return _grant_without_leader(self.voted_key, self.leader_id, candidate, up_to_date,
                                     pre_vote)

    def ask_again_if_due(self, now_ms: int, interval_ms: int) -> None:
        """Forget the rejections once ``ask_again_ms`` has come (those voters are asked again),
        and set it ``interval_ms`` ahead while there are rejections to forget."""
        if now_ms >= self.ask_again_ms:
            self.election.forget_rejections()
            self.ask_again_ms = NEVER
        if self.ask_again_ms == NEVER and self.election.has_rejections:
            self.ask_again_ms = now_ms + interval_ms


@dataclass(slots=True)
class CandidateState:
    epoch: int
    election: EpochElection
    election_deadline_ms: int

    def can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        return up_to_date if pre_vote else False  # its own vote is cast


@dataclass(slots=True)
class ResignedState:
    epoch: int
    voted_key: ReplicaKey | None
    election_deadline_ms: int
    preferred_successors: tuple[ReplicaKey, ...]
    unacknowledged: set[int]  # voters yet to acknowledge the EndQuorumEpoch

    def can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        return up_to_date if pre_vote else False  # it led this epoch
