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
    # KIP-856: which replica voted, so that two voters sharing a node id (a disk being replaced)
    # are never counted as one another.
    voter_directory_id: uuid.UUID | None = None


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


class SnapshotIdField(Message):
    end_offset: int
    epoch: int


class FetchResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: int | None = None
    leader_epoch: int = 0
    high_watermark: int | None = None
    log_start_offset: int = 0
    records: bytes = b""
    diverging_epoch: EpochEndOffset | None = None
    # KIP-630: the fetch offset lies below the leader's log start: fetch this snapshot instead.
    snapshot_id: SnapshotIdField | None = None


class FetchSnapshotRequest(Message):
    """KIP-630: download a byte range of the leader's snapshot."""

    cluster_id: str | None
    replica_id: int
    replica_directory_id: uuid.UUID | None = None
    max_bytes: int = 8 * 1024 * 1024
    current_leader_epoch: int
    snapshot_id: SnapshotIdField
    position: int


class FetchSnapshotResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: int | None = None
    leader_epoch: int = 0
    snapshot_id: SnapshotIdField | None = None
    size: int = 0
    position: int = 0
    records: bytes = b""  # the raw byte range (UnalignedRecords): not batch aligned


RaftRequest = (VoteRequest | BeginQuorumEpochRequest | EndQuorumEpochRequest | FetchRequest
               | FetchSnapshotRequest)
RaftResponse = (VoteResponse | BeginQuorumEpochResponse | EndQuorumEpochResponse | FetchResponse
                | FetchSnapshotResponse)


class LeaderChangeMessage(Message):
    """Control record written by every new leader at the start of its epoch."""

    version: int = 1
    leader_id: int
    voters: tuple[ReplicaInfo, ...]
    granting_voters: tuple[ReplicaInfo, ...]


class Voter(Message):
    voter_id: NodeId
    voter_directory_id: uuid.UUID


class VotersRecord(Message):
    """Control record (Kafka's KRAFT_VOTERS): the whole voter set, effective from its offset as
    soon as it is in the log, committed or not, and gone again if the log is truncated below it."""

    version: int = 0
    voters: tuple[Voter, ...]
