"""Each role's own state, on its own (``raft/leader.py``, ``raft/follower.py``,
``raft/candidate.py``): the grant matrix, the leader's high watermark, check-quorum and read
barriers, the follower's fetch timer and its checks of a leader's answers. The core's tests drive
the same code through whole exchanges; these pin each rule where it is written."""

from __future__ import annotations

import uuid

import pytest

from quorum_node.raft.candidate import (
    CandidateState,
    ProspectiveState,
    ResignedState,
    UnattachedState,
)
from quorum_node.raft.election import EpochElection
from quorum_node.raft.follower import FollowerState, fetch_response_problem, voter_set_problem
from quorum_node.raft.leader import (
    LeaderState,
    ReadConfirmed,
    ReadTimedOut,
    ReplicaProgress,
)
from quorum_node.raft.messages import EpochEndOffset, FetchResponse
from quorum_node.raft.types import NEVER, ReplicaKey

DIRECTORY = {node_id: uuid.UUID(int=node_id) for node_id in range(1, 6)}
KEYS = {node_id: ReplicaKey(node_id, directory) for node_id, directory in DIRECTORY.items()}
LOCAL = KEYS[1]
CANDIDATE = KEYS[2]


def leader(voter_ids: tuple[int, ...] = (1, 2, 3)) -> LeaderState:
    return LeaderState(epoch=5, voted_key=None, epoch_start_offset=10,
                       check_quorum_deadline_ms=1_000,
                       voters={KEYS[i]: ReplicaProgress() for i in voter_ids})


def fetched(state: LeaderState, node_id: int, offset: int, now_ms: int = 100, *,
            read_barrier: int = 0) -> None:
    key = KEYS[node_id]
    progress = state.note_contact(now_ms, key, local_key=LOCAL, counts_itself=True,
                                  check_quorum_timeout_ms=3_000, protected=None)
    state.record_fetch(now_ms, progress, key, offset, leader_end=20, read_barrier=read_barrier)


# --- whom each role votes for (KIP-595, KIP-996 and KAFKA-17641 as Kafka ships them) ----------

def election() -> EpochElection:
    return EpochElection(LOCAL, frozenset(KEYS[i] for i in (1, 2, 3)))


@pytest.mark.parametrize(("state", "vote", "pre_vote"), [
    (UnattachedState(5, None, None, 0), True, True),
    (UnattachedState(5, None, KEYS[3], 0), False, True),  # voted for another in this epoch
    (UnattachedState(5, None, CANDIDATE, 0), True, True),  # the one it voted for, again
    (UnattachedState(5, 3, None, 0), False, True),  # a leader is known: no vote, a pre-vote
    (ProspectiveState(5, None, None, election(), 0), True, True),
    (CandidateState(5, election(), 0), False, True),  # its own vote is cast
    (ResignedState(5, None, 0, (), set()), False, True),  # it led this epoch
    (leader(), False, False),  # a leader of this epoch votes for nobody
    (FollowerState(5, 3, None, 0, 2_000), False, True),  # a pre-vote until it fetches
])
def test_the_grant_matrix(state: object, vote: bool, pre_vote: bool) -> None:
    can_grant = state.can_grant_vote  # type: ignore[attr-defined]
    assert can_grant(CANDIDATE, True, False) is vote
    assert can_grant(CANDIDATE, True, True) is pre_vote
    assert can_grant(CANDIDATE, False, True) is False  # never to a log behind ours


def test_a_follower_refuses_pre_votes_once_it_has_heard_from_its_leader() -> None:
    follower = FollowerState(5, 3, None, fetch_deadline_ms=2_000, fetch_timeout_ms=2_000)
    assert follower.can_grant_vote(CANDIDATE, True, True)
    follower.heard_from_leader(500)
    assert follower.fetch_deadline_ms == 2_500
    assert not follower.can_grant_vote(CANDIDATE, True, True)


def test_a_prospective_asks_the_voters_that_refused_again_once_due() -> None:
    prospective = ProspectiveState(5, None, None, election(), 0)
    assert prospective.ask_again_ms == NEVER
    prospective.election.record(KEYS[3], granted=False)
    prospective.ask_again_if_due(100, interval_ms=50)
    assert prospective.ask_again_ms == 150
    prospective.ask_again_if_due(149, interval_ms=50)
    assert prospective.election.has_rejections
    prospective.ask_again_if_due(150, interval_ms=50)
    assert not prospective.election.has_rejections
    assert prospective.ask_again_ms == NEVER


# --- the leader ----------------------------------------------------------------------------------

def test_the_high_watermark_counts_the_leaders_flushed_offset_as_a_followers() -> None:
    state = leader()
    assert state.majority_end(LOCAL, flushed_offset=20) == -1  # no follower has fetched
    fetched(state, 2, 15)
    assert state.majority_end(LOCAL, flushed_offset=20) == 15
    assert state.majority_end(LOCAL, flushed_offset=12) == 12  # the leader's own disk is behind
    fetched(state, 3, 18)
    assert state.majority_end(LOCAL, flushed_offset=20) == 18


def test_check_quorum_is_renewed_by_fetches_from_a_majority() -> None:
    state = leader((1, 2, 3, 4, 5))
    fetched(state, 2, 10, now_ms=100)
    assert state.check_quorum_deadline_ms == 1_000  # the leader and one follower: 2 of 5
    fetched(state, 2, 10, now_ms=200)
    assert state.check_quorum_deadline_ms == 1_000  # the same follower again counts once
    fetched(state, 3, 10, now_ms=300)
    assert state.check_quorum_deadline_ms == 3_300


def test_an_unknown_replica_is_an_observer_and_a_replaced_disk_is_not_its_voter() -> None:
    state = leader()
    replaced = ReplicaKey(2, uuid.UUID(int=99))
    state.note_contact(100, replaced, local_key=LOCAL, counts_itself=True,
                       check_quorum_timeout_ms=3_000, protected=None)
    assert replaced in state.observers
    assert state.voters[KEYS[2]].acknowledged is False


def test_a_replica_is_caught_up_at_the_leaders_end_then_or_as_of_its_previous_fetch() -> None:
    state = leader()
    progress = state.note_contact(100, KEYS[4], local_key=LOCAL, counts_itself=True,
                                  check_quorum_timeout_ms=3_000, protected=None)
    state.record_fetch(100, progress, KEYS[4], offset=5, leader_end=20)
    assert progress.last_caught_up_ms is None
    state.record_fetch(200, progress, KEYS[4], offset=20, leader_end=30)
    assert progress.last_caught_up_ms == 100  # at the end the leader had at its last fetch
    assert state.is_caught_up(KEYS[4], 150, within_ms=50)
    assert not state.is_caught_up(KEYS[4], 151, within_ms=50)


def test_a_read_barrier_is_confirmed_by_a_majority_echoing_it() -> None:
    state = leader()
    barrier = state.begin_read(7, read_index=12, deadline_ms=500)
    assert state.settle_reads(100, LOCAL) == []
    fetched(state, 2, 12, now_ms=110)  # arrived after the barrier, but may be sent before it
    assert state.settle_reads(110, LOCAL) == []
    fetched(state, 2, 12, now_ms=120, read_barrier=barrier.id)
    assert state.settle_reads(120, LOCAL) == [ReadConfirmed(barrier.id, 12)]
    state.begin_read(8, read_index=12, deadline_ms=500)
    assert state.settle_reads(500, LOCAL) == [ReadTimedOut(8)]


def test_successors_are_the_most_caught_up_first() -> None:
    state = leader()
    fetched(state, 2, 11)
    fetched(state, 3, 19)
    assert state.successors(1) == [KEYS[3], KEYS[2]]


# --- the follower's checks of a leader's answers --------------------------------------------

def answer(**fields: object) -> FetchResponse:
    base: dict[str, object] = {"error_code": 0, "leader_id": 3, "leader_epoch": 5,
                               "high_watermark": 20}
    base.update(fields)
    return FetchResponse.model_validate(base)


@pytest.mark.parametrize(("fields", "problem"), [
    ({}, None),
    ({"high_watermark": 9}, "below our committed offset 10"),
    ({"high_watermark": None}, None),
    ({"snapshot_id": {"end_offset": 8, "epoch": 4}}, "ends below the committed offset 10"),
    ({"snapshot_id": {"end_offset": 30, "epoch": 6}}, "invalid snapshot id"),
    ({"diverging_epoch": EpochEndOffset(epoch=6, end_offset=3)}, "invalid diverging epoch"),
])
def test_a_leaders_answer_that_contradicts_what_is_committed_is_refused(
        fields: dict[str, object], problem: str | None) -> None:
    found = fetch_response_problem(answer(**fields), committed=10)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_a_voter_set_must_stay_within_the_configured_ids() -> None:
    assert voter_set_problem([KEYS[1], KEYS[2]], {1, 2, 3}) is None
    assert "[4]" in (voter_set_problem([KEYS[1], KEYS[4]], {1, 2, 3}) or "")
    assert "none" in (voter_set_problem([], {1, 2, 3}) or "")
