"""Identities, error codes and small value types shared by the Raft core, storage and transport."""

from __future__ import annotations

import base64
import enum
import uuid
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class ReplicaKey:
    """A replica: a node id plus the storage UUID (``directory.id``) of its log directory (KIP-856).

    ``directory_id`` is ``None`` where it is not known yet (a statically configured voter before the
    quorum has learned its uuid).
    """

    id: int
    directory_id: uuid.UUID | None = None

    def matches(self, other: ReplicaKey) -> bool:
        """Kafka's matching rule: ids must be equal; uuids must be too when both sides know them."""
        if self.id != other.id:
            return False
        if self.directory_id is None or other.directory_id is None:
            return True
        return self.directory_id == other.directory_id

    def __str__(self) -> str:
        # The directory id in Kafka's form (base64url, 22 characters), as the CLIs and the
        # APIs print it: one form everywhere.
        if self.directory_id is None:
            return f"{self.id}"
        kafka_form = base64.urlsafe_b64encode(self.directory_id.bytes).decode().rstrip("=")
        return f"{self.id}:{kafka_form}"


# Epochs are Kafka int32s. An epoch is accepted (from a peer, the quorum-state file or a record
# batch) only if its successor still fits: ``epoch < MAX_EPOCH``. A replica at MAX_EPOCH - 1 can
# no longer campaign, so the bound is reached only by a peer that jumps there (a forged or broken
# message): the rule keeps such a message from wedging the quorum at an epoch no vote can follow.
MAX_EPOCH = 2**31 - 1


# Offsets are Kafka int64s. A log grows only by appends, one batch at a time, except where a
# leader's snapshot moves its end: a snapshot ending past MAX_OFFSET is refused, which leaves
# every log room for more records than it could ever take (a snapshot ending at 2^63 - 1 once
# made the replica that installed it fail at its first append as leader, at every start).
MAX_OFFSET = 2**62


# A deadline that never comes (a timer that is not running).
NEVER = 2**62


def epoch_in_bounds(epoch: int) -> bool:
    """Whether an epoch may be adopted: its successor is still an int32 (see MAX_EPOCH)."""
    return epoch < MAX_EPOCH


class Errors(enum.IntEnum):
    """Kafka's error codes as the quorum protocol uses them (KIP-595, KIP-856, KRaft)."""

    NONE = 0
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    INCONSISTENT_VOTER_SET = 94
    SNAPSHOT_NOT_FOUND = 98
    POSITION_OUT_OF_RANGE = 99
    INCONSISTENT_CLUSTER_ID = 104
    INVALID_VOTER_KEY = 125
    DUPLICATE_VOTER = 126
    VOTER_NOT_FOUND = 127


class VoterChangeKind(enum.StrEnum):
    """KIP-856's two voter changes (AddVoter, RemoveVoter); the value is how messages name it."""

    ADD = "add"
    REMOVE = "remove"


class ControlRecordType(enum.IntEnum):
    """Types of control records, numbered as Kafka numbers them."""

    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    offset: int
    epoch: int


class RaftInvariantError(RuntimeError):
    """Raised by the core when a peer or the log presents a state that Raft's safety rules say is
    impossible (for example a leader asking a follower to truncate committed data). It signals a bug
    or a corrupted replica and must stop the node rather than be papered over."""


class NotLeaderError(Exception):
    """A write was offered to a replica that is not the leader of the current epoch."""

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        super().__init__(f"not the leader (leader={leader_id}, epoch={epoch})")
        self.leader_id = leader_id
        self.epoch = epoch


class LeaderNotReadyError(NotLeaderError):
    """The leader takes no client records until its bootstrap VotersRecord is written (it waits
    to learn every configured voter's directory id): retry shortly."""


class VoterChangeError(Exception):
    """An AddVoter or RemoveVoter that failed, with Kafka's error code and a message for people."""

    def __init__(self, error: Errors, message: str) -> None:
        super().__init__(f"{error.name}: {message}")
        self.error = error
        self.message = message
