"""The leader's own flush off the commit's path (``QuorumConfig.leader_flush_delay_ms``): while the
voters fetching from it are a majority without it, a leader leaves its appends unflushed and its
followers commit them; otherwise, and for records still uncommitted after the delay, it flushes.
With more voters parked than a commit needs beside the leader, a lone write is flushed and sent
at once to only as many as that, the others getting it within the delay."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from quorum_node.raft.leader import LEADER_UNFLUSHED_MAX_MS
from quorum_node.raft.messages import FetchResponse, VoteResponse
from quorum_node.raft.state import RaftState

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

DELAY_MS = 5


def _leader_with_parked_followers(make_ctx: MakeCtx, parked: tuple[int, ...] = (2,),
                                  delay_ms: int = DELAY_MS) -> RaftTestContext:
    """Node 1 leads epoch 1 of voters 1-3; its LeaderChange (offset 0) is committed, every voter
    has just fetched, and the ``parked`` voters wait at the log's end with a Fetch."""
    ctx = make_ctx(1, [1, 2, 3], leader_flush_delay_ms=delay_ms)
    ctx.become_leader()
    for voter in (2, 3):
        assert isinstance(ctx.deliver_one(voter, ctx.fetch_request(voter, 1, 0, 0)), FetchResponse)
        assert isinstance(ctx.deliver_one(voter, ctx.fetch_request(voter, 1, 1, 1)), FetchResponse)
    assert ctx.core.high_watermark == 1
    for voter in parked:
        assert ctx.deliver_request(voter, ctx.fetch_request(voter, 1, 1, 1, high_watermark=1)) == []
    ctx.clear_outbox()
    return ctx


def _put(ctx: RaftTestContext) -> bool:
    """Propose one record; whether the step asked for a flush."""
    ctx.core.propose(ctx.now_ms, ctx.records("x"))
    return ctx.collect().flush


def _acknowledge(ctx: RaftTestContext, voter: int, offset: int) -> None:
    ctx.deliver_request(voter, ctx.fetch_request(voter, 1, offset, 1, max_wait_ms=0,
                                                 high_watermark=ctx.core.high_watermark))


def test_followers_commit_what_the_leader_has_not_flushed(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_parked_followers(make_ctx)
    assert not _put(ctx)
    (answer,) = ctx.take_responses(2)  # the parked fetch carries the record at once
    assert isinstance(answer, FetchResponse) and answer.records
    _acknowledge(ctx, 2, 2)
    assert ctx.core.high_watermark == 1  # one follower and an unflushed leader: no majority
    _acknowledge(ctx, 3, 2)
    assert ctx.core.high_watermark == 2
    assert ctx.core.flushed_offset == 1
    assert not any(effects.flush for effects in ctx.history[-3:])


def test_a_leader_flushes_at_once_when_its_followers_are_no_majority_alone(
    make_ctx: MakeCtx,
) -> None:
    ctx = _leader_with_parked_followers(make_ctx, parked=(2,))
    ctx.advance(DELAY_MS + 1)  # voter 3 has not fetched for longer than the delay
    assert _put(ctx)
    ctx.flush()
    _acknowledge(ctx, 2, 2)
    assert ctx.core.high_watermark == 2  # the leader and voter 2


def test_records_still_uncommitted_after_the_delay_are_flushed(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_parked_followers(make_ctx)
    appended_at = ctx.now_ms
    assert not _put(ctx)
    assert ctx.core.next_deadline_ms() == appended_at + DELAY_MS
    assert not ctx.advance(DELAY_MS - 1).flush
    assert ctx.advance(1).flush
    ctx.flush()
    _acknowledge(ctx, 2, 2)
    assert ctx.core.high_watermark == 2


def test_committed_appends_are_flushed_within_the_bound(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_parked_followers(make_ctx)
    appended_at = ctx.now_ms
    assert not _put(ctx)
    _acknowledge(ctx, 2, 2)
    _acknowledge(ctx, 3, 2)
    assert ctx.core.high_watermark == 2
    ctx.advance(DELAY_MS)  # committed: nothing to flush for
    assert not any(effects.flush for effects in ctx.history[-3:])
    assert not ctx.advance_to(appended_at + LEADER_UNFLUSHED_MAX_MS - 1).flush
    assert ctx.advance(1).flush


def test_a_leader_that_loses_the_epoch_flushes_before_it_fetches(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_parked_followers(make_ctx)
    assert not _put(ctx)
    response = ctx.deliver_one(2, ctx.vote_request(2, 2, 1, 1))
    assert isinstance(response, VoteResponse)
    assert ctx.state() is not RaftState.LEADER
    assert ctx.last_effects.flush


def test_deferred_appends_do_not_hold_back_the_next_ones(make_ctx: MakeCtx) -> None:
    """Records wait for a running fsync (group commit); none runs while the flush is deferred."""
    ctx = _leader_with_parked_followers(make_ctx)
    assert not _put(ctx)
    end = ctx.log.end_offset
    assert not _put(ctx)
    assert ctx.log.end_offset == end + 1


def test_a_batch_of_several_records_is_flushed_at_once(make_ctx: MakeCtx) -> None:
    """Several records in one batch are a leader under load: its fsync runs beside the loop
    while the next batch gathers (group commit)."""
    ctx = _leader_with_parked_followers(make_ctx)
    ctx.core.propose(ctx.now_ms, ctx.records("x", "y"))
    assert ctx.collect().flush


def test_a_lone_write_goes_at_once_to_one_of_two_parked_followers(make_ctx: MakeCtx) -> None:
    """The leader flushes, and the follower parked longest commits the write with it; the other
    gets it once it is committed, so that the two do not work at once for the same commit."""
    ctx = _leader_with_parked_followers(make_ctx, parked=(2, 3))
    assert _put(ctx)
    (answer,) = ctx.take_responses(2)
    assert isinstance(answer, FetchResponse) and answer.records
    assert ctx.take_responses(3) == []
    ctx.flush()
    _acknowledge(ctx, 2, 2)
    assert ctx.core.high_watermark == 2  # the leader and voter 2
    (later,) = ctx.take_responses(3)
    assert isinstance(later, FetchResponse) and later.records and later.high_watermark == 2


def test_the_follower_left_waiting_gets_a_lone_write_within_the_delay(make_ctx: MakeCtx) -> None:
    """Without a commit or another write meanwhile, at the delay's end."""
    ctx = _leader_with_parked_followers(make_ctx, parked=(2, 3))
    appended_at = ctx.now_ms
    assert _put(ctx)
    ctx.take_responses(2)
    assert ctx.core.next_deadline_ms() == appended_at + DELAY_MS
    ctx.advance(DELAY_MS - 1)
    assert ctx.take_responses(3) == []
    ctx.advance(1)
    (later,) = ctx.take_responses(3)
    assert isinstance(later, FetchResponse) and later.records


def test_without_a_delay_every_parked_follower_gets_a_lone_write_at_once(
    make_ctx: MakeCtx,
) -> None:
    """Kafka's behaviour (``leader_flush_delay_ms`` 0): flushed, and sent to every fetcher."""
    ctx = _leader_with_parked_followers(make_ctx, parked=(2, 3), delay_ms=0)
    assert _put(ctx)
    for voter in (2, 3):
        (answer,) = ctx.take_responses(voter)
        assert isinstance(answer, FetchResponse) and answer.records
