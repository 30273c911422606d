"""Vote tally of one election round (Prospective or Candidate), Kafka's EpochElection."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable

from quorum_node.raft.types import ReplicaKey


class VoteState(enum.Enum):
    UNRECORDED = "unrecorded"
    GRANTED = "granted"
    REJECTED = "rejected"


class EpochElection:
    """Tracks the answers of the voter set fixed when the round started; the local replica has
    granted itself already."""

    def __init__(self, local: ReplicaKey, voters: Iterable[ReplicaKey]) -> None:
        self._votes: dict[ReplicaKey, VoteState] = dict.fromkeys(voters, VoteState.UNRECORDED)
        # Voters that cannot vote at all (a lost directory): rejections no answer changes.
        self._lost: set[ReplicaKey] = set()
        for key in self._votes:
            if key.matches(local):
                self._votes[key] = VoteState.GRANTED
            elif key.id == local.id:
                # Another directory of this very node: a lost disk, which votes no more.
                self._votes[key] = VoteState.REJECTED
                self._lost.add(key)
        self._majority = len(self._votes) // 2 + 1

    def record(self, voter: ReplicaKey, granted: bool) -> None:
        """Record a voter's answer; the first answer of a voter stands (duplicates are ignored).

        The answer counts for the one voter it matches: two voters sharing a node id (a replaced
        disk, KIP-856) are told apart by directory id, and an answer that cannot tell them apart
        counts for neither."""
        matching = [key for key in self._votes if key.matches(voter)]
        if len(matching) != 1 or self._votes[matching[0]] is not VoteState.UNRECORDED:
            return
        self._votes[matching[0]] = VoteState.GRANTED if granted else VoteState.REJECTED

    def record_moved(self, node_id: int, directory_id: uuid.UUID) -> None:
        """Node ``node_id`` answered as ``directory_id``: its voters under any other directory
        cannot vote from there (that disk was replaced, KIP-856). They count as rejections, so
        that the round asks the directory the node has instead of the lost one again."""
        for key, vote in self._votes.items():
            if (key.id == node_id and key.directory_id is not None
                    and key.directory_id != directory_id and vote is VoteState.UNRECORDED):
                self._votes[key] = VoteState.REJECTED
                self._lost.add(key)

    def _answered_no(self) -> list[ReplicaKey]:
        return [key for key, vote in self._votes.items()
                if vote is VoteState.REJECTED and key not in self._lost]

    @property
    def has_rejections(self) -> bool:
        """Whether a voter that can vote said no."""
        return bool(self._answered_no())

    def forget_rejections(self) -> None:
        """Ask again the voters that said no (a pre-vote round only: a pre-vote binds nobody,
        and a follower's no, "my leader is alive", changes once its own fetch timeout passes)."""
        for key in self._answered_no():
            self._votes[key] = VoteState.UNRECORDED

    def _count(self, state: VoteState) -> int:
        return sum(1 for vote in self._votes.values() if vote is state)

    @property
    def is_granted(self) -> bool:
        return self._count(VoteState.GRANTED) >= self._majority

    @property
    def is_rejected(self) -> bool:
        """True once the round can no longer reach a majority."""
        possible = self._count(VoteState.GRANTED) + self._count(VoteState.UNRECORDED)
        return possible < self._majority

    def unrecorded(self) -> list[ReplicaKey]:
        return [key for key, vote in self._votes.items() if vote is VoteState.UNRECORDED]

    def granting(self) -> list[ReplicaKey]:
        return [key for key, vote in self._votes.items() if vote is VoteState.GRANTED]
