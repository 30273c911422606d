"""KIP-853/856 voter changes on the leader, as Kafka's ``AddVoterHandler`` and
``RemoveVoterHandler`` take them: the checks that refuse a request at once, the one change in
progress (KIP-856 allows one at a time), and its steps: wait for what it needs, have its
VotersRecord appended, and settle it once that record commits (or the deadline passes, or the
leadership goes).

The handler is given what it reads (the leader's state, the voter set in force and where the log
last changed it) and returns what to do (``VoterChangeStep``: a voter set to append, a change
that ended, a leader to resign); ``RaftCore`` appends, tells and resigns. Nothing here reads a
clock or does I/O.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from quorum_node.raft.leader import LeaderState, VoterChangeDone
from quorum_node.raft.types import Errors, ReplicaKey, VoterChangeError, VoterChangeKind
from quorum_node.raft.voters import VoterSet

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class VoterChange:
    """An AddVoter or RemoveVoter in progress on the leader (KIP-856, one at a time)."""

    ticket: int
    kind: VoterChangeKind
    key: ReplicaKey
    deadline_ms: int
    record_offset: int | None = None  # once its VotersRecord is appended


@dataclass(frozen=True, slots=True)
class VoterChangeStep:
    """What the core does for the change in progress at this poll."""

    append: tuple[ReplicaKey, ...] | None = None  # the voter set to append (a VotersRecord)
    done: VoterChangeDone | None = None  # the change ended: its ticket is settled
    resign: bool = False  # it removed this leader from the voters, and committed


NOTHING = VoterChangeStep()


class VoterChangeHandler:
    """The leader's voter changes. ``static_ids``: the configured voter ids
    (controller.quorum.voters), the only ids a voter may have (KIP-856); ``fetch_timeout_ms``:
    how recently an observer must have caught up with the leader to be added."""

    def __init__(self, *, local_key: ReplicaKey, static_ids: frozenset[int],
                 fetch_timeout_ms: int) -> None:
        self._local_key = local_key
        self._static_ids = static_ids
        self._fetch_timeout_ms = fetch_timeout_ms
        self.pending: VoterChange | None = None
        self._next_ticket = 0

    @property
    def adding(self) -> ReplicaKey | None:
        """The observer an AddVoter in progress waits for (never evicted from the observers)."""
        change = self.pending
        return change.key if change is not None and change.kind is VoterChangeKind.ADD else None

    # --- requests ----------------------------------------------------------------------------

    def add(self, now_ms: int, leader: LeaderState, voters: VoterSet, key: ReplicaKey,
            timeout_ms: int) -> int:
        """KIP-856 AddVoter of the observer ``key``: its ticket, or VoterChangeError for a
        request refused at once."""
        self._check(key)
        if any(voter == key for voter in voters):
            raise VoterChangeError(Errors.DUPLICATE_VOTER, f"{key} is already a voter")
        progress = leader.observers.get(key)
        if progress is None or progress.last_fetch_ms is None:
            raise VoterChangeError(Errors.INVALID_REQUEST,
                                   f"{key} is not an observer: it has not fetched from the leader")
        return self._start(now_ms, VoterChangeKind.ADD, key, timeout_ms)

    def remove(self, now_ms: int, voters: VoterSet, key: ReplicaKey, timeout_ms: int, *,
               decommission: bool) -> int:
        """KIP-856 RemoveVoter of ``key`` (see ``RaftCore.remove_voter``)."""
        self._check(key)
        if not any(voter == key for voter in voters):
            raise VoterChangeError(Errors.VOTER_NOT_FOUND, f"{key} is not a voter")
        if len(voters) == 1:
            raise VoterChangeError(Errors.INVALID_REQUEST, f"{key} is the only voter")
        if not decommission and not any(voter.id == key.id and voter != key
                                        for voter in voters):
            raise VoterChangeError(
                Errors.INVALID_REQUEST,
                f"removing {key} would remove node {key.id} from the voters; only a replaced "
                f"directory of a node can be removed (add the new one first), unless the node "
                f"is decommissioned")
        return self._start(now_ms, VoterChangeKind.REMOVE, key, timeout_ms)

    def _check(self, key: ReplicaKey) -> None:
        if key.directory_id is None:
            raise VoterChangeError(Errors.INVALID_REQUEST, "a voter needs its directory id")
        if key.id not in self._static_ids:
            raise VoterChangeError(
                Errors.INVALID_REQUEST,
                f"node {key.id} is not in controller.quorum.voters {sorted(self._static_ids)}")
        if self.pending is not None:
            pending = self.pending
            raise VoterChangeError(Errors.REQUEST_TIMED_OUT,
                                   f"another voter change is in progress ({pending.kind} "
                                   f"{pending.key}); retry when it is done")

    def _start(self, now_ms: int, kind: VoterChangeKind, key: ReplicaKey,
               timeout_ms: int) -> int:
        self._next_ticket += 1
        self.pending = VoterChange(self._next_ticket, kind, key, now_ms + timeout_ms)
        return self._next_ticket

    # --- steps -------------------------------------------------------------------------------

    def advance(self, now_ms: int, leader: LeaderState, voters: VoterSet, *,
                bootstrapped: bool, latest_voters_offset: int | None) -> VoterChangeStep:
        """Take the pending change through KIP-856's steps as far as it can go now. ``voters``
        is the set in force, which the log's latest VotersRecord (at ``latest_voters_offset``,
        None for the configured set) put there; ``bootstrapped``: that record is in the log."""
        change = self.pending
        if change is None:
            return NOTHING
        hwm = leader.high_watermark
        if change.record_offset is not None:
            if hwm is not None and hwm > change.record_offset:
                removed = change.kind is VoterChangeKind.REMOVE \
                    and change.key.matches(self._local_key)
                return VoterChangeStep(
                    done=self.finish(Errors.NONE, f"{change.kind} {change.key}: committed"),
                    resign=removed)
            if now_ms >= change.deadline_ms:
                return VoterChangeStep(done=self.finish(
                    Errors.REQUEST_TIMED_OUT,
                    f"{change.kind} {change.key} appended at offset {change.record_offset} but "
                    f"not committed in time; it may still commit"))
            return NOTHING
        waiting_for = self.blocker(now_ms, leader, change, bootstrapped=bootstrapped,
                                   latest_voters_offset=latest_voters_offset)
        if waiting_for is not None:
            if now_ms >= change.deadline_ms:
                return VoterChangeStep(done=self.finish(
                    Errors.REQUEST_TIMED_OUT,
                    f"{change.kind} {change.key}: timed out {waiting_for}"))
            return NOTHING
        if change.kind is VoterChangeKind.ADD:
            return VoterChangeStep(append=tuple(sorted((*voters, change.key))))
        return VoterChangeStep(append=tuple(voter for voter in voters if voter != change.key))

    def appended(self, offset: int | None) -> None:
        """The change's VotersRecord is in the log at ``offset``; None while the log's disk is
        full (nothing appended: it is asked for again at a later poll, within the deadline)."""
        assert self.pending is not None
        self.pending.record_offset = offset

    def blocker(self, now_ms: int, leader: LeaderState, change: VoterChange, *,
                bootstrapped: bool, latest_voters_offset: int | None) -> str | None:
        """What the change still waits for, in KIP-856's order; None when it can be appended."""
        if change.kind is VoterChangeKind.ADD \
                and not leader.is_caught_up(change.key, now_ms, self._fetch_timeout_ms):
            return f"waiting for {change.key} to catch up with the leader"
        if not bootstrapped:
            return "waiting for the leader to write the bootstrap voters"
        hwm = leader.high_watermark
        if hwm is None:
            return "waiting for the leader's LeaderChange record to commit"
        if latest_voters_offset is not None and latest_voters_offset >= hwm:
            return "waiting for the previous voter change to commit"
        return None

    def finish(self, error: Errors, message: str) -> VoterChangeDone:
        """End the pending change: committed (``error`` NONE) or failed."""
        change = self.pending
        assert change is not None
        self.pending = None
        if error != Errors.NONE:
            logger.warning("node %d: voter change failed: %s", self._local_key.id, message)
        else:
            logger.info("node %d: %s", self._local_key.id, message)
        return VoterChangeDone(change.ticket, error, message)

    def abandon(self, epoch: int) -> VoterChangeDone | None:
        """The leadership of ``epoch`` is lost: the change in progress, if any, fails."""
        if self.pending is None:
            return None
        return self.finish(Errors.NOT_LEADER_OR_FOLLOWER,
                           f"node {self._local_key.id} lost the leadership of epoch {epoch}; the "
                           f"change may or may not commit")
