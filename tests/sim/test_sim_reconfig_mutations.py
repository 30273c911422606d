"""The KIP-856 checks catch broken voter changes and disk-loss handling: each mutation below breaks
one rule of the core (in a subclass, never in the product) and the check under test, enabled
alone, finds it in the scenario that exercises the rule.

Like test_sim_protocol_mutations.py, these reach into the core's private methods on purpose."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

import pytest

from quorum_node.raft.core import OutboundResponse, RaftCore
from quorum_node.raft.leader import LeaderState
from quorum_node.raft.messages import RaftRequest, VoteRequest, VoteResponse
from quorum_node.raft.outbox import Effects
from quorum_node.raft.quorum_rpcs import QuorumRpcs
from quorum_node.raft.records import Record
from quorum_node.raft.replication import LeaderReplication
from quorum_node.raft.snapshot_transfer import SnapshotTransfer
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import Errors
from quorum_node.raft.voter_change import VoterChange, VoterChangeHandler
from quorum_node.raft.voters import parse_voters_record, voters_record
from quorum_node.sim.invariants import (
    NO_COMMITTED_LOSS,
    ONE_VOTER_CHANGE_AT_A_TIME,
    VOTER_CHANGE_MAJORITIES,
)
from quorum_node.sim.node import CoreFactory
from quorum_node.sim.runner import first_violation

_WAITING_FOR_PREVIOUS = "waiting for the previous voter change to commit"


class _AppendsAReplacement(LeaderReplication):
    def append_control(self, now_ms: int, state: LeaderState,
                       records: Sequence[Record]) -> int | None:
        change = self._voter_changes.pending
        if change is not None and change.kind == "add" and change.record_offset is None:
            voters = parse_voters_record(records[0].value)
            replaced = [k for k in voters if k.id != change.key.id or k == change.key]
            records = [voters_record(replaced)]
        return super().append_control(now_ms, state, records)


class ReplacesInOneStep(RaftCore):
    """Adds a node's new directory and drops its old one in the same VotersRecord: two changes at
    once, whose majorities need not overlap."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._replication.__class__ = _AppendsAReplacement


class _Impatient(VoterChangeHandler):
    def blocker(self, now_ms: int, leader: LeaderState, change: VoterChange, *,
                bootstrapped: bool, latest_voters_offset: int | None) -> str | None:
        reason = super().blocker(now_ms, leader, change, bootstrapped=bootstrapped,
                                 latest_voters_offset=latest_voters_offset)
        return None if reason == _WAITING_FOR_PREVIOUS else reason


class DoesNotWaitForVoterChanges(RaftCore):
    """Answers a voter change as soon as its record is appended, and appends the next one without
    waiting for the previous one to commit."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._voter_changes.__class__ = _Impatient  # the same handler, wherever it is held

    def _advance_voter_change(self, now_ms: int, state: LeaderState) -> None:
        super()._advance_voter_change(now_ms, state)
        change = self._voter_changes.pending
        if change is not None and change.record_offset is not None:
            self._outbox.effects.voter_changes.append(
                self._voter_changes.finish(Errors.NONE, f"{change.kind} {change.key}: appended"))


class _CountsWithoutTheAddedVoter(LeaderReplication):
    def advance_high_watermark(self, now_ms: int) -> bool:
        change, state = self._voter_changes.pending, self._quorum.state
        if change is None or change.kind != "add" or not isinstance(state, LeaderState) \
                or change.key not in state.voters:
            return super().advance_high_watermark(now_ms)
        progress = state.voters.pop(change.key)
        try:
            return super().advance_high_watermark(now_ms)
        finally:
            state.voters[change.key] = progress


class IgnoresTheVoterBeingAdded(RaftCore):
    """Computes the high watermark without the voter an AddVoter adds until the change is done:
    the change commits on a majority of the old set only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._replication.__class__ = _CountsWithoutTheAddedVoter


class _AddressedByIdAlone(QuorumRpcs):
    def _addressed_to_me(self, voter_id: int, voter_directory_id: uuid.UUID | None) -> bool:
        return voter_id == self._local_key.id


class AnswersForAnyDirectory(RaftCore):
    """Takes a Vote (or BeginQuorumEpoch) addressed to any directory of its node id as its own,
    and answers as that directory: a replaced disk votes as the voter it lost, with an empty
    log."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rpcs.__class__ = _AddressedByIdAlone

    def handle_request(
        self, now_ms: int, source: int, correlation_id: int, request: RaftRequest
    ) -> None:
        super().handle_request(now_ms, source, correlation_id, request)
        if not isinstance(request, VoteRequest):
            return
        messages = self._outbox.effects.messages
        for i, message in enumerate(messages):
            if (isinstance(message, OutboundResponse) and message.correlation_id == correlation_id
                    and isinstance(message.message, VoteResponse)):
                answer = message.message.model_copy(
                    update={"voter_directory_id": request.voter_directory_id})
                messages[i] = OutboundResponse(message.destination, correlation_id, answer)


class _DeletesWhatItLoaded(SnapshotTransfer):
    loaded: SnapshotId | None = None

    def load_snapshot(self, snapshot_id: SnapshotId) -> None:
        super().load_snapshot(snapshot_id)
        self.loaded = snapshot_id

    def delete_loaded(self) -> None:
        if self.loaded is not None:
            self._snapshots.delete_before(SnapshotId(self.loaded.end_offset + 1, 0))
            self.loaded = None


class DeletesTheSnapshotItLoaded(RaftCore):
    """Having loaded a snapshot from the leader, deletes every snapshot up to and including it (an
    off-by-one in the clean-up) once the state machine has read it, a step later: its log now
    starts past data it no longer has anywhere."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._transfer.__class__ = _DeletesWhatItLoaded

    def take_effects(self) -> Effects:
        effects = super().take_effects()
        if effects.snapshot_loaded is None:
            cast(_DeletesWhatItLoaded, self._transfer).delete_loaded()
        return effects


@pytest.mark.parametrize(
    ("factory", "check", "scenario", "seeds"),
    [
        (ReplacesInOneStep, ONE_VOTER_CHANGE_AT_A_TIME, "disk_replacement", range(5)),
        (DoesNotWaitForVoterChanges, ONE_VOTER_CHANGE_AT_A_TIME, "disk_replacement", range(30)),
        (IgnoresTheVoterBeingAdded, VOTER_CHANGE_MAJORITIES, "disk_replacement", range(30)),
        (AnswersForAnyDirectory, NO_COMMITTED_LOSS, "disk_replacement", range(40)),
        (DeletesTheSnapshotItLoaded, NO_COMMITTED_LOSS, "snapshot_catch_up", range(8)),
    ],
)
def test_reconfiguration_mutation_is_caught(
    factory: CoreFactory, check: str, scenario: str, seeds: range
) -> None:
    violation = first_violation(seeds, scenario, factory, {check})
    if violation is None:
        pytest.fail(f"{check} did not catch the mutation in seeds {seeds} of {scenario}")
    print(violation)
