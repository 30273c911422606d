"""Resignation, graceful shutdown and EndQuorumEpoch: catalogue items 33-36 of kraft-anchor.md
section 7.2, the Resigned state (section 4.2) and the strict exponential back-off.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from quorum_node.raft.messages import (
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchResponse,
    VoteRequest,
)
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import Errors, NotLeaderError, ReplicaKey

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

T = 1000
REQUEST_TIMEOUT = 2000


def _end_quorum_requests(ctx: RaftTestContext) -> dict[int, EndQuorumEpochRequest]:
    found = {}
    for request in ctx.take_requests(EndQuorumEpochRequest):
        assert isinstance(request.message, EndQuorumEpochRequest)
        found[request.destination] = request.message
    return found


def _fetch_ok(ctx: RaftTestContext, voter: int, offset: int, last_epoch: int) -> None:
    response = ctx.deliver_one(voter, ctx.fetch_request(voter, ctx.core.epoch, offset, last_epoch,
                                                        max_wait_ms=0))
    assert isinstance(response, FetchResponse)
    assert response.error_code is Errors.NONE


# --- graceful shutdown (items 33, 34) -----------------------------------------------------------


def test_leader_graceful_shutdown(make_ctx: MakeCtx) -> None:
    """Item 33: begin_shutdown makes the leader Resigned at once (same epoch, nothing persisted),
    it stops taking writes, sends EndQuorumEpoch until each voter acknowledges it, and follows
    the successor when it announces itself."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.become_leader()
    ctx.core.begin_shutdown(ctx.now_ms)
    ctx.poll()
    assert ctx.state() is RaftState.RESIGNED
    assert ctx.core.epoch == 1
    assert all(e.persist is None for e in ctx.history[-2:])
    ctx.assert_persisted(1, leader_id=1, voted=1)
    with pytest.raises(NotLeaderError):
        ctx.core.propose(ctx.now_ms, ctx.records("late"))

    requests = {r.destination: r for r in ctx.take_requests(EndQuorumEpochRequest)}
    assert set(requests) == {2, 3}
    for destination, request in requests.items():
        assert isinstance(request.message, EndQuorumEpochRequest)
        assert request.message.leader_id == 1
        assert request.message.leader_epoch == 1
        assert request.message.voter_id == destination
    ctx.deliver_response(requests[2], ctx.end_quorum_response(1, 1))
    # Voter 3 never answers: only it is asked again once the request times out.
    ctx.advance(REQUEST_TIMEOUT)
    assert set(_end_quorum_requests(ctx)) == {3}
    # Shutting down: the election timer does not take it to the next epoch.
    ctx.advance(5 * T)
    assert ctx.state() is RaftState.RESIGNED
    assert ctx.core.epoch == 1
    assert ctx.pending_requests(VoteRequest) == []
    # The successor announces itself.
    response = ctx.deliver_one(2, ctx.begin_quorum_request(2, 2))
    assert isinstance(response, BeginQuorumEpochResponse)
    assert response.error_code is Errors.NONE
    assert (ctx.state(), ctx.core.epoch, ctx.core.leader_id) == (RaftState.FOLLOWER, 2, 2)
    ctx.assert_persisted(2, leader_id=2)


def test_leader_graceful_shutdown_timeout(make_ctx: MakeCtx) -> None:
    """Item 33 (timeout): when no successor appears the shutting-down replica stays Resigned in
    its epoch and keeps asking; it never campaigns again."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.become_leader()
    ctx.core.begin_shutdown(ctx.now_ms)
    ctx.poll()
    assert set(_end_quorum_requests(ctx)) == {2, 3}
    for _ in range(5):
        ctx.advance(REQUEST_TIMEOUT)
        assert set(_end_quorum_requests(ctx)) == {2, 3}
        assert ctx.state() is RaftState.RESIGNED
        assert ctx.core.epoch == 1
    assert ctx.pending_requests(VoteRequest) == []


def test_end_quorum_epoch_sent_based_on_fetch_offset(make_ctx: MakeCtx) -> None:
    """Item 34: the preferred successors are the other voters by descending fetch offset, the
    ones that never fetched last."""
    ctx = make_ctx(1, [1, 2, 3, 4])
    ctx.become_leader()
    ctx.core.propose(ctx.now_ms, ctx.records("a", "b"))
    ctx.advance(ctx.config.append_linger_ms)
    ctx.flush()
    _fetch_ok(ctx, 2, 1, 1)
    _fetch_ok(ctx, 3, 3, 1)
    ctx.core.begin_shutdown(ctx.now_ms)
    ctx.poll()
    requests = _end_quorum_requests(ctx)
    assert set(requests) == {2, 3, 4}
    for request in requests.values():
        assert [s.replica_id for s in request.preferred_successors] == [3, 2, 4]


# --- the follower side of EndQuorumEpoch (items 35, 36) ----------------------------------------


def _follower_of_5(make_ctx: MakeCtx, **config: object) -> RaftTestContext:
    ctx = make_ctx(1, [1, 2, 3, 4, 5], election_state=ElectionState(2, 5, None), **config)
    assert ctx.state() is RaftState.FOLLOWER
    ctx.clear_outbox()
    return ctx


def _assert_prospective_after(ctx: RaftTestContext, backoff_ms: int) -> None:
    if backoff_ms > 0:
        ctx.advance(backoff_ms - 1)
        assert ctx.state() is RaftState.FOLLOWER
        ctx.advance(1)
    assert ctx.state() is RaftState.PROSPECTIVE
    assert ctx.core.epoch == 2
    requests = ctx.take_requests(VoteRequest)
    assert {r.destination for r in requests} == {2, 3, 4, 5}
    assert all(isinstance(r.message, VoteRequest) and r.message.pre_vote for r in requests)


def test_handle_end_quorum_request_with_lower_priority_to_become_leader(
    make_ctx: MakeCtx,
) -> None:
    """Item 35: second in the preferred list of 4, the follower waits (M >> 3) << 0 = 125 ms
    before its pre-vote, so the first successor goes first."""
    ctx = _follower_of_5(make_ctx)
    response = ctx.deliver_one(5, ctx.end_quorum_request(5, 2, [2, 1, 3, 4]))
    assert isinstance(response, EndQuorumEpochResponse)
    assert response.error_code is Errors.NONE
    assert (response.leader_id, response.leader_epoch) == (5, 2)
    _assert_prospective_after(ctx, 125)


@pytest.mark.parametrize(
    ("successors", "backoff_ms"),
    [
        ([1, 2, 3, 4], 0),
        ([2, 1, 3, 4], 125),
        ([2, 3, 1, 4], 250),
        ([2, 3, 4, 1], 500),
        ([2, 3, 4], 1000),  # absent: M
    ],
)
def test_end_quorum_epoch_backoff_formula(
    make_ctx: MakeCtx, successors: list[int], backoff_ms: int
) -> None:
    """Section 4.2: strict exponential back-off by position, n = 4, M = 1000:
    0, 125, 250, 500; absent from the list: 1000."""
    ctx = _follower_of_5(make_ctx, election_backoff_max_ms=1000)
    ctx.deliver_one(5, ctx.end_quorum_request(5, 2, successors))
    _assert_prospective_after(ctx, backoff_ms)


def test_end_quorum_epoch_backoff_is_capped_by_max(make_ctx: MakeCtx) -> None:
    """Section 4.2: min(M, (M >> (n - 1)) << (position - 1)) with M = 100, n = 2, position 1:
    (100 >> 1) << 0 = 50."""
    ctx = _follower_of_5(make_ctx, election_backoff_max_ms=100)
    ctx.deliver_one(5, ctx.end_quorum_request(5, 2, [3, 1]))
    _assert_prospective_after(ctx, 50)


@pytest.mark.parametrize(
    ("successor_directory_id", "backoff_ms"),
    [(uuid.UUID(int=1), 0), (None, 0), (uuid.UUID(int=99), 1000)],
)
def test_end_quorum_epoch_successor_matched_by_directory_id(
    make_ctx: MakeCtx, successor_directory_id: uuid.UUID | None, backoff_ms: int
) -> None:
    """KIP-856: a preferred-successor entry names this replica only if the directory ids match
    (or one side does not know it)."""
    dirs = {i: uuid.UUID(int=i) for i in (1, 2, 3, 4, 5)}
    ctx = make_ctx(1, [1, 2, 3, 4, 5], directory_ids=dirs,
                   election_state=ElectionState(2, 5, None))
    ctx.clear_outbox()
    first = ReplicaKey(1, successor_directory_id)
    ctx.deliver_one(5, ctx.end_quorum_request(5, 2, [first, ReplicaKey(2, dirs[2])],
                                              voter_directory_id=dirs[1]))
    _assert_prospective_after(ctx, backoff_ms)


def test_end_quorum_starts_new_election_immediately_if_follower_unattached(
    make_ctx: MakeCtx,
) -> None:
    """Item 36: an Unattached voter that learns the leader only from its EndQuorumEpoch, and is
    the first preferred successor, starts its pre-vote at once."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.clear_outbox()
    response = ctx.deliver_one(2, ctx.end_quorum_request(2, 2, [1, 3]))
    assert isinstance(response, EndQuorumEpochResponse)
    assert response.error_code is Errors.NONE
    assert response.leader_id == 2
    assert ctx.state() is RaftState.PROSPECTIVE
    assert ctx.core.epoch == 2
    requests = ctx.take_requests(VoteRequest)
    assert {r.destination for r in requests} == {2, 3}


def test_end_quorum_epoch_from_older_epoch_is_fenced(make_ctx: MakeCtx) -> None:
    """A stale EndQuorumEpoch changes nothing."""
    ctx = _follower_of_5(make_ctx)
    response = ctx.deliver_one(4, ctx.end_quorum_request(4, 1, [1]))
    assert isinstance(response, EndQuorumEpochResponse)
    assert response.error_code is Errors.FENCED_LEADER_EPOCH
    assert (response.leader_id, response.leader_epoch) == (5, 2)
    ctx.advance(ctx.config.fetch_timeout_ms - 1)
    assert ctx.state() is RaftState.FOLLOWER


def test_end_quorum_epoch_does_not_make_an_observer_campaign(make_ctx: MakeCtx) -> None:
    """Observers are never successors and never campaign."""
    ctx = make_ctx(9, [1, 2, 3], election_state=ElectionState(2, 2, None))
    ctx.clear_outbox()
    ctx.deliver_one(2, ctx.end_quorum_request(2, 2, [1, 3], voter_id=9))
    ctx.advance(5 * T)
    assert ctx.state() in (RaftState.FOLLOWER, RaftState.UNATTACHED)
    assert ctx.pending_requests(VoteRequest) == []


# --- the Resigned state ----------------------------------------------------------------------


def test_resigned_state_bumps_epoch_when_its_timer_fires(make_ctx: MakeCtx) -> None:
    """Section 4.2 / KAFKA-18379: a resigned leader (not shutting down) becomes Unattached in
    epoch + 1 when its election timer fires, so it never re-enters its own epoch; it can then be
    elected again in a later epoch."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.become_leader()
    ctx.advance(ctx.config.check_quorum_timeout_ms)  # no voter fetched: it resigns
    assert ctx.state() is RaftState.RESIGNED
    assert ctx.last_effects.persist is None
    assert set(_end_quorum_requests(ctx)) == {2, 3}
    ctx.advance(T - 1)
    assert ctx.state() is RaftState.RESIGNED
    effects = ctx.advance(1)
    assert ctx.state() is RaftState.UNATTACHED
    assert ctx.core.epoch == 2
    assert effects.persist == ElectionState(2, None, None)
    ctx.clear_outbox()
    assert ctx.become_leader() == 3


def test_resigned_answers_fetch_with_not_leader(make_ctx: MakeCtx) -> None:
    """A Resigned replica serves no fetch."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.become_leader()
    ctx.advance(ctx.config.check_quorum_timeout_ms)
    assert ctx.state() is RaftState.RESIGNED
    response = ctx.deliver_one(2, ctx.fetch_request(2, 1, 1, 1))
    assert isinstance(response, FetchResponse)
    assert response.error_code is Errors.NOT_LEADER_OR_FOLLOWER
    assert response.records == b""


def test_single_voter_restart_as_resigned_leads_a_new_epoch(make_ctx: MakeCtx) -> None:
    """Single-voter quorum: restarting after leading epoch 5 never leads epoch 5 again."""
    ctx = make_ctx(1, [1], log_epochs=[(5, 2)], election_state=ElectionState(5, 1, ReplicaKey(1)))
    assert ctx.state() is RaftState.LEADER
    assert ctx.core.epoch == 7
    ctx.assert_persisted(7, leader_id=1, voted=1)
    assert ctx.core.epoch_start_offset == 2


def test_single_voter_shutdown_stays_resigned(make_ctx: MakeCtx) -> None:
    """A lone voter shutting down resigns and does not re-elect itself."""
    ctx = make_ctx(1, [1])
    ctx.core.begin_shutdown(ctx.now_ms)
    ctx.collect()
    ctx.advance(10 * T)
    assert ctx.state() is RaftState.RESIGNED
    assert ctx.core.epoch == 1
    assert ctx.pending_requests() == []


def test_shutting_down_candidate_resigns_once_elected(make_ctx: MakeCtx) -> None:
    """Section 4.2: nominees keep campaigning during shutdown, but once elected they resign
    (and ask the voters to elect someone else) rather than lead."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    assert ctx.state() is RaftState.CANDIDATE
    ctx.core.begin_shutdown(ctx.now_ms)
    ctx.collect()
    ctx.grant_votes(2)
    assert ctx.state() is RaftState.RESIGNED
    assert set(_end_quorum_requests(ctx)) == {2, 3}


def test_shutting_down_resigned_leader_does_not_ask_to_be_polled_at_once(
        make_ctx: MakeCtx) -> None:
    """A stopping leader stays Resigned past its election timeout; that timeout must not keep
    showing as due, or its driver would spin until the process exits."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.become_leader()
    ctx.core.begin_shutdown(ctx.now_ms)
    ctx.collect()
    ctx.advance(10 * ctx.config.election_timeout_ms)
    assert ctx.state() is RaftState.RESIGNED
    assert ctx.core.next_deadline_ms() > ctx.now_ms
