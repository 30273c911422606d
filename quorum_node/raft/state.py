"""The persisted election state and the replica states of the Raft core."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from quorum_node.raft.types import ReplicaKey


@dataclass(frozen=True, slots=True)
class ElectionState:
    """What the quorum-state file holds: the epoch, the leader known for it, the vote cast in it."""

    epoch: int
    leader_id: int | None = None
    voted_key: ReplicaKey | None = None

    @classmethod
    def initial(cls) -> ElectionState:
        return cls(epoch=0)


class RaftState(enum.StrEnum):
    """Replica states, named as Kafka's current-state metric names them."""

    UNATTACHED = "unattached"
    PROSPECTIVE = "prospective"
    CANDIDATE = "candidate"
    LEADER = "leader"
    FOLLOWER = "follower"
    RESIGNED = "resigned"
