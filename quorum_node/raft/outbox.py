"""What the core's rooms hand the driver: the ``Effects`` of a step, gathered in one ``Outbox``.

Every room (``replication.py``, ``follower_fetch.py``, ``snapshot_transfer.py``, ...) is given
the same ``Outbox`` and writes into it: the messages to send (requests numbered here and counted
by the ``RequestManager``, so that a response is matched to the request in flight), whether the
log must be flushed, and the outcomes of voter changes and reads. ``RaftCore.take_effects``
empties it after every call. ``WarningLimiter`` is the one rate limit on the warnings a peer can
provoke, shared by every room so that a kind of warning is limited wherever it is raised.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, TypeVar

from quorum_node.raft.leader import ReadOutcome, VoterChangeDone
from quorum_node.raft.messages import (
    BeginQuorumEpochResponse,
    EndQuorumEpochResponse,
    FetchResponse,
    FetchSnapshotResponse,
    RaftRequest,
    RaftResponse,
    VoteResponse,
)
from quorum_node.raft.quorum_state import QuorumState, RoleChanged
from quorum_node.raft.requests import RequestManager
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import Errors

logger = logging.getLogger(__name__)

# A warning that a peer can provoke on every request or fetch is logged at most this often
# (per kind of warning).
WARNING_INTERVAL_MS = 10_000

ResponseT = TypeVar("ResponseT", VoteResponse, BeginQuorumEpochResponse, EndQuorumEpochResponse,
                    FetchResponse, FetchSnapshotResponse)


@dataclass(frozen=True, slots=True)
class OutboundRequest:
    destination: int
    correlation_id: int
    message: RaftRequest


@dataclass(frozen=True, slots=True)
class OutboundResponse:
    destination: int
    correlation_id: int
    message: RaftResponse


@dataclass(slots=True)
class Effects:
    persist: ElectionState | None = None
    messages: list[OutboundRequest | OutboundResponse] = field(default_factory=list)
    flush: bool = False
    # The log was replaced by this snapshot (downloaded from the leader): the state machine must
    # load it and go on from its end offset.
    snapshot_loaded: SnapshotId | None = None
    # Outcomes for the callers of add_voter/remove_voter and begin_read.
    voter_changes: list[VoterChangeDone] = field(default_factory=list)
    reads: list[ReadOutcome] = field(default_factory=list)
    # Every change of role in the step(s), in order (durable once ``persist`` is).
    role_changes: list[RoleChanged] = field(default_factory=list)


class WarningLimiter:
    """Warnings a peer could provoke on every message: at most one per kind per
    WARNING_INTERVAL_MS (the core has no clock of its own; the driver's time serves)."""

    def __init__(self) -> None:
        self._warned_at: dict[str, int] = {}

    def warn(self, now_ms: int, kind: str, message: str, *args: object) -> None:
        last = self._warned_at.get(kind)
        if last is not None and now_ms - last < WARNING_INTERVAL_MS:
            return
        self._warned_at[kind] = now_ms
        logger.warning(message, *args)


class Outbox:
    """The effects of the current step, the numbering of the requests it sends, and what is done
    with a response that cannot be used."""

    def __init__(self, *, node_id: int, requests: RequestManager,
                 warnings: WarningLimiter) -> None:
        self.effects = Effects()
        self._node_id = node_id
        self._requests = requests
        self._warnings = warnings
        self._next_correlation_id = 0

    def take(self) -> Effects:
        effects, self.effects = self.effects, Effects()
        return effects

    def send(self, now_ms: int, destination: int, message: RaftRequest) -> None:
        self._next_correlation_id += 1
        correlation_id = self._next_correlation_id
        self._requests.on_sent(destination, correlation_id, now_ms)
        self.effects.messages.append(OutboundRequest(destination, correlation_id, message))

    def respond(self, destination: int, correlation_id: int, message: RaftResponse) -> None:
        self.effects.messages.append(OutboundResponse(destination, correlation_id, message))

    def drop_response(self, now_ms: int, source: int, why: str) -> None:
        """A response that cannot be used: logged (rate-limited, it may repeat every fetch)
        and backed off from, as from an error. A follower that gets nothing usable from its
        leader reaches its fetch timeout and elects another."""
        self._warnings.warn(now_ms, f"dropped-{source}",
                            "node %d: dropped a response from node %d: %s", self._node_id, source,
                            why)
        self._requests.back_off(source, now_ms)


def answer(quorum: QuorumState, kind: type[ResponseT], error: Errors,
           **fields: Any) -> ResponseT:
    """This replica's answer to a peer's request: ``error``, the epoch and the leader it knows
    now (every answer carries them: how a peer learns of a newer epoch and finds the leader),
    and the RPC's own ``fields``."""
    return kind(error_code=error, leader_id=quorum.leader_id, leader_epoch=quorum.epoch,
                **fields)
