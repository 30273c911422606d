"""The quorum's RPCs as pydantic models, named after KIP-595, KIP-996 and KIP-856.

There is one partition (the metadata log), so the per-topic/per-partition nesting of Kafka's schemas
is flattened and a response carries one error code. Field aliases are the seeds' PascalCase names
(``LastFetchEpoch``, ``HighWatermark``, ...), which is what the JSON on the wire uses; optional ids
are ``None`` where Kafka writes -1. Record batches travel as bytes in the log's own format.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_pascal

from quorum_node.raft.types import Errors, ReplicaKey

NodeId = Annotated[int, Field(ge=0)]


class Message(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_pascal, populate_by_name=True, frozen=True, extra="forbid"
    )


class ReplicaInfo(Message):
    replica_id: int
    replica_directory_id: uuid.UUID | None = None

    @classmethod
    def of(cls, key: ReplicaKey) -> ReplicaInfo:
        return cls(replica_id=key.id, replica_directory_id=key.directory_id)

    def key(self) -> ReplicaKey:
        return ReplicaKey(self.replica_id, self.replica_directory_id)


class EpochEndOffset(Message):
    epoch: int
    end_offset: int


class VoteRequest(Message):
    """Sent by a Prospective (PreVote=true, its current epoch) or a Candidate (bumped epoch)."""

    cluster_id: str | None
    voter_id: int  # the receiver
    voter_directory_id: uuid.UUID | None = None
    replica_epoch: int
    replica_id: int
    replica_directory_id: uuid.UUID | None = None
    last_offset_epoch: int
    last_offset: int
    pre_vote: bool = False


class VoteResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: int | None = None
    leader_epoch: int = 0
    vote_granted: bool = False


class BeginQuorumEpochRequest(Message):
    """A new leader announces itself; also its heartbeat to voters that stopped fetching."""

    cluster_id: str | None
    leader_id: int
    leader_epoch: int
    voter_id: int
    voter_directory_id: uuid.UUID | None = None


class BeginQuorumEpochResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: int | None = None
    leader_epoch: int = 0


class EndQuorumEpochRequest(Message):
    """A resigning leader asks voters to elect a successor, most caught-up first."""

    cluster_id: str | None
    leader_id: int
    leader_epoch: int
    voter_id: int
    voter_directory_id: uuid.UUID | None = None
    preferred_successors: tuple[ReplicaInfo, ...] = ()


class EndQuorumEpochResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: int | None = None
    leader_epoch: int = 0


class FetchRequest(Message):
    cluster_id: str | None
    replica_id: int
    replica_directory_id: uuid.UUID | None = None
    max_wait_ms: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetch_epoch: int
    high_watermark: int | None = None  # the follower's, so a newer one is answered at once
    max_bytes: int = 8 * 1024 * 1024


class FetchResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: int | None = None
    leader_epoch: int = 0
    high_watermark: int | None = None
    log_start_offset: int = 0
    records: bytes = b""
    diverging_epoch: EpochEndOffset | None = None


RaftRequest = VoteRequest | BeginQuorumEpochRequest | EndQuorumEpochRequest | FetchRequest
RaftResponse = VoteResponse | BeginQuorumEpochResponse | EndQuorumEpochResponse | FetchResponse


class LeaderChangeMessage(Message):
    """Control record written by every new leader at the start of its epoch."""

    version: int = 1
    leader_id: int
    voters: tuple[ReplicaInfo, ...]
    granting_voters: tuple[ReplicaInfo, ...]
