"""A leader that is gone: a follower whose leader refused a connection asks for pre-votes before
its fetch timeout (the rules and their reasons are in ``quorum_node/raft/follower.py``).

Timing (QuorumConfig defaults, but Kafka's fetch timeout, as ``context`` sets it): election
timeout T = 1000 ms (timers are exactly T, see ``ZeroRandom``), fetch timeout 2000 ms, so a gone
leader's first round waits a tenth of T per rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from quorum_node.raft.messages import FetchRequest, VoteRequest, VoteResponse
from quorum_node.raft.quorum_state import TransitionCause
from quorum_node.raft.requests import RequestFailure
from quorum_node.raft.state import ElectionState, RaftState

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

T = 1000  # election timeout
FETCH_TIMEOUT = 2000
LEADER = 3


def _following(make_ctx: MakeCtx, local_id: int) -> RaftTestContext:
    """A voter of {1, 2, 3} following 3 in epoch 2, having fetched from it once."""
    ctx = make_ctx(local_id, [1, 2, 3], log_epochs=[(2, 3)],
                   election_state=ElectionState(2, LEADER, None))
    fetch = ctx.take_request(FetchRequest, LEADER)
    ctx.deliver_response(fetch, ctx.fetch_response(LEADER, 2, high_watermark=3))
    ctx.flush()
    return ctx


def _refuse_fetch(ctx: RaftTestContext,
                  failure: RequestFailure = RequestFailure.REFUSED) -> None:
    """The follower's Fetch to the leader fails: its connection was refused (or, with
    ``UNANSWERED``, it timed out or broke)."""
    fetch = ctx.take_request(FetchRequest, LEADER)
    ctx.core.handle_request_failure(ctx.now_ms, LEADER, fetch.correlation_id, failure)
    ctx.collect()


def _pre_vote_requests(ctx: RaftTestContext) -> dict[int, int]:
    """The pending pre-vote requests, destination -> correlation id (taken from the outbox)."""
    found = ctx.take_requests(VoteRequest)
    for request in found:
        assert isinstance(request.message, VoteRequest)
        assert request.message.pre_vote is True
        assert request.message.replica_epoch == 2
    return {request.destination: request.correlation_id for request in found}


def _causes(ctx: RaftTestContext) -> list[TransitionCause]:
    return [change.cause for effects in ctx.history for change in effects.role_changes]


def test_a_refused_leader_is_gone_at_once_and_silence_waits_for_the_fetch_timeout(
        make_ctx: MakeCtx) -> None:
    """A refusal of the Fetch to the leader starts a pre-vote at once (the first voter by id
    goes first); a Fetch that timed out or broke changes nothing before the fetch timeout."""
    ctx = _following(make_ctx, 1)
    _refuse_fetch(ctx, RequestFailure.UNANSWERED)
    assert ctx.state() is RaftState.FOLLOWER
    ctx.advance(ctx.config.retry_backoff_ms)
    assert ctx.state() is RaftState.FOLLOWER

    _refuse_fetch(ctx)
    assert ctx.state() is RaftState.PROSPECTIVE
    assert ctx.core.epoch == 2
    assert ctx.core.leader_id == LEADER  # kept: a lost pre-vote goes back to it
    assert ctx.last_effects.persist is None
    assert _causes(ctx)[-1] is TransitionCause.LEADER_GONE
    assert set(_pre_vote_requests(ctx)) == {2, LEADER}


def test_a_refused_leader_is_gone_only_to_the_follower_of_that_leader(make_ctx: MakeCtx) -> None:
    """A refusal by a peer other than the leader says nothing of the leader."""
    ctx = _following(make_ctx, 1)
    ctx.take_requests(FetchRequest)
    ctx.core.handle_request_failure(ctx.now_ms, 2, 999, RequestFailure.REFUSED)
    ctx.collect()
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.next_deadline_ms() > ctx.now_ms + FETCH_TIMEOUT // 2


def test_the_survivors_ask_a_tenth_of_the_election_timeout_apart_by_rank(
        make_ctx: MakeCtx) -> None:
    """Voter 2 is second among the voters other than the leader: it waits T/10, so that the
    first one's pre-vote reaches it before it asks and the two do not split the vote."""
    ctx = _following(make_ctx, 2)
    _refuse_fetch(ctx)
    assert ctx.state() is RaftState.FOLLOWER
    ctx.advance(T // 10 - 1)
    assert ctx.state() is RaftState.FOLLOWER
    ctx.advance(1)
    assert ctx.state() is RaftState.PROSPECTIVE
    assert _causes(ctx)[-1] is TransitionCause.LEADER_GONE


def test_a_follower_whose_leader_is_gone_grants_pre_votes(make_ctx: MakeCtx) -> None:
    """Having fetched from its leader it rejects a pre-vote (KAFKA-17641); once the leader
    refused it, it grants one, and puts its own round off by an election timer (the candidate
    it granted goes first). A standard vote in its epoch is still refused: it saw a leader."""
    ctx = _following(make_ctx, 2)
    pre_vote = ctx.vote_request(1, 2, 2, 3, pre_vote=True)
    response = ctx.deliver_one(1, pre_vote)
    assert isinstance(response, VoteResponse)
    assert response.vote_granted is False

    _refuse_fetch(ctx)
    refused_at = ctx.now_ms
    response = ctx.deliver_one(1, pre_vote)
    assert isinstance(response, VoteResponse)
    assert response.vote_granted is True
    assert ctx.state() is RaftState.FOLLOWER
    ctx.advance(ctx.config.retry_backoff_ms)
    _refuse_fetch(ctx)  # refused again, as every retry is: the round stays put off
    ctx.advance(T // 10)
    assert ctx.state() is RaftState.FOLLOWER  # put off: its round waits an election timer
    assert ctx.core.next_deadline_ms() == refused_at + T

    response = ctx.deliver_one(1, ctx.vote_request(1, 2, 2, 3))
    assert isinstance(response, VoteResponse)
    assert response.vote_granted is False
    ctx.assert_persisted(2, leader_id=LEADER)


def test_a_follower_cut_off_from_a_live_leader_goes_back_to_it_in_the_same_epoch(
        make_ctx: MakeCtx) -> None:
    """Refused by a leader that voter 2 still follows: 2 rejects the pre-vote, the leader's
    address refuses it too, and when the round runs out the follower follows the leader again,
    in the same epoch, with nothing persisted."""
    ctx = _following(make_ctx, 1)
    steps_before = len(ctx.history)
    _refuse_fetch(ctx)
    assert ctx.state() is RaftState.PROSPECTIVE
    requests = _pre_vote_requests(ctx)
    ctx.core.handle_response(ctx.now_ms, 2, requests[2], ctx.vote_response(False, 2, leader=LEADER))
    ctx.collect()
    ctx.core.handle_request_failure(ctx.now_ms, LEADER, requests[LEADER], RequestFailure.REFUSED)
    ctx.collect()
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.advance(T)
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.leader_id == LEADER
    assert ctx.core.epoch == 2
    assert all(effects.persist is None for effects in ctx.history[steps_before:])
    ctx.assert_persisted(2, leader_id=LEADER)
    assert _causes(ctx)[-1] is TransitionCause.PRE_VOTE_LOST
    assert [r.destination for r in ctx.pending_requests(FetchRequest)] == [LEADER]


def test_refusals_from_a_leader_others_follow_back_off_as_an_election(
        make_ctx: MakeCtx) -> None:
    """Each further round on the same leader's refusals waits a randomized election timer,
    doubled per round (with ``ZeroRandom``: T, then 2T, which the fetch timeout meets), so a
    follower cut off by refusals asks no more often than a losing candidate would."""
    ctx = _following(make_ctx, 1)
    rounds_at: list[int] = []
    for _ in range(3):
        while ctx.state() is RaftState.FOLLOWER:
            if ctx.pending_requests(FetchRequest):
                _refuse_fetch(ctx)
            else:
                ctx.advance(ctx.core.next_deadline_ms() - ctx.now_ms)
        assert ctx.state() is RaftState.PROSPECTIVE
        rounds_at.append(ctx.now_ms)
        requests = _pre_vote_requests(ctx)
        ctx.core.handle_response(ctx.now_ms, 2, requests[2],
                                 ctx.vote_response(False, 2, leader=LEADER))
        ctx.collect()
        ctx.take_requests(VoteRequest)
        ctx.advance(T)  # the round runs out: back to following
        assert ctx.state() is RaftState.FOLLOWER
    start = rounds_at[0]
    assert [at - start for at in rounds_at] == [0, 2 * T, 5 * T]
    assert ctx.core.epoch == 2


def test_a_closed_connection_to_the_leader_is_retried_at_once_then_backed_off(
        make_ctx: MakeCtx) -> None:
    """The leader ended the connection under a Fetch (``CLOSED``): the next Fetch goes in the
    same step, so a dead leader's refusal comes a round trip later, not a back-off later. A
    second CLOSED before an answer backs off (a peer that closes every stream it accepts is not
    hammered), and an answer re-arms the retry at once."""
    ctx = _following(make_ctx, 2)
    _refuse_fetch(ctx, RequestFailure.CLOSED)
    assert [r.destination for r in ctx.pending_requests(FetchRequest)] == [LEADER]
    _refuse_fetch(ctx, RequestFailure.CLOSED)
    assert ctx.pending_requests(FetchRequest) == []
    ctx.advance(ctx.config.retry_backoff_ms)
    fetch = ctx.take_request(FetchRequest, LEADER)
    ctx.deliver_response(fetch, ctx.fetch_response(LEADER, 2, high_watermark=3))
    ctx.collect()
    _refuse_fetch(ctx, RequestFailure.CLOSED)
    assert [r.destination for r in ctx.pending_requests(FetchRequest)] == [LEADER]
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.next_deadline_ms() > ctx.now_ms + FETCH_TIMEOUT // 2  # no round is due


def test_a_follower_whose_leader_closed_the_connection_grants_pre_votes_until_it_answers(
        make_ctx: MakeCtx) -> None:
    """Both survivors see the dead leader's connections end in the same instant; voter 1,
    first by rank, is refused and asks before voter 2's own retry is refused. Voter 2 grants
    it: rejecting (the leader still present to it, KAFKA-17641) would cost the quorum a round.
    Its own round, once refused, waits an election timer from the grant, so 1 goes alone. A
    live leader's answer makes voter 2 reject pre-votes again."""
    ctx = _following(make_ctx, 2)
    _refuse_fetch(ctx, RequestFailure.CLOSED)
    pre_vote = ctx.vote_request(1, 2, 2, 3, pre_vote=True)
    response = ctx.deliver_one(1, pre_vote)
    assert isinstance(response, VoteResponse)
    assert response.vote_granted is True
    granted_at = ctx.now_ms
    ctx.advance(1)
    _refuse_fetch(ctx)  # the retry at once is refused: the leader is gone
    ctx.advance(T // 10)
    assert ctx.state() is RaftState.FOLLOWER  # not at its rank's turn: it granted 1 first
    assert ctx.core.next_deadline_ms() == granted_at + T

    live = _following(make_ctx, 2)
    _refuse_fetch(live, RequestFailure.CLOSED)
    fetch = live.take_request(FetchRequest, LEADER)
    live.deliver_response(fetch, live.fetch_response(LEADER, 2, high_watermark=3))
    live.collect()
    response = live.deliver_one(1, pre_vote)
    assert isinstance(response, VoteResponse)
    assert response.vote_granted is False
    assert live.state() is RaftState.FOLLOWER

