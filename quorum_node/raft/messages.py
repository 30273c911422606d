"""The quorum's RPCs as pydantic models, named after KIP-595, KIP-996 and KIP-856.

There is one partition (the metadata log), so the per-topic/per-partition nesting of Kafka's schemas
is flattened and a response carries one error code. Field aliases are the seeds' PascalCase names
(``LastFetchEpoch``, ``HighWatermark``, ...), which is what the JSON on the wire uses; optional ids
are ``None`` where Kafka writes -1. Record batches travel as bytes in the log's own format.
"""

from __future__ import annotations

import functools
import typing
import uuid
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_pascal

from quorum_node.raft.types import MAX_EPOCH, Errors, ReplicaKey, epoch_in_bounds

NodeId = Annotated[int, Field(ge=0)]
# Kafka's wire types bound every number.
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Epoch = Int32


class Message(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_pascal, populate_by_name=True, frozen=True, extra="forbid"
    )


class ReplicaInfo(Message):
    replica_id: Int32
    replica_directory_id: uuid.UUID | None = None

    @classmethod
    def of(cls, key: ReplicaKey) -> ReplicaInfo:
        return cls(replica_id=key.id, replica_directory_id=key.directory_id)

    def key(self) -> ReplicaKey:
        return ReplicaKey(self.replica_id, self.replica_directory_id)


class EpochEndOffset(Message):
    epoch: Epoch
    end_offset: Int64


class VoteRequest(Message):
    """Sent by a Prospective (PreVote=true, its current epoch) or a Candidate (bumped epoch)."""

    cluster_id: str | None
    voter_id: Int32  # the receiver
    voter_directory_id: uuid.UUID | None = None
    replica_epoch: Epoch
    replica_id: Int32
    replica_directory_id: uuid.UUID | None = None
    last_offset_epoch: Epoch
    last_offset: Int64
    pre_vote: bool = False


class VoteResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: Int32 | None = None
    leader_epoch: Epoch = 0
    vote_granted: bool = False
    # KIP-856: which replica voted, so that two voters sharing a node id (a disk being replaced)
    # are never counted as one another.
    voter_directory_id: uuid.UUID | None = None


class BeginQuorumEpochRequest(Message):
    """A new leader announces itself; also its heartbeat to voters that stopped fetching."""

    cluster_id: str | None
    leader_id: Int32
    leader_epoch: Epoch
    voter_id: Int32
    voter_directory_id: uuid.UUID | None = None


class BeginQuorumEpochResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: Int32 | None = None
    leader_epoch: Epoch = 0


class EndQuorumEpochRequest(Message):
    """A resigning leader asks voters to elect a successor, most caught-up first."""

    cluster_id: str | None
    leader_id: Int32
    leader_epoch: Epoch
    voter_id: Int32
    voter_directory_id: uuid.UUID | None = None
    preferred_successors: tuple[ReplicaInfo, ...] = ()


class EndQuorumEpochResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: Int32 | None = None
    leader_epoch: Epoch = 0


class FetchRequest(Message):
    cluster_id: str | None
    replica_id: Int32
    replica_directory_id: uuid.UUID | None = None
    max_wait_ms: Int32
    current_leader_epoch: Epoch
    fetch_offset: Int64
    last_fetch_epoch: Epoch
    high_watermark: Int64 | None = None  # the follower's, so a newer one is answered at once
    max_bytes: Int32 = 8 * 1024 * 1024
    # Not Kafka's (it serves no linearizable reads): the newest read barrier (ReadIndex) this
    # leader's answers named, echoed back, so the fetch is known to be sent after that barrier
    # was taken (one sent before, held up in a paused process, must not confirm it).
    read_barrier: Int64 = 0


class SnapshotIdField(Message):
    end_offset: Int64
    epoch: Epoch


class FetchResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: Int32 | None = None
    leader_epoch: Epoch = 0
    high_watermark: Int64 | None = None
    log_start_offset: Int64 = 0
    records: bytes = b""
    diverging_epoch: EpochEndOffset | None = None
    # KIP-630: the fetch offset lies below the leader's log start: fetch this snapshot instead.
    snapshot_id: SnapshotIdField | None = None
    # The newest read barrier the leader had taken when it answered (FetchRequest.read_barrier).
    read_barrier: Int64 = 0


class FetchSnapshotRequest(Message):
    """KIP-630: download a byte range of the leader's snapshot."""

    cluster_id: str | None
    replica_id: Int32
    replica_directory_id: uuid.UUID | None = None
    max_bytes: Int32 = 8 * 1024 * 1024
    current_leader_epoch: Epoch
    snapshot_id: SnapshotIdField
    position: Int64


class FetchSnapshotResponse(Message):
    error_code: Errors = Errors.NONE
    leader_id: Int32 | None = None
    leader_epoch: Epoch = 0
    snapshot_id: SnapshotIdField | None = None
    size: Int64 = 0
    position: Int64 = 0
    records: bytes = b""  # the raw byte range (UnalignedRecords): not batch aligned


def check_received_epochs(message: Message) -> None:
    """Raise ValueError if a received message carries an epoch out of bounds (``MAX_EPOCH``:
    no successor would fit an int32). The core checks the epochs it acts on too; this refuses a
    frame before it reaches the core."""
    for name, nested in _epoch_fields(type(message)):
        value = getattr(message, name)
        if value is None:
            continue
        if nested:
            value = value.epoch
        if not epoch_in_bounds(value):
            shown = f"{name}.epoch" if nested else name
            raise ValueError(f"{shown} {value} is not below {MAX_EPOCH}: no successor would fit "
                             f"an int32")


@functools.cache
def _epoch_fields(cls: type[Message]) -> tuple[tuple[str, bool], ...]:
    """A message type's epoch fields, each with whether it is nested (``X.epoch``): found once
    per type, as every received message is checked."""
    fields = []
    for name, info in cls.model_fields.items():
        if any(isinstance(kind, type) and issubclass(kind, EpochEndOffset | SnapshotIdField)
               for kind in typing.get_args(info.annotation) or (info.annotation,)):
            fields.append((name, True))
        elif name.endswith("epoch"):
            fields.append((name, False))
    return tuple(fields)


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
