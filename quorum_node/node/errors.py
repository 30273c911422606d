"""The one set of error codes a node answers with, over every transport, and the error that
carries one (a stable machine code plus one human line, as gRPC's status)."""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Every code of an error answer. The HTTP status of each is ``quorum_node.node.api.http``'s;
    the voter-change codes are Kafka's error names (KIP-595, KIP-856)."""

    BAD_REQUEST = "BAD_REQUEST"  # malformed: a parameter, a body, a key
    TOO_LARGE = "TOO_LARGE"  # a body, a record, a value over its limit
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"  # the body did not arrive in time
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    NOT_FOUND = "NOT_FOUND"  # no such endpoint
    WRONG_LISTENER = "WRONG_LISTENER"  # a client's request on the peers' controller listener
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    UNAUTHENTICATED = "UNAUTHENTICATED"  # no or wrong credentials
    FORBIDDEN = "FORBIDDEN"  # credentials without the role the endpoint needs
    NOT_LEADER = "NOT_LEADER"  # another node leads: redirected to it
    NO_LEADER = "NO_LEADER"  # no leader known (an election): retry shortly
    TIMEOUT = "TIMEOUT"  # not done in time; a write may still commit
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # a write may or may not have taken effect
    APPEND_LOST = "APPEND_LOST"  # truncated by a new leader: it will never commit
    SHUTTING_DOWN = "SHUTTING_DOWN"
    NODE_FAILED = "NODE_FAILED"  # the node or its state machine stopped after a failure
    DISK_FULL = "DISK_FULL"  # the leader's disk has no room: not appended; retry once freed
    NOT_READY = "NOT_READY"  # the readiness probe's refusal
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"  # below the log start (compacted)
    COMPACTED = "COMPACTED"  # a watch from before the changes kept
    KEY_NOT_FOUND = "KEY_NOT_FOUND"
    TOO_MANY_LONG_POLLS = "TOO_MANY_LONG_POLLS"
    BACKUP_UNAVAILABLE = "BACKUP_UNAVAILABLE"
    # Refusals of a voter change, by Kafka's names.
    DUPLICATE_VOTER = "DUPLICATE_VOTER"
    VOTER_NOT_FOUND = "VOTER_NOT_FOUND"
    INVALID_REQUEST = "INVALID_REQUEST"
    REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"  # a static quorum (kraft.version 0) changes none
    INTERNAL = "INTERNAL"  # a failure of the node's own


class ServiceError(Exception):
    """A refused or failed operation: one of the codes and a one-line message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
