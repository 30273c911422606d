"""Linearizable reads (ReadIndex) and DescribeQuorum on the leader."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from quorum_node.raft.core import ReadAbandoned, ReadConfirmed, ReadOutcome, ReadTimedOut
from quorum_node.raft.messages import BeginQuorumEpochRequest, FetchRequest, FetchResponse
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import NotLeaderError

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]


def _fetch(ctx: RaftTestContext, source: int, request: FetchRequest) -> FetchResponse:
    response = ctx.deliver_one(source, request)
    assert isinstance(response, FetchResponse)
    return response


def _leader_with_hwm(make_ctx: MakeCtx) -> RaftTestContext:
    ctx = make_ctx(1, [1, 2, 3], observer_ids=[7])
    ctx.become_leader()
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 0, 0))
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1))
    assert ctx.core.high_watermark == 1
    return ctx


def _read_outcomes(ctx: RaftTestContext) -> list[ReadOutcome]:
    return [outcome for effects in ctx.history for outcome in effects.reads]


def test_read_barrier_needs_a_fetch_from_a_majority_sent_after_it(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_hwm(make_ctx)
    parked = ctx.fetch_request(2, 1, 1, 1, high_watermark=1)
    assert ctx.deliver_request(2, parked) == []  # parked: nothing new
    barrier = ctx.core.begin_read(ctx.now_ms, 1000)
    ctx.collect()
    assert barrier is not None and barrier.read_index == 1
    # Taking the barrier releases the parked fetch, so that the follower fetches again now; the
    # answer names the barrier.
    assert [(r.error_code, r.read_barrier) for r in ctx.take_responses(2)
            if isinstance(r, FetchResponse)] == [(0, barrier.id)]
    # Fetches that happened before the barrier do not confirm it.
    assert _read_outcomes(ctx) == []
    # Nor does one that arrives after it without its echo: it may have been sent before (held
    # up in a paused leader's socket while its sender moved on). It is answered at once, not
    # parked, naming the barrier.
    unechoed = ctx.deliver_request(3, ctx.fetch_request(3, 1, 1, 1, high_watermark=1))
    assert [r.read_barrier for r in unechoed if isinstance(r, FetchResponse)] == [barrier.id]
    assert _read_outcomes(ctx) == []
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 1, 1, max_wait_ms=0, read_barrier=barrier.id))
    assert _read_outcomes(ctx) == [ReadConfirmed(barrier.id, 1)]
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0, read_barrier=barrier.id))
    assert len(_read_outcomes(ctx)) == 1  # settled once


def test_a_read_is_confirmed_by_a_begin_quorum_epoch_answered_after_it(
    make_ctx: MakeCtx,
) -> None:
    """A voter whose fetch is not parked (in flight, or its follower flushing records) is asked
    with a BeginQuorumEpoch: its answer proves it followed this leader after the barrier, with
    no fsync on the way. One already in flight when the barrier was taken proves nothing."""
    ctx = _leader_with_hwm(make_ctx)
    ctx.clear_outbox()
    # The election's BeginQuorumEpochs time out; the heartbeat goes out again, in flight.
    ctx.advance(ctx.config.request_timeout_ms)
    early = ctx.take_request(BeginQuorumEpochRequest, 2)
    ctx.take_request(BeginQuorumEpochRequest, 3)
    barrier = ctx.core.begin_read(ctx.now_ms, 1000)
    ctx.collect()
    assert barrier is not None
    assert ctx.pending_requests(BeginQuorumEpochRequest) == []  # one at a time per voter
    ctx.deliver_response(early, ctx.begin_quorum_response(1, 1))
    assert _read_outcomes(ctx) == []  # sent before the barrier
    asked = ctx.take_request(BeginQuorumEpochRequest, 2)  # so it is asked again
    ctx.deliver_response(asked, ctx.begin_quorum_response(1, 1))
    assert _read_outcomes(ctx) == [ReadConfirmed(barrier.id, 1)]
    ctx.advance(1)
    assert ctx.pending_requests(BeginQuorumEpochRequest) == []  # nothing waits: no more asked


def test_a_parked_fetch_released_by_the_barrier_is_not_asked_again(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_hwm(make_ctx)
    for voter in (2, 3):
        assert ctx.deliver_request(voter, ctx.fetch_request(voter, 1, 1, 1, high_watermark=1)) == []
    ctx.clear_outbox()
    barrier = ctx.core.begin_read(ctx.now_ms, 1000)
    ctx.collect()
    assert barrier is not None
    # Both fetches are answered at once, naming the barrier; no BeginQuorumEpoch is needed.
    assert [r.read_barrier for r in ctx.take_responses(2) + ctx.take_responses(3)
            if isinstance(r, FetchResponse)] == [barrier.id, barrier.id]
    assert ctx.pending_requests(BeginQuorumEpochRequest) == []
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 1, 1, max_wait_ms=0, read_barrier=barrier.id))
    assert _read_outcomes(ctx) == [ReadConfirmed(barrier.id, 1)]


def test_an_echo_of_a_barrier_never_named_confirms_nothing(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_hwm(make_ctx)
    barrier = ctx.core.begin_read(ctx.now_ms, 1000)
    assert barrier is not None
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 1, 1, max_wait_ms=0, read_barrier=barrier.id + 1))
    later = ctx.core.begin_read(ctx.now_ms, 1000)
    ctx.collect()
    assert later is not None
    # The echo counted as far as the barrier named then, not as far as it claimed.
    assert _read_outcomes(ctx) == [ReadConfirmed(barrier.id, 1)]


def test_a_follower_echoes_the_barrier_its_leader_named_in_this_epoch_only(
    make_ctx: MakeCtx,
) -> None:
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    assert isinstance(fetch.message, FetchRequest) and fetch.message.read_barrier == 0
    answer = ctx.fetch_response(2, 2).model_copy(update={"read_barrier": 7})
    ctx.deliver_response(fetch, answer)
    fetch = ctx.take_request(FetchRequest, 2)
    assert isinstance(fetch.message, FetchRequest) and fetch.message.read_barrier == 7
    # A new leader's barriers are numbered by it: nothing of the old one's is echoed to it.
    ctx.deliver_request(3, ctx.begin_quorum_request(3, 3))
    fetch = ctx.take_request(FetchRequest, 3)
    assert isinstance(fetch.message, FetchRequest) and fetch.message.read_barrier == 0


def test_read_barrier_waits_for_the_leaders_own_commit(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1, 2, 3])
    ctx.become_leader()
    assert ctx.core.high_watermark is None
    assert ctx.core.begin_read(ctx.now_ms, 1000) is None  # no HWM of its own epoch yet


def test_read_barrier_is_abandoned_once_leadership_is_lost(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_hwm(make_ctx)
    barrier = ctx.core.begin_read(ctx.now_ms, 1000)
    assert barrier is not None
    ctx.deliver_request(2, ctx.begin_quorum_request(2, 5))
    assert ctx.state() is RaftState.FOLLOWER
    # The reader learns where the leadership went.
    assert _read_outcomes(ctx) == [ReadAbandoned(barrier.id, leader_id=2, epoch=5)]
    with pytest.raises(NotLeaderError):
        ctx.core.begin_read(ctx.now_ms, 1000)


def test_read_barrier_is_abandoned_when_the_leader_shuts_down(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_hwm(make_ctx)
    barrier = ctx.core.begin_read(ctx.now_ms, 1000)
    assert barrier is not None
    ctx.core.begin_shutdown(ctx.now_ms)
    ctx.collect()
    assert _read_outcomes(ctx) == [ReadAbandoned(barrier.id, leader_id=1, epoch=1)]


def test_read_barrier_times_out_without_a_majority(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_hwm(make_ctx)
    barrier = ctx.core.begin_read(ctx.now_ms, 100)
    ctx.collect()
    assert barrier is not None
    assert ctx.core.next_deadline_ms() <= barrier.deadline_ms  # the core wakes for it
    ctx.advance(99)
    assert _read_outcomes(ctx) == []
    ctx.advance(1)
    assert _read_outcomes(ctx) == [ReadTimedOut(barrier.id)]
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 1, 1, max_wait_ms=0))
    assert _read_outcomes(ctx) == [ReadTimedOut(barrier.id)]  # settled once


def test_single_voter_read_is_confirmed_at_once(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1])
    ctx.flush()
    barrier = ctx.core.begin_read(ctx.now_ms, 1000)
    ctx.collect()
    assert barrier is not None
    assert _read_outcomes(ctx) == [ReadConfirmed(barrier.id, barrier.read_index)]


def test_describe_quorum(make_ctx: MakeCtx) -> None:
    ctx = _leader_with_hwm(make_ctx)
    _fetch(ctx, 7, ctx.fetch_request(7, 1, 0, 0))  # an observer
    directory = uuid.uuid4()
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 0, 0, max_wait_ms=0, directory_id=directory))
    described = ctx.core.describe_quorum(ctx.now_ms)
    assert (described.leader_id, described.epoch, described.high_watermark) == (1, 1, 1)
    rows = {row.key.id: row for row in described.voters}
    assert rows[2].key.directory_id is None  # voter 2 fetched without a directory id
    assert rows[1].log_end_offset == 1 and rows[1].last_fetch_ms == ctx.now_ms
    assert rows[2].log_end_offset == 1 and rows[2].last_caught_up_ms == ctx.now_ms
    assert rows[3].log_end_offset == 0 and rows[3].key.directory_id == directory
    assert [row.key.id for row in described.observers] == [7]
    ctx.advance(5 * 60 * 1000)
    with pytest.raises(NotLeaderError):  # it lost its quorum meanwhile (check-quorum)
        ctx.core.describe_quorum(ctx.now_ms)


def test_leader_has_committed_only_once_its_leader_change_is(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1, 2, 3])
    ctx.become_leader()
    assert not ctx.core.leader_has_committed
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 0, 0))
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1))
    assert ctx.core.leader_has_committed
