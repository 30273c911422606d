"""Elections, votes and pre-votes: catalogue items 1-22 of kraft-anchor.md section 7.2.

Timing (QuorumConfig defaults, but Kafka's fetch timeout, as ``context`` sets it): election
timeout T = 1000 ms (timers are exactly T, see ``ZeroRandom``), fetch timeout 2000 ms, request
timeout 2000 ms, retry back-off 20 ms.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from quorum_node.raft.messages import (
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    FetchRequest,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import ControlRecordType, Errors, ReplicaKey

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

T = 1000  # election timeout
FETCH_TIMEOUT = 2000


def _vote(ctx: RaftTestContext, source: int, request: VoteRequest) -> VoteResponse:
    response = ctx.deliver_one(source, request)
    assert isinstance(response, VoteResponse)
    return response


def _vote_destinations(ctx: RaftTestContext, *, pre_vote: bool, epoch: int) -> set[int]:
    found = ctx.take_requests(VoteRequest)
    for request in found:
        assert isinstance(request.message, VoteRequest)
        assert request.message.pre_vote is pre_vote
        assert request.message.replica_epoch == epoch
        assert request.message.replica_id == ctx.local_id
    return {r.destination for r in found}


# --- start-up --------------------------------------------------------------------------------


def test_initialize_single_member_quorum(make_ctx: MakeCtx) -> None:
    """Item 1: a lone voter becomes leader of epoch 1 at once, without any RPC."""
    ctx = make_ctx(1, [1])
    assert ctx.state() is RaftState.LEADER
    assert ctx.core.epoch == 1
    assert ctx.core.leader_id == 1
    ctx.assert_persisted(1, leader_id=1, voted=1)
    assert ctx.history[0].messages == []
    assert ctx.history[0].flush is True
    # The LeaderChange control record of epoch 1 opens the log.
    assert ctx.log_layout() == [(0, 0, 1)]
    (batch,) = ctx.log.batches
    assert batch.is_control
    ((record_type, payload),) = list(batch.control_records())
    assert record_type is ControlRecordType.LEADER_CHANGE
    assert json.loads(payload)["LeaderId"] == 1
    # Committed only once flushed: the leader counts its own flushed offset only.
    assert ctx.core.high_watermark is None
    ctx.flush()
    assert ctx.core.high_watermark == 1


def test_initialize_single_member_quorum_with_stored_epoch(make_ctx: MakeCtx) -> None:
    """Item 1 (variant): a lone voter restarted after epoch 4 leads epoch 5 at once."""
    ctx = make_ctx(1, [1], log_epochs=[(4, 3)], election_state=ElectionState(4, None, None))
    assert ctx.state() is RaftState.LEADER
    assert ctx.core.epoch == 5
    ctx.assert_persisted(5, leader_id=1, voted=1)
    assert ctx.log_layout() == [(0, 2, 4), (3, 3, 5)]
    assert ctx.core.epoch_start_offset == 3


def test_initialize_as_resigned_leader_from_state_store(make_ctx: MakeCtx) -> None:
    """Item 2: restarting with leader == self gives Resigned in the same epoch; no vote in it;
    Unattached(epoch + 1) once the election timer fires."""
    stored = ElectionState(5, 1, ReplicaKey(1))
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(4, 2)], election_state=stored)
    assert ctx.state() is RaftState.RESIGNED
    assert ctx.core.epoch == 5
    assert ctx.core.leader_id == 1
    assert ctx.history[0].persist is None  # Resigned is memory-only
    ctx.assert_persisted(5, leader_id=1, voted=1)
    # It tells the voters the epoch is over (nobody to prefer after a restart).
    end_quorum = ctx.take_requests(EndQuorumEpochRequest)
    assert {r.destination for r in end_quorum} == {2, 3}
    for request in end_quorum:
        assert isinstance(request.message, EndQuorumEpochRequest)
        assert request.message.leader_epoch == 5
        assert request.message.preferred_successors == ()

    # An up-to-date candidate of epoch 5 gets no standard vote; a pre-vote is fine (not binding).
    response = _vote(ctx, 2, ctx.vote_request(2, 5, 4, 2))
    assert response.error_code is Errors.NONE
    assert response.vote_granted is False
    response = _vote(ctx, 2, ctx.vote_request(2, 5, 4, 2, pre_vote=True))
    assert response.vote_granted is True
    assert ctx.state() is RaftState.RESIGNED
    ctx.assert_persisted(5, leader_id=1, voted=1)

    ctx.advance(T - 1)
    assert ctx.state() is RaftState.RESIGNED
    ctx.advance(1)
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.epoch == 6
    ctx.assert_persisted(6)


def test_reject_votes_from_same_epoch_after_resigning_leadership(make_ctx: MakeCtx) -> None:
    """Item 3: a replica that led epoch 2 never votes again in epoch 2."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 1, ReplicaKey(1)))
    assert ctx.state() is RaftState.RESIGNED
    for candidate in (2, 3):
        response = _vote(ctx, candidate, ctx.vote_request(candidate, 2, 0, 0))
        assert response.error_code is Errors.NONE
        assert response.vote_granted is False
        assert response.leader_id == 1
        assert response.leader_epoch == 2
    assert ctx.state() is RaftState.RESIGNED
    assert all(e.persist is None for e in ctx.history)


def test_reject_votes_from_same_epoch_after_resigning_candidacy(make_ctx: MakeCtx) -> None:
    """Item 3: a replica that voted for itself in epoch 2 gives no other vote in epoch 2."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, ReplicaKey(1)))
    assert ctx.state() is RaftState.CANDIDATE
    response = _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0))
    assert response.error_code is Errors.NONE
    assert response.vote_granted is False
    assert ctx.state() is RaftState.CANDIDATE
    ctx.assert_persisted(2, voted=1)


def test_grant_votes_from_higher_epoch_after_resigning_leadership(make_ctx: MakeCtx) -> None:
    """Item 4: after resigning epoch 2, a vote for epoch 3 is granted (and made durable)."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(2, 1)],
                   election_state=ElectionState(2, 1, ReplicaKey(1)))
    assert ctx.state() is RaftState.RESIGNED
    ctx.clear_outbox()
    response = _vote(ctx, 2, ctx.vote_request(2, 3, 2, 1))
    assert response.error_code is Errors.NONE
    assert response.vote_granted is True
    assert response.leader_epoch == 3
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.epoch == 3
    ctx.assert_persisted(3, voted=2)
    # The vote is in the same effects as the response (persisted before it is sent).
    assert ctx.last_effects.persist == ElectionState(3, None, ReplicaKey(2))


def test_grant_votes_from_higher_epoch_after_resigning_candidacy(make_ctx: MakeCtx) -> None:
    """Item 4 (candidacy): a candidate of epoch 2 grants a vote for epoch 3."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, ReplicaKey(1)))
    response = _vote(ctx, 3, ctx.vote_request(3, 3, 0, 0))
    assert response.vote_granted is True
    assert ctx.state() is RaftState.UNATTACHED
    ctx.assert_persisted(3, voted=3)


def test_initialize_as_candidate_from_state_store(make_ctx: MakeCtx) -> None:
    """Item 5: restarting with a vote for itself gives Candidate in the same epoch, which asks
    for standard votes at once and can win with them."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 2)],
                   election_state=ElectionState(2, None, ReplicaKey(1)))
    assert ctx.state() is RaftState.CANDIDATE
    assert ctx.core.epoch == 2
    assert ctx.core.leader_id is None
    assert ctx.history[0].persist is None  # nothing changed
    requests = ctx.take_requests(VoteRequest)
    assert {r.destination for r in requests} == {2, 3}
    for request in requests:
        assert isinstance(request.message, VoteRequest)
        assert request.message.pre_vote is False
        assert request.message.replica_epoch == 2
        assert request.message.last_offset_epoch == 1
        assert request.message.last_offset == 2
    ctx.deliver_response(requests[0], ctx.vote_response(True, 2))
    assert ctx.state() is RaftState.LEADER
    assert ctx.core.epoch == 2
    ctx.assert_persisted(2, leader_id=1, voted=1)


# --- vote requests at a voter ------------------------------------------------------------------


def test_handle_vote_request_as_follower_with_elected_leader(make_ctx: MakeCtx) -> None:
    """Item 6: a follower rejects a standard vote in its epoch; grants one for a higher epoch."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 3, None))
    assert ctx.state() is RaftState.FOLLOWER
    response = _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0))
    assert response.error_code is Errors.NONE
    assert response.vote_granted is False
    assert response.leader_id == 3
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.leader_id == 3
    ctx.assert_persisted(2, leader_id=3)

    response = _vote(ctx, 2, ctx.vote_request(2, 3, 0, 0))
    assert response.vote_granted is True
    assert ctx.state() is RaftState.UNATTACHED
    ctx.assert_persisted(3, voted=2)


@pytest.mark.parametrize("pre_vote", [False, True])
def test_handle_invalid_vote_request_with_older_epoch(make_ctx: MakeCtx, pre_vote: bool) -> None:
    """Item 7: a (pre-)vote of an older epoch gets FENCED_LEADER_EPOCH; nothing changes."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(5, None, None))
    response = _vote(ctx, 2, ctx.vote_request(2, 4, 0, 0, pre_vote=pre_vote))
    assert response.error_code is Errors.FENCED_LEADER_EPOCH
    assert response.leader_epoch == 5
    assert response.vote_granted is False
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.epoch == 5
    assert all(e.persist is None for e in ctx.history)


@pytest.mark.parametrize(
    "case",
    [
        # (candidate, candidate epoch, last epoch, last offset, pre-vote)
        (3, 5, 0, -5, False),  # negative offset
        (3, 5, -1, 0, False),  # negative epoch
        (3, 5, 0, -5, True),
        (3, 6, 6, 0, False),  # standard vote: last epoch must be < candidate epoch
        (3, 6, 7, 0, True),  # pre-vote: last epoch must be <= candidate epoch
        (-1, 6, 0, 0, False),  # negative replica id
    ],
)
def test_invalid_vote_request(make_ctx: MakeCtx, case: tuple[int, int, int, int, bool]) -> None:
    """Item 8: malformed votes get INVALID_REQUEST and do not even bump the epoch."""
    candidate, epoch, last_epoch, last_offset, pre_vote = case
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(5, 2, None))
    response = _vote(ctx, 3, ctx.vote_request(candidate, epoch, last_epoch, last_offset,
                                              pre_vote=pre_vote))
    assert response.error_code is Errors.INVALID_REQUEST
    assert response.vote_granted is False
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.epoch == 5
    assert ctx.core.leader_id == 2


def test_pre_vote_with_last_epoch_equal_to_its_epoch_is_valid(make_ctx: MakeCtx) -> None:
    """Item 8 (boundary): a pre-vote may carry last epoch == its epoch (it does not bump)."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(5, 1)], election_state=ElectionState(5, None, None))
    response = _vote(ctx, 2, ctx.vote_request(2, 5, 5, 1, pre_vote=True))
    assert response.error_code is Errors.NONE
    assert response.vote_granted is True


def test_leader_refuses_vote_from_observer(make_ctx: MakeCtx) -> None:
    """Item 9, stricter than Kafka (which answers NONE, not granted): a non-voter's vote is
    refused as INCONSISTENT_VOTER_SET (see test_raft_membership.py), and an older one fenced."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(4, None, None))
    epoch = ctx.become_leader()
    assert epoch == 5
    response = _vote(ctx, 10, ctx.vote_request(10, epoch, 0, 0))
    assert response.error_code is Errors.INCONSISTENT_VOTER_SET
    assert response.vote_granted is False
    assert response.leader_id == 1
    response = _vote(ctx, 10, ctx.vote_request(10, epoch - 1, 0, 0))
    assert response.error_code is Errors.FENCED_LEADER_EPOCH
    assert ctx.state() is RaftState.LEADER


# --- timeouts and campaigns --------------------------------------------------------------------


def test_voter_become_prospective_after_fetch_timeout(make_ctx: MakeCtx) -> None:
    """Item 10: a voter whose leader stops answering goes Prospective in the same epoch and
    asks for pre-votes; nothing is persisted."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(2, 3)], election_state=ElectionState(2, 2, None))
    assert ctx.state() is RaftState.FOLLOWER
    assert [r.destination for r in ctx.take_requests(FetchRequest)] == [2]
    ctx.advance(FETCH_TIMEOUT - 1)
    assert ctx.state() is RaftState.FOLLOWER
    effects = ctx.advance(1)
    assert ctx.state() is RaftState.PROSPECTIVE
    assert ctx.core.epoch == 2
    assert effects.persist is None
    ctx.assert_persisted(2, leader_id=2)
    requests = ctx.take_requests(VoteRequest)
    assert {r.destination for r in requests} == {2, 3}
    for request in requests:
        assert isinstance(request.message, VoteRequest)
        assert request.message.pre_vote is True
        assert request.message.replica_epoch == 2
        assert request.message.last_offset_epoch == 2
        assert request.message.last_offset == 3


def test_follower_as_observer_does_not_become_prospective_after_fetch_timeout(
    make_ctx: MakeCtx,
) -> None:
    """Item 11: an observer never campaigns: on fetch timeout it goes Unattached."""
    ctx = make_ctx(4, [1, 2, 3], election_state=ElectionState(2, 2, None))
    assert ctx.state() is RaftState.FOLLOWER
    assert not ctx.core.is_voter
    ctx.advance(FETCH_TIMEOUT)
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.epoch == 2
    for _ in range(5):
        ctx.advance(2 * T)
        assert ctx.state() is RaftState.UNATTACHED
    assert ctx.pending_requests(VoteRequest) == []
    assert ctx.core.epoch == 2


def test_candidate_waits_rest_of_election_timeout_after_election_loss(make_ctx: MakeCtx) -> None:
    """Item 12 (KAFKA-18345): a rejected candidate stays Candidate until its timer fires, then
    starts over with a pre-vote in the same epoch (no epoch bump, no back-off)."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    assert ctx.state() is RaftState.CANDIDATE
    assert ctx.core.epoch == 1
    started = ctx.now_ms
    for voter in (2, 3):
        request = ctx.take_request(VoteRequest, voter)
        ctx.deliver_response(request, ctx.vote_response(False, 1))
    assert ctx.state() is RaftState.CANDIDATE
    ctx.advance_to(started + T - 1)
    assert ctx.state() is RaftState.CANDIDATE
    assert ctx.pending_requests(VoteRequest) == []  # rejected voters are not asked again
    effects = ctx.advance(1)
    assert ctx.state() is RaftState.PROSPECTIVE
    assert ctx.core.epoch == 1
    assert effects.persist is None
    ctx.assert_persisted(1, voted=1)
    assert _vote_destinations(ctx, pre_vote=True, epoch=1) == {2, 3}


def test_retry_election(make_ctx: MakeCtx) -> None:
    """Item 13: repeated election timeouts give repeated elections with increasing epochs (each
    round: pre-vote in epoch e, standard vote in e + 1, persisted vote for itself)."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    for epoch in (1, 2, 3):
        assert ctx.state() is RaftState.PROSPECTIVE
        assert ctx.core.epoch == epoch - 1
        pre_votes = {r.destination: r for r in ctx.take_requests(VoteRequest)}
        assert set(pre_votes) == {2, 3}
        for request in pre_votes.values():
            assert isinstance(request.message, VoteRequest)
            assert request.message.pre_vote is True
            assert request.message.replica_epoch == epoch - 1
        ctx.deliver_response(pre_votes[2], ctx.vote_response(True, epoch - 1))
        assert ctx.state() is RaftState.CANDIDATE
        assert ctx.core.epoch == epoch
        ctx.assert_persisted(epoch, voted=1)
        assert _vote_destinations(ctx, pre_vote=False, epoch=epoch) == {2, 3}
        ctx.expire_election_timer()  # nobody answers the standard votes


# --- pre-votes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("has_fetched_from_leader", [True, False])
def test_handle_pre_vote_request_as_follower_with_elected_leader(
    make_ctx: MakeCtx, has_fetched_from_leader: bool
) -> None:
    """Item 14 (KAFKA-17641): a follower grants a same-epoch pre-vote only until its first
    successful fetch; a higher-epoch pre-vote makes it Unattached (unvoted, durably)."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 3, None))
    fetch = ctx.take_request(FetchRequest, 3)
    if has_fetched_from_leader:
        ctx.deliver_response(fetch, ctx.fetch_response(3, 2, high_watermark=0))
    response = _vote(ctx, 2, ctx.vote_request(2, 2, 0, 1, pre_vote=True))
    assert response.error_code is Errors.NONE
    assert response.vote_granted is (not has_fetched_from_leader)
    assert response.leader_id == 3
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.leader_id == 3
    ctx.assert_persisted(2, leader_id=3)

    response = _vote(ctx, 2, ctx.vote_request(2, 3, 0, 1, pre_vote=True))
    assert response.vote_granted is True
    assert response.leader_id is None
    assert response.leader_epoch == 3
    assert ctx.state() is RaftState.UNATTACHED
    ctx.assert_persisted(3)  # the epoch is durable, the pre-vote is not


def test_handle_pre_vote_request_as_candidate(make_ctx: MakeCtx) -> None:
    """Item 15: a candidate grants same-epoch pre-votes to up-to-date logs, repeatedly, without
    changing state."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, ReplicaKey(1)))
    assert ctx.state() is RaftState.CANDIDATE
    for candidate in (2, 2, 3):
        response = _vote(ctx, candidate, ctx.vote_request(candidate, 2, 0, 1, pre_vote=True))
        assert response.vote_granted is True
        assert ctx.state() is RaftState.CANDIDATE
    response = _vote(ctx, 2, ctx.vote_request(2, 2, 0, 1))  # but no standard vote
    assert response.vote_granted is False
    ctx.assert_persisted(2, voted=1)
    assert all(e.persist is None for e in ctx.history)


def test_handle_pre_vote_request_as_unattached_voted(make_ctx: MakeCtx) -> None:
    """Item 15: an Unattached replica that voted for 2 still grants pre-votes to anyone
    up-to-date; its vote does not change."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, ReplicaKey(2)))
    assert ctx.state() is RaftState.UNATTACHED
    for candidate in (3, 3, 2):
        response = _vote(ctx, candidate, ctx.vote_request(candidate, 2, 0, 0, pre_vote=True))
        assert response.vote_granted is True
        assert ctx.state() is RaftState.UNATTACHED
    ctx.assert_persisted(2, voted=2)
    # Standard votes stay with the first choice.
    assert _vote(ctx, 3, ctx.vote_request(3, 2, 0, 0)).vote_granted is False
    assert _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0)).vote_granted is True
    assert all(e.persist is None for e in ctx.history)


def test_handle_pre_vote_request_as_unattached_with_leader(make_ctx: MakeCtx) -> None:
    """Item 15: an Unattached replica that knows the epoch's leader grants pre-votes (and
    rejects standard votes). In a static quorum only an observer whose fetch timed out is
    Unattached with a known leader."""
    ctx = make_ctx(4, [1, 2, 3], election_state=ElectionState(2, 2, None))
    ctx.advance(FETCH_TIMEOUT)
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.leader_id == 2
    for candidate in (1, 1, 3):
        response = _vote(ctx, candidate, ctx.vote_request(candidate, 2, 0, 0, pre_vote=True,
                                                          voter_id=4))
        assert response.vote_granted is True
        assert ctx.state() is RaftState.UNATTACHED
    assert _vote(ctx, 3, ctx.vote_request(3, 2, 0, 0, voter_id=4)).vote_granted is False
    assert ctx.core.election_state == ElectionState(2, 2, None)


def test_handle_pre_vote_request_as_prospective_with_leader(make_ctx: MakeCtx) -> None:
    """Item 15 (voter variant): a Prospective that still knows its leader grants pre-votes but
    no standard vote in the leader's epoch."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 2, None))
    ctx.advance(FETCH_TIMEOUT)
    assert ctx.state() is RaftState.PROSPECTIVE
    assert _vote(ctx, 3, ctx.vote_request(3, 2, 0, 0, pre_vote=True)).vote_granted is True
    assert _vote(ctx, 3, ctx.vote_request(3, 2, 0, 0)).vote_granted is False
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.assert_persisted(2, leader_id=2)


def test_leader_reject_pre_vote_request_on_same_epoch(make_ctx: MakeCtx) -> None:
    """Item 16: the leader rejects every pre-vote of its epoch, even from an up-to-date log."""
    ctx = make_ctx(1, [1, 2, 3])
    epoch = ctx.become_leader()
    response = _vote(ctx, 2, ctx.vote_request(2, epoch, epoch, 100, pre_vote=True))
    assert response.error_code is Errors.NONE
    assert response.vote_granted is False
    assert response.leader_id == 1
    assert response.leader_epoch == epoch
    assert ctx.state() is RaftState.LEADER


@pytest.mark.parametrize(
    ("last_epoch", "last_offset", "granted"),
    [
        (1, 100, False),  # older last epoch loses whatever its length
        (2, 4, False),  # same epoch, shorter
        (2, 5, True),  # identical
        (2, 6, True),  # same epoch, longer
    ],
)
def test_reject_pre_vote_if_remote_log_is_not_up_to_date(
    make_ctx: MakeCtx, last_epoch: int, last_offset: int, granted: bool
) -> None:
    """Item 17: the log comparison is (last epoch, end offset), epoch first."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 2), (2, 3)],
                   election_state=ElectionState(2, None, None))
    assert (ctx.log.last_fetched_epoch(), ctx.log.end_offset) == (2, 5)
    response = _vote(ctx, 2, ctx.vote_request(2, 2, last_epoch, last_offset, pre_vote=True))
    assert response.error_code is Errors.NONE
    assert response.vote_granted is granted
    assert ctx.state() is RaftState.UNATTACHED


def test_pre_vote_not_supported_by_remote(make_ctx: MakeCtx) -> None:
    """Item 18: one UNSUPPORTED_VERSION answer to a pre-vote makes the Prospective a Candidate at
    once (epoch + 1, durable vote for itself), falling back to standard votes."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    request = ctx.take_request(VoteRequest, 2)
    ctx.take_request(VoteRequest, 3)
    effects = ctx.deliver_response(request, ctx.vote_response(
        False, 0, error=Errors.UNSUPPORTED_VERSION))
    assert ctx.state() is RaftState.CANDIDATE
    assert ctx.core.epoch == 3
    assert effects.persist == ElectionState(3, None, ReplicaKey(1))
    ctx.assert_persisted(3, voted=1)
    # Standard votes to every voter (the transition resets the connections and back-offs).
    assert _vote_destinations(ctx, pre_vote=False, epoch=3) == {2, 3}


def test_prospective_transitions_to_unattached_on_election_failure(make_ctx: MakeCtx) -> None:
    """Item 19: a Prospective without a known leader that loses the pre-vote goes back to
    Unattached in the same epoch (nothing persisted)."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    request = ctx.take_request(VoteRequest, 2)
    ctx.deliver_response(request, ctx.vote_response(False, 2))
    assert ctx.state() is RaftState.PROSPECTIVE  # 1 granted + 1 unrecorded can still win
    request = ctx.take_request(VoteRequest, 3)
    effects = ctx.deliver_response(request, ctx.vote_response(False, 2))
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.epoch == 2
    assert effects.persist is None
    ctx.assert_persisted(2)


def test_prospective_transitions_to_unattached_on_election_timeout(make_ctx: MakeCtx) -> None:
    """Item 19 (timeout): no answers within the election timeout is a loss too."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.advance(T - 1)
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.advance(1)
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.epoch == 2


def test_prospective_with_leader_transitions_to_follower(make_ctx: MakeCtx) -> None:
    """Item 19: a Prospective that still knows its leader goes back to following it."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 3, None))
    ctx.advance(FETCH_TIMEOUT)
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.take_requests(FetchRequest)  # the fetch that timed out
    for voter in (2, 3):
        request = ctx.take_request(VoteRequest, voter)
        ctx.deliver_response(request, ctx.vote_response(False, 2, leader=3))
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.leader_id == 3
    assert ctx.core.epoch == 2
    ctx.assert_persisted(2, leader_id=3)
    assert [r.destination for r in ctx.take_requests(FetchRequest)] == [3]


def test_prospective_with_leader_transitions_to_follower_on_timeout(make_ctx: MakeCtx) -> None:
    """Item 19 (timeout): the same outcome when the pre-vote round just expires."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 3, None))
    ctx.advance(FETCH_TIMEOUT)
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.advance(T)
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.leader_id == 3


def test_prospective_receives_begin_quorum_request(make_ctx: MakeCtx) -> None:
    """Item 20: BeginQuorumEpoch ends the pre-vote: the Prospective follows the new leader."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    response = ctx.deliver_one(3, ctx.begin_quorum_request(3, 2))
    assert isinstance(response, BeginQuorumEpochResponse)
    assert response.error_code is Errors.NONE
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.leader_id == 3
    assert ctx.core.epoch == 2
    ctx.assert_persisted(2, leader_id=3)


def test_pre_vote_response_ignored_after_becoming_follower(make_ctx: MakeCtx) -> None:
    """Item 21: pre-vote answers that arrive after the Prospective became a Follower are stale
    and must not make it a Candidate."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.expire_election_timer()
    pre_vote_2 = ctx.take_request(VoteRequest, 2)
    pre_vote_3 = ctx.take_request(VoteRequest, 3)
    ctx.deliver_one(3, ctx.begin_quorum_request(3, 2))
    assert ctx.state() is RaftState.FOLLOWER
    ctx.deliver_response(pre_vote_2, ctx.vote_response(True, 2))
    ctx.deliver_response(pre_vote_3, ctx.vote_response(True, 2))
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.epoch == 2
    assert ctx.core.leader_id == 3
    assert ctx.pending_requests(VoteRequest) == []


def test_pre_vote_response_from_previous_round_is_ignored(make_ctx: MakeCtx) -> None:
    """Item 21 (same state type): a grant answering the pre-vote of an earlier round, same
    epoch, is matched by correlation id and dropped; the current round's grant counts."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.expire_election_timer()
    old_round = ctx.take_request(VoteRequest, 2)
    ctx.expire_election_timer()  # round lost by timeout
    assert ctx.state() is RaftState.UNATTACHED
    ctx.clear_outbox()
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    new_round = ctx.take_request(VoteRequest, 2)
    assert new_round.correlation_id != old_round.correlation_id
    ctx.deliver_response(old_round, ctx.vote_response(True, 2))
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.deliver_response(new_round, ctx.vote_response(True, 2))
    assert ctx.state() is RaftState.CANDIDATE


def test_handle_vote_request_as_prospective_with_voted_candidate(make_ctx: MakeCtx) -> None:
    """Item 22: a Prospective keeps the vote it cast in its epoch: a standard vote goes only to
    that candidate again, pre-votes to anyone up-to-date, nothing is rewritten."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, ReplicaKey(2)))
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    assert _vote(ctx, 3, ctx.vote_request(3, 2, 0, 0)).vote_granted is False
    assert _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0)).vote_granted is True
    assert _vote(ctx, 3, ctx.vote_request(3, 2, 0, 0, pre_vote=True)).vote_granted is True
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.assert_persisted(2, voted=2)
    assert all(e.persist is None for e in ctx.history)


def test_prospective_grants_standard_vote_and_stays_prospective(make_ctx: MakeCtx) -> None:
    """Item 22 (unvoted Prospective): granting a standard vote is made durable in the same
    effects as the response, and the replica stays Prospective with the vote and a fresh
    election timer (anchor 1.2: Prospective -> Prospective+voted)."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.advance(T // 2)
    assert _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0)).vote_granted is True
    assert ctx.last_effects.persist == ElectionState(2, None, ReplicaKey(2))
    ctx.assert_persisted(2, voted=2)
    assert ctx.state() is RaftState.PROSPECTIVE
    # The timer restarted at the vote: the round is lost T after it, not T after it began.
    ctx.advance(T // 2)
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.advance(T // 2 - 1)
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.advance(1)
    assert ctx.state() is RaftState.UNATTACHED
    ctx.assert_persisted(2, voted=2)


def _prospective_after_a_silent_leader(make_ctx: MakeCtx, local_id: int) -> RaftTestContext:
    """``local_id`` of voters 1-3, following 3 in epoch 2, whose fetch timer has run out."""
    ctx = make_ctx(local_id, [1, 2, 3], election_state=ElectionState(2, 3, None))
    ctx.advance(FETCH_TIMEOUT)
    assert ctx.state() is RaftState.PROSPECTIVE
    return ctx


def test_of_two_prospectives_granting_each_other_only_the_lower_id_stands(
        make_ctx: MakeCtx) -> None:
    """Not in the catalogue: the followers of a silent leader time out within a jitter of each
    other, and two that ask a round trip apart grant each other's pre-votes. Both standing
    would split the vote, each voting for itself, and cost an election timeout: the one that
    granted a lower id's pre-vote stands down in this round, and votes for it."""
    higher = _prospective_after_a_silent_leader(make_ctx, 2)
    assert _vote(higher, 1, higher.vote_request(1, 2, 0, 0, pre_vote=True)).vote_granted is True
    own = higher.take_request(VoteRequest, 1)
    higher.deliver_response(own, higher.vote_response(True, 2))
    assert higher.state() is RaftState.PROSPECTIVE  # a majority granted it, but it yielded
    assert _vote(higher, 1, higher.vote_request(1, 3, 0, 0)).vote_granted is True
    higher.assert_persisted(3, voted=1)

    lower = _prospective_after_a_silent_leader(make_ctx, 1)
    assert _vote(lower, 2, lower.vote_request(2, 2, 0, 0, pre_vote=True)).vote_granted is True
    own = lower.take_request(VoteRequest, 2)
    lower.deliver_response(own, lower.vote_response(True, 2))
    assert lower.state() is RaftState.CANDIDATE
    assert lower.core.epoch == 3


def test_a_prospective_that_yielded_ends_its_round_at_the_election_timer(
        make_ctx: MakeCtx) -> None:
    """The lower id may fail to win (it stops, or is cut off): the round that stood down for it
    ends as any round does, back to following the leader it knew, whose fetch timer runs
    again."""
    ctx = _prospective_after_a_silent_leader(make_ctx, 2)
    assert _vote(ctx, 1, ctx.vote_request(1, 2, 0, 0, pre_vote=True)).vote_granted is True
    ctx.deliver_response(ctx.take_request(VoteRequest, 1), ctx.vote_response(True, 2))
    ctx.advance(T - 1)
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.advance(1)
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.epoch == 2


def test_unattached_grants_standard_vote_once_per_epoch(make_ctx: MakeCtx) -> None:
    """Vote at most once per epoch: the first standard vote is durable, later ones for another
    candidate of the same epoch are rejected, the same candidate may ask again."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    assert _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0)).vote_granted is True
    assert ctx.last_effects.persist == ElectionState(2, None, ReplicaKey(2))
    assert _vote(ctx, 3, ctx.vote_request(3, 2, 0, 0)).vote_granted is False
    assert _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0)).vote_granted is True
    ctx.assert_persisted(2, voted=2)


def test_standard_vote_rejected_if_log_not_up_to_date(make_ctx: MakeCtx) -> None:
    """A standard vote needs an up-to-date log too, and a rejected vote is not recorded."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(2, 3)], election_state=ElectionState(2, None, None))
    response = _vote(ctx, 2, ctx.vote_request(2, 3, 2, 2))
    assert response.vote_granted is False
    assert ctx.core.epoch == 3
    ctx.assert_persisted(3)  # the epoch moved, no vote was cast
    assert _vote(ctx, 3, ctx.vote_request(3, 3, 2, 3)).vote_granted is True
    ctx.assert_persisted(3, voted=3)


def test_granting_a_vote_restarts_the_election_timer(make_ctx: MakeCtx) -> None:
    """An Unattached voter that grants a standard vote waits a full election timeout from the
    vote before campaigning itself (the candidate has as good a chance as it has)."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.advance(T // 2)
    assert _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0)).vote_granted is True
    ctx.advance(T // 2)
    assert ctx.state() is RaftState.UNATTACHED
    ctx.advance(T // 2 - 1)
    assert ctx.state() is RaftState.UNATTACHED
    ctx.advance(1)
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.assert_persisted(2, voted=2)


def test_initialize_with_stored_epoch_behind_the_log(make_ctx: MakeCtx) -> None:
    """Start-up (section 1.3 step 3): a quorum-state epoch older than the log's last epoch is
    replaced by Unattached in the log's epoch, durably."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 1), (3, 1)],
                   election_state=ElectionState(2, 2, None))
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.epoch == 3
    assert ctx.history[0].persist == ElectionState(3, None, None)


def test_initialize_without_quorum_state(make_ctx: MakeCtx) -> None:
    """Start-up (section 1.3 step 2): no quorum-state file means epoch 0, nothing known; the
    first election leads to epoch 1."""
    ctx = make_ctx(1, [1, 2, 3])
    assert (ctx.state(), ctx.core.epoch, ctx.core.leader_id) == (RaftState.UNATTACHED, 0, None)
    assert ctx.core.election_state == ElectionState(0)
    assert ctx.become_leader() == 1


def test_initialize_as_follower_from_state_store(make_ctx: MakeCtx) -> None:
    """Start-up (section 1.3 step 6): a stored leader other than us gives Follower, which
    fetches from it at once."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(3, 2)], election_state=ElectionState(3, 2, None))
    assert (ctx.state(), ctx.core.epoch, ctx.core.leader_id) == (RaftState.FOLLOWER, 3, 2)
    fetch = ctx.take_request(FetchRequest, 2)
    assert isinstance(fetch.message, FetchRequest)
    assert (fetch.message.current_leader_epoch, fetch.message.fetch_offset,
            fetch.message.last_fetch_epoch) == (3, 2, 3)
    assert ctx.history[0].persist is None


def test_initialize_with_leader_and_own_vote_follows_the_leader(make_ctx: MakeCtx) -> None:
    """Start-up: a candidate that learned the leader of its epoch restarts as that leader's
    follower and keeps its vote (a deliberate departure from Kafka, which restarts it as
    Candidate; see QuorumState._initial_state)."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 3, ReplicaKey(1)))
    assert (ctx.state(), ctx.core.leader_id) == (RaftState.FOLLOWER, 3)
    assert ctx.core.election_state == ElectionState(2, 3, ReplicaKey(1))
    assert _vote(ctx, 2, ctx.vote_request(2, 2, 0, 0)).vote_granted is False


def test_replaced_disk_is_an_observer(make_ctx: MakeCtx) -> None:
    """KIP-856: a replica with a voter's id but another directory id is not that voter: it never
    campaigns."""
    dirs = {1: uuid.UUID(int=1), 2: uuid.UUID(int=2), 3: uuid.UUID(int=3)}
    ctx = make_ctx(1, [1, 2, 3], directory_ids=dirs, local_directory_id=uuid.UUID(int=99))
    assert not ctx.core.is_voter
    ctx.advance(10 * T)
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.pending_requests(VoteRequest) == []


def test_fetch_timeout_has_a_jitter_drawn_per_follower_state(make_ctx: MakeCtx) -> None:
    """Followers hear from their leader in the same instant; a jitter of up to a tenth of the
    fetch timeout keeps them from timing out in the same instant and splitting the vote."""

    class HighestRandom(random.Random):
        def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
            return (start if stop is None else stop) - 1

    ctx = make_ctx(2, [1, 2, 3], fetch_timeout_ms=1000, rng=HighestRandom())
    ctx.deliver_request(1, ctx.begin_quorum_request(1, 1))
    assert ctx.state() is RaftState.FOLLOWER
    ctx.advance(1000)
    assert ctx.state() is RaftState.FOLLOWER  # not yet: the jitter is 100 ms here
    ctx.advance(100)
    assert ctx.state() is RaftState.PROSPECTIVE


def test_prospective_asks_again_a_voter_that_rejected_its_pre_vote(make_ctx: MakeCtx) -> None:
    """A follower that still hears from its leader rejects a pre-vote (KAFKA-17641), and grants
    once its own fetch timeout has passed: the prospective asks it again every quarter of the
    election timeout, rather than losing the round and waiting out a whole fetch timeout."""
    ctx = make_ctx(1, [1, 2, 3], election_timeout_ms=1000)
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    first = ctx.take_request(VoteRequest, 2)
    ctx.take_request(VoteRequest, 3)  # node 3 is unreachable: never answers
    ctx.deliver_response(first, ctx.vote_response(False, ctx.core.epoch))
    assert ctx.state() is RaftState.PROSPECTIVE  # node 3 could still make a majority
    assert ctx.core.next_deadline_ms() == ctx.now_ms + 250
    ctx.advance(250)
    again = ctx.take_request(VoteRequest, 2)
    assert isinstance(again.message, VoteRequest)
    assert again.message.pre_vote
    ctx.deliver_response(again, ctx.vote_response(True, ctx.core.epoch))
    assert ctx.state() is RaftState.CANDIDATE


def test_a_message_of_no_known_type_fails_loudly(make_ctx: MakeCtx) -> None:
    """Dispatch is exhaustive: a message no handler is written for is an error, never handed to
    the handler of another type (the transport decodes only the known types)."""
    ctx = make_ctx(1, [1, 2, 3])
    with pytest.raises(AssertionError):
        ctx.core.handle_request(ctx.now_ms, 2, 1, object())  # type: ignore[arg-type]


def test_an_observer_never_wakes_for_an_election_timer(make_ctx: MakeCtx) -> None:
    """An unattached replica outside the voters (here a replaced disk not yet added) never
    campaigns: the election timer a newer epoch set must not bring its next wake-up to now once
    it has passed, or its driver would poll it in a loop."""
    directories = {voter: uuid.uuid4() for voter in (1, 2, 3)}
    ctx = make_ctx(1, [1, 2, 3], directory_ids=directories, local_directory_id=uuid.uuid4(),
                   election_timeout_ms=1000)
    assert not ctx.core.is_voter
    ctx.deliver_request(2, ctx.vote_request(2, 2, 0, 0))  # a newer epoch: its timer is set
    ctx.advance(5000)
    assert ctx.state() is RaftState.UNATTACHED and ctx.core.epoch == 2
    assert ctx.core.next_deadline_ms() > ctx.now_ms
